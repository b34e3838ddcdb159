//! A client's side of a session, as a state machine over plain data: each round is one method
//! that takes the server's message and returns the client's reply.
//!
//! The checks Bonawitz et al. ask of a client live here: the key directory must carry its own
//! keys unchanged and distinct keys for everyone; a share must open under the pair's key with
//! the pair's associated data; the unmask request must name this client a survivor, leave at
//! least `t` survivors among the holders of its neighbours' secrets, account for every
//! neighbour it masked with, and never ask for both secrets of one client. A failed check
//! aborts the client for the rest of the session, so a second, different request cannot be
//! answered either.

use std::collections::{BTreeMap, BTreeSet};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::crypto::{self, KeyPair, MaskKind};
use crate::error::Error;
use crate::message::{
    ClientBody, ClientId, ClientMessage, EncryptedShare, Header, PublicKeys, Round, ServerBody,
    ServerMessage, UnmaskShares,
};
use crate::packing;
use crate::params::Params;
use crate::shamir::{self, Share};

/// Where a client is in its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Fresh,
    Advertised,
    Shared,
    Masked,
    Done,
    Aborted,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Fresh => "fresh",
            Phase::Advertised => "advertised",
            Phase::Shared => "shared",
            Phase::Masked => "masked",
            Phase::Done => "done",
            Phase::Aborted => "aborted",
        }
    }
}

/// The two shares this client holds of one owner's secrets.
#[derive(Debug, Clone, Copy)]
struct Held {
    self_mask: Share,
    mask_key: Share,
}

/// One client of one session.
pub struct Client {
    params: Params,
    id: ClientId,
    /// Neighbours (never itself).
    neighbours: BTreeSet<ClientId>,
    cipher: KeyPair,
    mask: KeyPair,
    /// `b_u`, the seed of the self mask.
    self_mask_seed: [u8; 32],
    /// Shamir coefficients and AEAD nonces; seeded, so a session replays bit for bit.
    rng: ChaCha20Rng,
    phase: Phase,
    /// The advertised keys of the neighbours that advertised.
    directory: BTreeMap<ClientId, PublicKeys>,
    /// Shares held, by owner (including this client's own).
    held: BTreeMap<ClientId, Held>,
    /// The neighbours whose shares arrived in round 2: those this client masked with.
    mask_peers: BTreeSet<ClientId>,
}

impl Client {
    /// Client `id` of the session `params`, its secrets (`c_u`, `s_u`, `b_u`) and its stream
    /// for Shamir coefficients and nonces drawn from `seed`.
    ///
    /// `seed` *is* the client's secret: in a deployment it must come from the client's own OS
    /// entropy, never from a stream the server can recompute (such as the run's seed), or the
    /// server could rebuild every mask. Simulations seed it from a shared stream to replay.
    pub fn new(params: Params, id: ClientId, seed: [u8; 32]) -> Result<Client, Error> {
        params.validate()?;
        if !params.knows(id) {
            return Err(Error::UnknownClient(id));
        }
        let neighbours = params.neighbourhoods().remove(&id).unwrap_or_default();
        let mut rng = ChaCha20Rng::from_seed(seed);
        let mut draw = || {
            let mut bytes = [0u8; 32];
            rng.fill_bytes(&mut bytes);
            bytes
        };
        let cipher = KeyPair::from_bytes(draw());
        let mask = KeyPair::from_bytes(draw());
        let self_mask_seed = draw();
        Ok(Client {
            params,
            id,
            neighbours,
            cipher,
            mask,
            self_mask_seed,
            rng,
            phase: Phase::Fresh,
            directory: BTreeMap::new(),
            held: BTreeMap::new(),
            mask_peers: BTreeSet::new(),
        })
    }

    pub fn id(&self) -> ClientId {
        self.id
    }

    /// Whether a consistency check failed and the client left the session.
    pub fn aborted(&self) -> bool {
        self.phase == Phase::Aborted
    }

