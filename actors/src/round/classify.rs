//! The one sorting of the clients' answers, for every schedule.

use super::{ClientFailure, FailureKind, Outcome};
use crate::client::ClientReply;
use fedshard_protocol::payload::UpdateEnvelope;
use fedshard_protocol::task::ClientId;
use std::collections::BTreeMap;

/// The answers of one phase, sorted.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Classified {
    /// Uploaded updates, keyed by the client the task went to.
    pub envelopes: BTreeMap<ClientId, UpdateEnvelope>,
    /// Phase one of a two-phase round: the update norms of the clients that trained.
    pub norms: BTreeMap<ClientId, f64>,
    /// Phase one of a secure round: the clients that trained and keep their update.
    pub ready: Vec<ClientId>,
    /// An exchange of a secure round: each client's message.
    pub secure: BTreeMap<ClientId, fedshard_secagg::ClientMessage>,
    pub failures: BTreeMap<ClientId, ClientFailure>,
}

/// What a phase asked for: the only answers it takes besides failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Updates (a plain round, the second phase of a two-phase round, an async answer).
    Updates,
    /// Update norms (phase one of a two-phase round).
    Norms,
    /// `Ready` (phase one of a secure round).
    Ready,
    /// Secure-aggregation messages (an exchange of a secure round).
    Secure,
}

/// Sorts the outcomes of the clients in `asked`: the answer the phase `expect`s, or a failure;
/// any other answer is out of protocol, so `unreachable`. A client in `asked` without an
/// outcome is `unreachable`; an outcome of a client not asked is ignored.
pub fn classify(
    asked: impl IntoIterator<Item = ClientId>,
    mut outcomes: BTreeMap<ClientId, Outcome>,
    expect: Expect,
) -> Classified {
    let mut c = Classified::default();
    for id in asked {
        let failure = |kind, reason: String| ClientFailure { kind, reason };
        match outcomes.remove(&id) {
            Some(Outcome::Reply(ClientReply::Update(e))) if expect == Expect::Updates => {
                c.envelopes.insert(id, e);
            }
            Some(Outcome::Reply(ClientReply::Trained { update_norm, .. }))
                if expect == Expect::Norms =>
            {
                c.norms.insert(id, update_norm);
            }
            Some(Outcome::Reply(ClientReply::Ready { .. })) if expect == Expect::Ready => {
                c.ready.push(id);
            }
            Some(Outcome::Reply(ClientReply::Secure { message, .. }))
                if expect == Expect::Secure =>
            {
                c.secure.insert(id, *message);
            }
            Some(Outcome::Reply(
                ClientReply::Update(_)
                | ClientReply::Trained { .. }
                | ClientReply::Ready { .. }
                | ClientReply::Secure { .. },
            )) => {
                let reason = "answered out of protocol".into();
                c.failures
                    .insert(id, failure(FailureKind::Unreachable, reason));
            }
            Some(Outcome::Reply(ClientReply::Failed {
                reason, panicked, ..
            })) => {
                let kind = if panicked {
                    FailureKind::Panic
                } else {
                    FailureKind::Error
                };
                c.failures.insert(id, failure(kind, reason));
            }
            Some(Outcome::Timeout) => {
                let reason = "missed its deadline".into();
                c.failures.insert(id, failure(FailureKind::Timeout, reason));
            }
            Some(Outcome::Unreachable(reason)) => {
                c.failures
                    .insert(id, failure(FailureKind::Unreachable, reason));
            }
            None => {
                let reason = "no reply".into();
                c.failures
                    .insert(id, failure(FailureKind::Unreachable, reason));
            }
        }
    }
    c
}
