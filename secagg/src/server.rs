//! The server's side of a session: it collects each round's messages, closes the round when
//! the caller says (a deadline or everyone answered), and finally removes the masks.
//!
//! [`Server::receive`] refuses, with a typed error and no change of state, a message of another
//! session, of another round, from a client outside the session or outside the previous
//! round's set, a duplicate, and a body whose lengths or ranges do not fit the session. The
//! rounds' sets follow Bonawitz et al.: `U1` advertised keys, `U2 ⊆ U1` shared them,
//! `U3 ⊆ U2` sent a masked input (the survivors), `U2 \ U3` dropped; every close refuses to go
//! on with fewer than `t` clients, so too many dropouts give [`Error::TooFewClients`] or
//! [`Error::TooFewShares`], never a wrong sum.

use std::collections::{BTreeMap, BTreeSet};

use x25519_dalek::{PublicKey, StaticSecret};

use crate::crypto::{self, MaskKind};
use crate::error::Error;
use crate::field::Fe;
use crate::graph::Neighbourhoods;
use crate::message::{
    ClientBody, ClientId, ClientMessage, EncryptedShare, PublicKeys, Round, ServerBody,
    ServerMessage, UnmaskShares,
};
use crate::packing;
use crate::params::Params;
use crate::shamir::{self, Share};

/// The result of a session: `Σ_{u ∈ survivors} x_u mod 2^bits`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aggregate {
    pub sum: Vec<u64>,
    /// `U3`: the clients whose inputs are in the sum.
    pub survivors: Vec<ClientId>,
    /// `U2 \ U3`: clients that shared keys but whose masked input never arrived.
    pub dropped: Vec<ClientId>,
}

/// The server of one session.
pub struct Server {
    params: Params,
    neighbours: Neighbourhoods,
    round: Round,
    advertised: BTreeMap<ClientId, PublicKeys>,
    /// Round 1's shares, by sender.
    shared: BTreeMap<ClientId, Vec<EncryptedShare>>,
    /// Round 1's commitments to `b_u`, by sender.
    commitments: BTreeMap<ClientId, [u8; 32]>,
    masked: BTreeMap<ClientId, Vec<u64>>,
    unmask: BTreeMap<ClientId, UnmaskShares>,
    /// Set when round 2 closes.
    dropped: BTreeSet<ClientId>,
}

impl Server {
    pub fn new(params: Params) -> Result<Server, Error> {
        params.validate()?;
        let neighbours = params.neighbourhoods();
        Ok(Server {
            params,
            neighbours,
            round: Round::AdvertiseKeys,
            advertised: BTreeMap::new(),
            shared: BTreeMap::new(),
            commitments: BTreeMap::new(),
            masked: BTreeMap::new(),
            unmask: BTreeMap::new(),
            dropped: BTreeSet::new(),
        })
    }

    /// The round whose messages the server accepts now.
    pub fn round(&self) -> Round {
        self.round
    }

    /// Takes one client message, or refuses it (see the module docs) leaving the state as it
    /// was.
    pub fn receive(&mut self, message: ClientMessage) -> Result<(), Error> {
        let header = message.header;
        let sender = header.sender;
        if header.session != self.params.session {
            return Err(Error::WrongSession {
                expected: self.params.session,
                got: header.session,
            });
        }
        if header.round != self.round || message.body.round() != self.round {
            return Err(Error::WrongRound {
                expected: self.round,
                got: header.round,
            });
        }
        if !self.params.knows(sender) {
            return Err(Error::UnknownClient(sender));
        }
        let (eligible, already) = match self.round {
            Round::AdvertiseKeys => (true, self.advertised.contains_key(&sender)),
            Round::ShareKeys => (
                self.advertised.contains_key(&sender),
                self.shared.contains_key(&sender),
            ),
            Round::MaskedInput => (
                self.shared.contains_key(&sender),
                self.masked.contains_key(&sender),
            ),
            Round::Unmask => (
                self.masked.contains_key(&sender),
                self.unmask.contains_key(&sender),
            ),
        };
        if !eligible {
            return Err(Error::NotExpected {
                client: sender,
                round: self.round,
            });
        }
        if already {
            return Err(Error::Duplicate {
                client: sender,
                round: self.round,
            });
        }
        match message.body {
            ClientBody::AdvertiseKeys(keys) => {
                if [keys.cipher, keys.mask].iter().any(crypto::is_low_order) {
                    return Err(Self::malformed(sender, "a low-order public key".into()));
                }
                self.advertised.insert(sender, keys);
            }
            ClientBody::ShareKeys { commitment, shares } => {
                self.check_shares(sender, &shares)?;
                self.shared.insert(sender, shares);
                self.commitments.insert(sender, commitment);
            }
            ClientBody::MaskedInput(packed) => {
                let y = packing::unpack(&packed, self.params.bits, self.params.vector_len)
                    .ok_or_else(|| {
                        Self::malformed(
                            sender,
                            format!(
                                "masked input of {} bytes (expected {} values of {} bits)",
                                packed.len(),
                                self.params.vector_len,
                                self.params.bits
                            ),
                        )
                    })?;
                self.masked.insert(sender, y);
            }
            ClientBody::Unmask(shares) => {
                self.check_unmask(sender, &shares)?;
                self.unmask.insert(sender, shares);
            }
        }
        Ok(())
    }