    fn keys(&self) -> PublicKeys {
        PublicKeys {
            cipher: self.cipher.public,
            mask: self.mask.public,
        }
    }

    fn message(&self, round: Round, body: ClientBody) -> ClientMessage {
        ClientMessage {
            header: Header {
                session: self.params.session,
                round,
                sender: self.id,
            },
            body,
        }
    }

    /// Moves from `from` to the next phase after `step` succeeds, or aborts on its error.
    fn step<T>(
        &mut self,
        from: Phase,
        to: Phase,
        what: &'static str,
        step: impl FnOnce(&mut Client) -> Result<T, Error>,
    ) -> Result<T, Error> {
        if self.phase != from {
            return Err(Error::OutOfOrder {
                what,
                state: self.phase.name(),
            });
        }
        match step(self) {
            Ok(out) => {
                self.phase = to;
                Ok(out)
            }
            Err(error) => {
                self.phase = Phase::Aborted;
                Err(error)
            }
        }
    }

    /// Checks that a server message belongs to this session and opens `round`.
    fn expect(&self, message: &ServerMessage, round: Round) -> Result<(), Error> {
        if message.session != self.params.session {
            return Err(Error::WrongSession {
                expected: self.params.session,
                got: message.session,
            });
        }
        if message.round != round || message.body.round() != round {
            return Err(Error::WrongRound {
                expected: round,
                got: message.round,
            });
        }
        Ok(())
    }

    /// Round 0: the two public keys.
    pub fn advertise_keys(&mut self) -> Result<ClientMessage, Error> {
        self.step(
            Phase::Fresh,
            Phase::Advertised,
            "advertising keys",
            |client| {
                Ok(client.message(
                    Round::AdvertiseKeys,
                    ClientBody::AdvertiseKeys(client.keys()),
                ))
            },
        )
    }

    /// Round 1: from the key directory, shares of `b_u` and `s_u^SK` for every neighbour that
    /// advertised (and this client itself), each pair encrypted for its receiver.
    pub fn share_keys(&mut self, directory: &ServerMessage) -> Result<ClientMessage, Error> {
        self.step(Phase::Advertised, Phase::Shared, "sharing keys", |client| {
            client.expect(directory, Round::ShareKeys)?;
            let ServerBody::KeyDirectory(entries) = &directory.body else {
                return Err(Error::WrongRound {
                    expected: Round::ShareKeys,
                    got: directory.round,
                });
            };
            client.read_directory(entries)?;
            client.encrypt_shares()
        })
    }

    /// Checks the directory and keeps the neighbours' keys.
    fn read_directory(&mut self, entries: &[(ClientId, PublicKeys)]) -> Result<(), Error> {
        let mut seen_keys: BTreeMap<[u8; 32], ClientId> = BTreeMap::new();
        let mut last = None;
        for &(owner, keys) in entries {
            if !self.params.knows(owner) {
                return Err(Error::UnknownClient(owner));
            }
            if last.is_some_and(|previous| previous >= owner) {
                return Err(Error::Duplicate {
                    client: owner,
                    round: Round::AdvertiseKeys,
                });
            }
            last = Some(owner);
            for key in [keys.cipher, keys.mask] {
                if let Some(other) = seen_keys.insert(key, owner) {
                    return Err(Error::RepeatedKey(other, owner));
                }
            }
            if owner == self.id && keys != self.keys() {
                return Err(Error::DirectoryMismatch(self.id));
            }
            if self.neighbours.contains(&owner) {
                self.directory.insert(owner, keys);
            }
        }
        if !entries.iter().any(|&(owner, _)| owner == self.id) {
            return Err(Error::DirectoryMismatch(self.id));
        }
        let holders = self.directory.len() + 1;
        if holders < self.params.threshold {
            return Err(Error::TooFewClients {
                round: Round::ShareKeys,
                needed: self.params.threshold,
                got: holders,
            });
        }
        Ok(())
    }

