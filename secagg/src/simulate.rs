//! An in-memory driver: one server and its clients in one thread, every message through
//! [`crate::wire`] so that bytes are counted and decoding is exercised, for tests, benchmarks
//! and (later) the in-process federation.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::client::Client;
use crate::error::Error;
use crate::message::{ClientId, ClientMessage, Round, ServerMessage};
use crate::params::Params;
use crate::server::{Aggregate, Server};
use crate::wire;

/// Who stops answering, and before which round: a client that drops stays silent for the
/// rest of the session, so each client has at most one round.
///
/// Before round 0 it never advertises keys (outside `U1`); before round 1 it advertised but
/// never shares (outside `U2`, no masks with it); before round 2 it shared but never sends its
/// masked input (dropped: the server removes its pair masks with its rebuilt key); before
/// round 3 its input is in the sum but it never unmasks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dropouts(BTreeMap<ClientId, Round>);

impl Dropouts {
    /// No client drops.
    pub fn none() -> Dropouts {
        Dropouts::default()
    }

    /// `clients` drop before their masked input (round 2).
    pub fn at_masked_input(clients: impl IntoIterator<Item = ClientId>) -> Dropouts {
        Dropouts::none().before(Round::MaskedInput, clients)
    }

    /// Also drops `clients` before `round` (a later call for the same client wins).
    pub fn before(mut self, round: Round, clients: impl IntoIterator<Item = ClientId>) -> Dropouts {
        self.0
            .extend(clients.into_iter().map(|client| (client, round)));
        self
    }

    /// Whether `client` is silent in `round`: it dropped before it or before an earlier round.
    fn silent_in(&self, round: Round, client: ClientId) -> bool {
        self.0.get(&client).is_some_and(|&dropped| dropped <= round)
    }
}

/// What one round cost, over all clients.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundCost {
    /// Clients that sent a message this round.
    pub senders: usize,
    /// Bytes of all client frames.
    pub upload_bytes: u64,
    /// Bytes of the server frames that opened this round, counted once per recipient.
    pub download_bytes: u64,
    /// Time all clients spent making their messages (their decoding included).
    pub client_time: Duration,
    /// Time the server spent decoding, checking and closing (and, in round 3, unmasking).
    pub server_time: Duration,
}

/// A finished simulated session.
#[derive(Debug, Clone)]
pub struct Simulation {
    pub aggregate: Aggregate,
    /// Costs by round, in the order of [`Round::ALL`].
    pub rounds: [RoundCost; 4],
    /// SHA-256 of every frame in the order sent: equal seeds give equal transcripts.
    pub transcript: [u8; 32],
    /// Clients that left on a failed consistency check, with the check.
    pub aborted: Vec<(ClientId, Error)>,
}

/// Frames, hashes and counts the traffic of one session.
struct Wire {
    transcript: Sha256,
    rounds: [RoundCost; 4],
}

impl Wire {
    fn cost(&mut self, round: Round) -> &mut RoundCost {
        &mut self.rounds[usize::from(round.number())]
    }

    fn upload(
        &mut self,
        server: &mut Server,
        message: &ClientMessage,
        params: &Params,
    ) -> Result<(), Error> {
        let bytes = wire::encode(message);
        self.transcript.update(&bytes);
        let round = message.header.round;
        let started = Instant::now();
        let decoded = wire::decode_client_message(&bytes, params)?;
        server.receive(decoded)?;
        let cost = self.cost(round);
        cost.server_time += started.elapsed();
        cost.senders += 1;
        cost.upload_bytes += bytes.len() as u64;
        Ok(())
    }

    /// Sends each `(client index, message)` through the wire, lets the client `answer`, and
    /// uploads the answer; a client whose answer is an error has aborted and stays silent.
    fn exchange(
        &mut self,
        session: &mut Session<'_>,
        deliveries: Vec<(usize, ServerMessage)>,
        mut answer: impl FnMut(&mut Client, usize, &ServerMessage) -> Result<ClientMessage, Error>,
    ) -> Result<(), Error> {
        for (i, message) in deliveries {
            let bytes = wire::encode(&message);
            self.transcript.update(&bytes);
            self.cost(message.round).download_bytes += bytes.len() as u64;
            let client = &mut session.clients[i];
            let started = Instant::now();
            let reply = wire::decode_server_message(&bytes, session.params)
                .and_then(|m| answer(client, i, &m));
            self.cost(message.round).client_time += started.elapsed();
            match reply {
                Ok(reply) => self.upload(session.server, &reply, session.params)?,
                Err(error) => session.aborted.push((client.id(), error)),
            }
        }
        Ok(())
    }
}

/// The parties of a simulated session, borrowed for one round.
struct Session<'a> {
    server: &'a mut Server,
    clients: &'a mut [Client],
    params: &'a Params,
    aborted: &'a mut Vec<(ClientId, Error)>,
}