    fn malformed(client: ClientId, what: String) -> Error {
        Error::Malformed { client, what }
    }

    /// Exactly one share per neighbour that advertised, each of the exact ciphertext length:
    /// a client masks with exactly the neighbours whose shares it receives, so a sender that
    /// skipped a neighbour would leave a pair mask that cancels on one side only.
    fn check_shares(&self, sender: ClientId, shares: &[EncryptedShare]) -> Result<(), Error> {
        let hood = &self.neighbours[&sender];
        let expected = hood
            .iter()
            .filter(|v| self.advertised.contains_key(v))
            .count();
        if shares.len() != expected {
            return Err(Self::malformed(
                sender,
                format!(
                    "{} shares for {expected} neighbours that advertised",
                    shares.len()
                ),
            ));
        }
        let mut receivers = BTreeSet::new();
        for share in shares {
            let to = share.peer;
            if !hood.contains(&to) || !self.advertised.contains_key(&to) {
                return Err(Self::malformed(
                    sender,
                    format!("share for non-neighbour {to}"),
                ));
            }
            if !receivers.insert(to) {
                return Err(Self::malformed(sender, format!("two shares for {to}")));
            }
            if share.ciphertext.len() != crypto::CIPHERTEXT_LEN {
                return Err(Self::malformed(
                    sender,
                    format!("share for {to} has wrong length"),
                ));
            }
        }
        Ok(())
    }

    /// Shares of survivors' self masks and dropped clients' keys only, held by the sender,
    /// made by its neighbours (or itself), once each, with canonical field values.
    fn check_unmask(&self, sender: ClientId, shares: &UnmaskShares) -> Result<(), Error> {
        let hood = &self.neighbours[&sender];
        let check = |list: &[(ClientId, Share)], wanted: &dyn Fn(ClientId) -> bool, what: &str| {
            let mut owners = BTreeSet::new();
            for (owner, share) in list {
                let owner = *owner;
                let ok = wanted(owner)
                    && (owner == sender || hood.contains(&owner))
                    && share.holder == sender
                    && owners.insert(owner)
                    && share.values.iter().all(|&v| Fe::new(v).is_some());
                if !ok {
                    return Err(Self::malformed(
                        sender,
                        format!("unexpected {what} share of {owner}"),
                    ));
                }
            }
            Ok(())
        };
        check(
            &shares.self_mask,
            &|owner| self.masked.contains_key(&owner),
            "self-mask",
        )?;
        check(
            &shares.mask_key,
            &|owner| self.dropped.contains(&owner),
            "mask-key",
        )
    }

    fn open(&self, round: Round, body: ServerBody) -> ServerMessage {
        ServerMessage {
            session: self.params.session,
            round,
            body,
        }
    }

    /// Checks that the server is in round `round` and that at least `t` clients answered it:
    /// fewer would leave a secret with fewer than `t` holders alive, or a sum over fewer than
    /// `t` inputs.
    fn check_close(&self, round: Round, answered: usize, what: &'static str) -> Result<(), Error> {
        if self.round != round {
            return Err(Error::OutOfOrder {
                what,
                state: round_name(self.round),
            });
        }
        if answered < self.params.threshold {
            return Err(Error::TooFewClients {
                round,
                needed: self.params.threshold,
                got: answered,
            });
        }
        Ok(())
    }

    /// Closes round 0: for every advertiser, the keys of its neighbours that advertised and
    /// its own (a neighbourhood's worth, so SecAgg+ downloads stay `O(k)`).
    pub fn close_advertise_keys(&mut self) -> Result<Vec<(ClientId, ServerMessage)>, Error> {
        self.check_close(
            Round::AdvertiseKeys,
            self.advertised.len(),
            "closing round 0",
        )?;
        self.round = Round::ShareKeys;
        Ok(self
            .advertised
            .keys()
            .map(|&to| {
                let hood = &self.neighbours[&to];
                let entries = self
                    .advertised
                    .iter()
                    .filter(|(id, _)| **id == to || hood.contains(id))
                    .map(|(&id, &keys)| (id, keys))
                    .collect();
                (
                    to,
                    self.open(Round::ShareKeys, ServerBody::KeyDirectory(entries)),
                )
            })
            .collect())
    }

