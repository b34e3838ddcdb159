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
    pub failures: BTreeMap<ClientId, ClientFailure>,
}

/// Sorts the outcomes of the clients in `asked`: an update, a norm (only when `norms`: phase
/// one of a two-phase round; elsewhere a norm is an answer out of protocol, so `unreachable`),
/// or a failure. A client in `asked` without an outcome is `unreachable`; an outcome of a client
/// not asked is ignored.
pub fn classify(
    asked: impl IntoIterator<Item = ClientId>,
    mut outcomes: BTreeMap<ClientId, Outcome>,
    norms: bool,
) -> Classified {
    let mut c = Classified::default();
    for id in asked {
        let failure = |kind, reason: String| ClientFailure { kind, reason };
        match outcomes.remove(&id) {
            Some(Outcome::Reply(ClientReply::Update(e))) => {
                c.envelopes.insert(id, e);
            }
            Some(Outcome::Reply(ClientReply::Trained { update_norm, .. })) if norms => {
                c.norms.insert(id, update_norm);
            }
            Some(Outcome::Reply(ClientReply::Trained { .. })) => {
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