/// Runs one session of `params` over `inputs` (one vector in `Z_{2^bits}` per client, in the
/// order of `params.clients`) with the given `dropouts`; every client's secrets and streams are
/// seeded from `rng`, so the same `rng` state gives the same transcript (and whoever knows the
/// `rng` knows every secret: a simulation, not a deployment; see [`Client::new`]).
///
/// Errors: the server's typed error when too many clients dropped (or aborted) to finish, or
/// when `inputs` does not fit the parameters.
pub fn simulate(
    params: &Params,
    inputs: &[Vec<u64>],
    dropouts: &Dropouts,
    rng: &mut impl rand::Rng,
) -> Result<Simulation, Error> {
    if inputs.len() != params.clients.len() {
        return Err(Error::Input {
            what: format!(
                "{} input vectors for {} clients",
                inputs.len(),
                params.clients.len()
            ),
        });
    }
    let mut server = Server::new(params.clone())?;
    let mut wire = Wire {
        transcript: Sha256::new(),
        rounds: [RoundCost::default(); 4],
    };
    let mut aborted = Vec::new();

    // Round 0: making a client draws its secrets and key pairs, round 0's work.
    let mut clients = Vec::with_capacity(params.clients.len());
    for &id in &params.clients {
        let mut seed = [0u8; 32];
        rng.fill_bytes(&mut seed);
        let started = Instant::now();
        let mut client = Client::new(params.clone(), id, seed)?;
        if !dropouts.silent_in(Round::AdvertiseKeys, id) {
            let message = client.advertise_keys()?;
            wire.cost(Round::AdvertiseKeys).client_time += started.elapsed();
            wire.upload(&mut server, &message, params)?;
        }
        clients.push(client);
    }
    let started = Instant::now();
    let directories = server.close_advertise_keys()?;
    wire.cost(Round::AdvertiseKeys).server_time += started.elapsed();

    // Round 1: each live client the keys of its neighbourhood.
    let deliveries = addressed(params, &clients, dropouts, Round::ShareKeys, directories);
    let mut session = Session {
        server: &mut server,
        clients: &mut clients,
        params,
        aborted: &mut aborted,
    };
    wire.exchange(&mut session, deliveries, |client, _, m| {
        client.share_keys(m)
    })?;
    let started = Instant::now();
    let inboxes = server.close_share_keys()?;
    wire.cost(Round::ShareKeys).server_time += started.elapsed();

    // Round 2: each live client its own shares.
    let deliveries = addressed(params, &clients, dropouts, Round::MaskedInput, inboxes);
    let mut session = Session {
        server: &mut server,
        clients: &mut clients,
        params,
        aborted: &mut aborted,
    };
    wire.exchange(&mut session, deliveries, |client, i, m| {
        client.masked_input(m, &inputs[i])
    })?;
    let started = Instant::now();
    let request = server.close_masked_input()?;
    wire.cost(Round::MaskedInput).server_time += started.elapsed();

    // Round 3: the same request for every survivor.
    let survivors = server.survivors();
    let deliveries = live_clients(&clients, dropouts, Round::Unmask)
        .into_iter()
        .filter(|&i| survivors.contains(&clients[i].id()))
        .map(|i| (i, request.clone()))
        .collect();
    let mut session = Session {
        server: &mut server,
        clients: &mut clients,
        params,
        aborted: &mut aborted,
    };
    wire.exchange(&mut session, deliveries, |client, _, m| client.unmask(m))?;
    let started = Instant::now();
    let aggregate = server.finish()?;
    wire.cost(Round::Unmask).server_time += started.elapsed();

    Ok(Simulation {
        aggregate,
        rounds: wire.rounds,
        transcript: wire.transcript.finalize().into(),
        aborted,
    })
}

/// The messages of `outbox` addressed to clients that have not dropped before `round` nor
/// aborted, by client index.
fn addressed(
    params: &Params,
    clients: &[Client],
    dropouts: &Dropouts,
    round: Round,
    outbox: Vec<(ClientId, ServerMessage)>,
) -> Vec<(usize, ServerMessage)> {
    let live = live_clients(clients, dropouts, round);
    outbox
        .into_iter()
        .filter_map(|(to, message)| {
            let i = params.clients.binary_search(&to).ok()?;
            live.contains(&i).then_some((i, message))
        })
        .collect()
}

/// Indices of the clients that have not dropped before `round` nor aborted.
fn live_clients(clients: &[Client], dropouts: &Dropouts, round: Round) -> Vec<usize> {
    (0..clients.len())
        .filter(|&i| !clients[i].aborted() && !dropouts.silent_in(round, clients[i].id()))
        .collect()
}