    /// Closes round 1: for every client that shared, the shares addressed to it by the other
    /// senders.
    pub fn close_share_keys(&mut self) -> Result<Vec<(ClientId, ServerMessage)>, Error> {
        self.check_close(Round::ShareKeys, self.shared.len(), "closing round 1")?;
        self.round = Round::MaskedInput;
        let mut inbox: BTreeMap<ClientId, Vec<EncryptedShare>> =
            self.shared.keys().map(|&u| (u, Vec::new())).collect();
        for (&from, shares) in &self.shared {
            for share in shares {
                if let Some(list) = inbox.get_mut(&share.peer) {
                    list.push(EncryptedShare {
                        peer: from,
                        ..share.clone()
                    });
                }
            }
        }
        Ok(inbox
            .into_iter()
            .map(|(to, shares)| {
                (
                    to,
                    self.open(Round::MaskedInput, ServerBody::Shares(shares)),
                )
            })
            .collect())
    }

    /// Closes round 2: the survivors `U3` and the dropped `U2 \ U3`, for every survivor.
    pub fn close_masked_input(&mut self) -> Result<ServerMessage, Error> {
        self.check_close(Round::MaskedInput, self.masked.len(), "closing round 2")?;
        self.round = Round::Unmask;
        self.dropped = self
            .shared
            .keys()
            .filter(|u| !self.masked.contains_key(u))
            .copied()
            .collect();
        let survivors = self.masked.keys().copied().collect();
        let dropped = self.dropped.iter().copied().collect();
        Ok(self.open(
            Round::Unmask,
            ServerBody::UnmaskRequest { survivors, dropped },
        ))
    }

    /// The survivors whose masked inputs are in the sum (known once round 2 closed).
    pub fn survivors(&self) -> Vec<ClientId> {
        self.masked.keys().copied().collect()
    }

    /// Closes round 3: rebuilds every survivor's `b_u` and every dropped client's `s_u^SK`
    /// from at least `t` shares and removes all masks, leaving `Σ_{u ∈ U3} x_u mod 2^bits`
    /// (docs/algorithms.md §7, "Unmasking").
    pub fn finish(&mut self) -> Result<Aggregate, Error> {
        self.check_close(Round::Unmask, self.unmask.len(), "finishing")?;
        let session = self.params.session;
        let threshold = self.params.threshold;
        let mut sum = vec![0u64; self.params.vector_len];
        for y in self.masked.values() {
            sum.iter_mut()
                .zip(y)
                .for_each(|(s, &v)| *s = s.wrapping_add(v));
        }
        for &u in self.masked.keys() {
            let shares = self.collect(u, |reply| &reply.self_mask);
            let b_u = shamir::reconstruct(u, &shares, threshold)?;
            if crypto::commit_self_mask(&b_u, session, u) != self.commitments[&u] {
                return Err(Error::InconsistentShares(u));
            }
            let seed = crypto::mask_seed(&b_u, session, MaskKind::SelfMask);
            crypto::apply_mask(&mut sum, &seed, true);
        }
        for &d in &self.dropped {
            let shares = self.collect(d, |reply| &reply.mask_key);
            let bytes = shamir::reconstruct(d, &shares, threshold)?;
            let secret = StaticSecret::from(bytes);
            // A wrong share that still interpolates to 32 bytes shows here: the key must be the
            // one d advertised.
            if PublicKey::from(&secret).to_bytes() != self.advertised[&d].mask {
                return Err(Error::InconsistentShares(d));
            }
            // Every survivor u that received d's shares added ±PRG(s_ud): + if d < u.
            for u in self
                .masked
                .keys()
                .filter(|u| self.neighbours[&d].contains(u))
            {
                let agreement = crypto::agree(&secret, *u, &self.advertised[u].mask)?;
                let seed = crypto::mask_seed(&agreement, session, MaskKind::Pair);
                crypto::apply_mask(&mut sum, &seed, d < *u);
            }
        }
        let modulus = self.params.modulus_mask();
        sum.iter_mut().for_each(|s| *s &= modulus);
        Ok(Aggregate {
            sum,
            survivors: self.masked.keys().copied().collect(),
            dropped: self.dropped.iter().copied().collect(),
        })
    }

    /// The shares of `owner`'s secret that arrived, in the order of their holders' ids.
    fn collect(
        &self,
        owner: ClientId,
        list: impl Fn(&UnmaskShares) -> &Vec<(ClientId, Share)>,
    ) -> Vec<Share> {
        self.unmask
            .values()
            .flat_map(|reply| {
                list(reply)
                    .iter()
                    .filter(|(o, _)| *o == owner)
                    .map(|(_, s)| *s)
            })
            .collect()
    }
}

fn round_name(round: Round) -> &'static str {
    match round {
        Round::AdvertiseKeys => "round 0",
        Round::ShareKeys => "round 1",
        Round::MaskedInput => "round 2",
        Round::Unmask => "round 3",
    }
}