    fn encrypt_shares(&mut self) -> Result<ClientMessage, Error> {
        let session = self.params.session;
        let holders: Vec<ClientId> = self
            .directory
            .keys()
            .copied()
            .chain(std::iter::once(self.id))
            .collect();
        let threshold = self.params.threshold;
        let self_mask = shamir::split(&self.self_mask_seed, threshold, &holders, &mut self.rng);
        let mask_key = shamir::split(
            &self.mask.secret.to_bytes(),
            threshold,
            &holders,
            &mut self.rng,
        );
        let mut out = Vec::with_capacity(holders.len() - 1);
        for (b_share, s_share) in self_mask.into_iter().zip(mask_key) {
            let to = b_share.holder;
            if to == self.id {
                self.held.insert(
                    self.id,
                    Held {
                        self_mask: b_share,
                        mask_key: s_share,
                    },
                );
                continue;
            }
            let agreement = crypto::agree(&self.cipher.secret, to, &self.directory[&to].cipher)?;
            let key = crypto::share_key(&agreement, session, self.id, to);
            let mut nonce = [0u8; 12];
            self.rng.fill_bytes(&mut nonce);
            let ad = crypto::associated_data(session, Round::ShareKeys, self.id, to);
            let plain = crypto::share_plaintext(self.id, to, &b_share, &s_share);
            let ciphertext = crypto::seal(&key, &nonce, &plain, &ad);
            out.push(EncryptedShare {
                peer: to,
                nonce,
                ciphertext,
            });
        }
        let commitment = crypto::commit_self_mask(&self.self_mask_seed, session, self.id);
        Ok(self.message(
            Round::ShareKeys,
            ClientBody::ShareKeys {
                commitment,
                shares: out,
            },
        ))
    }

    /// Round 2: opens the shares addressed to this client and sends the masked input
    /// (docs/algorithms.md §7, "Masked input")
    /// `y_u = x_u + PRG(b_u) + Σ_{v<u} PRG(s_uv) − Σ_{v>u} PRG(s_uv) mod 2^bits` over the
    /// neighbours `v` whose shares arrived. `input` is `x_u`, already in `Z_{2^bits}`.
    pub fn masked_input(
        &mut self,
        shares: &ServerMessage,
        input: &[u64],
    ) -> Result<ClientMessage, Error> {
        self.step(
            Phase::Shared,
            Phase::Masked,
            "masking the input",
            |client| {
                client.expect(shares, Round::MaskedInput)?;
                let ServerBody::Shares(forwarded) = &shares.body else {
                    return Err(Error::WrongRound {
                        expected: Round::MaskedInput,
                        got: shares.round,
                    });
                };
                client.check_input(input)?;
                client.open_shares(forwarded)?;
                client.mask(input)
            },
        )
    }

    fn check_input(&self, input: &[u64]) -> Result<(), Error> {
        if input.len() != self.params.vector_len {
            return Err(Error::Input {
                what: format!(
                    "length {} (expected {})",
                    input.len(),
                    self.params.vector_len
                ),
            });
        }
        let mask = self.params.modulus_mask();
        if let Some(i) = input.iter().position(|&x| x & !mask != 0) {
            return Err(Error::Input {
                what: format!(
                    "value {} at {i} is not below 2^{}",
                    input[i], self.params.bits
                ),
            });
        }
        Ok(())
    }

    fn open_shares(&mut self, forwarded: &[EncryptedShare]) -> Result<(), Error> {
        let session = self.params.session;
        for share in forwarded {
            let from = share.peer;
            let Some(keys) = self.directory.get(&from) else {
                return Err(Error::UnknownClient(from));
            };
            if self.held.contains_key(&from) {
                return Err(Error::Duplicate {
                    client: from,
                    round: Round::ShareKeys,
                });
            }
            let agreement = crypto::agree(&self.cipher.secret, from, &keys.cipher)?;
            let key = crypto::share_key(&agreement, session, from, self.id);
            let ad = crypto::associated_data(session, Round::ShareKeys, from, self.id);
            let plain = crypto::open(&key, &share.nonce, &share.ciphertext, &ad, from, self.id)?;
            let (self_mask, mask_key) = crypto::read_share_plaintext(&plain, from, self.id)?;
            self.held.insert(
                from,
                Held {
                    self_mask,
                    mask_key,
                },
            );
            self.mask_peers.insert(from);
        }
        // Own shares plus the neighbours' that arrived: at least t must be alive to unmask.
        let alive = self.mask_peers.len() + 1;
        if alive < self.params.threshold {
            return Err(Error::TooFewClients {
                round: Round::MaskedInput,
                needed: self.params.threshold,
                got: alive,
            });
        }
        Ok(())
    }

    fn mask(&mut self, input: &[u64]) -> Result<ClientMessage, Error> {
        let session = self.params.session;
        let mut y = input.to_vec();
        let seed = crypto::mask_seed(&self.self_mask_seed, session, MaskKind::SelfMask);
        crypto::apply_mask(&mut y, &seed, false);
        for &v in &self.mask_peers {
            let agreement = crypto::agree(&self.mask.secret, v, &self.directory[&v].mask)?;
            let seed = crypto::mask_seed(&agreement, session, MaskKind::Pair);
            crypto::apply_mask(&mut y, &seed, v > self.id);
        }
        let modulus = self.params.modulus_mask();
        y.iter_mut().for_each(|value| *value &= modulus);
        let packed = packing::pack(&y, self.params.bits);
        Ok(self.message(Round::MaskedInput, ClientBody::MaskedInput(packed)))
    }

    /// Round 3: the shares of `b_v` for surviving owners and of `s_v^SK` for dropped ones
    /// that this client holds, after the consistency checks of the module docs.
    pub fn unmask(&mut self, request: &ServerMessage) -> Result<ClientMessage, Error> {
        self.step(Phase::Masked, Phase::Done, "unmasking", |client| {
            client.expect(request, Round::Unmask)?;
            let ServerBody::UnmaskRequest { survivors, dropped } = &request.body else {
                return Err(Error::WrongRound {
                    expected: Round::Unmask,
                    got: request.round,
                });
            };
            client.reveal(survivors, dropped)
        })
    }

    fn reveal(&self, survivors: &[ClientId], dropped: &[ClientId]) -> Result<ClientMessage, Error> {
        let survivors: BTreeSet<ClientId> = survivors.iter().copied().collect();
        let dropped: BTreeSet<ClientId> = dropped.iter().copied().collect();
        if let Some(&both) = survivors.intersection(&dropped).next() {
            return Err(Error::BothRequested(both));
        }
        if let Some(&stranger) = survivors
            .iter()
            .chain(&dropped)
            .find(|&&c| !self.params.knows(c))
        {
            return Err(Error::UnknownClient(stranger));
        }
        if dropped.contains(&self.id) || !survivors.contains(&self.id) {
            return Err(Error::NamedDropped(self.id));
        }
        if let Some(&peer) = self
            .mask_peers
            .iter()
            .find(|p| !survivors.contains(p) && !dropped.contains(p))
        {
            return Err(Error::Unaccounted(peer));
        }
        // The survivors among the holders of this client's neighbourhood (and itself): fewer
        // than t means the server could not have unmasked honestly.
        let alive = self
            .mask_peers
            .iter()
            .filter(|p| survivors.contains(p))
            .count()
            + 1;
        if alive < self.params.threshold || survivors.len() < self.params.threshold {
            return Err(Error::TooFewClients {
                round: Round::Unmask,
                needed: self.params.threshold,
                got: alive.min(survivors.len()),
            });
        }
        let mut out = UnmaskShares::default();
        for (&owner, held) in &self.held {
            if survivors.contains(&owner) {
                out.self_mask.push((owner, held.self_mask));
            } else if dropped.contains(&owner) {
                out.mask_key.push((owner, held.mask_key));
            }
        }
        Ok(self.message(Round::Unmask, ClientBody::Unmask(out)))
    }
}
