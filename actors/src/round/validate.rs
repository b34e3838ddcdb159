//! Opening and checking each update against the task its client was given.

use fedshard_protocol::payload::{DecodedUpdate, RejectionKind, UpdateEnvelope, open};
use fedshard_protocol::task::{ClientId, TrainTask};
use std::collections::BTreeMap;

/// An update that passed every check, with what the record needs of its envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct Accepted {
    pub client: ClientId,
    pub update: DecodedUpdate,
    pub loss: f64,
    pub train_seconds: f64,
}

/// The updates that may touch the model, and the others counted by reason.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Validated {
    /// Ascending by client.
    pub accepted: Vec<Accepted>,
    pub rejected: BTreeMap<RejectionKind, usize>,
}

/// Opens every envelope against the task its client was given ([`open`]: the right client and
/// round, a payload that decodes to the task's tensors and indices, finite values), then, with a
/// bound (`[federation] max_update_norm`), rejects as [`RejectionKind::NormBound`] every update
/// whose norm [`update_norm`], computed here against the task and never taken from the
/// envelope's own `update_norm`, exceeds it. Without a bound nothing more is checked.
pub fn validate(
    envelopes: &BTreeMap<ClientId, UpdateEnvelope>,
    tasks: &BTreeMap<ClientId, TrainTask>,
    max_update_norm: Option<f64>,
) -> Validated {
    let mut v = Validated::default();
    for (id, envelope) in envelopes {
        match check(*id, envelope, tasks.get(id), max_update_norm) {
            Ok(accepted) => v.accepted.push(accepted),
            Err(kind) => *v.rejected.entry(kind).or_default() += 1,
        }
    }
    v
}

/// One envelope of [`validate`], from client `id` that was given `task` (`None`: no task, so
/// `forged`): the accepted update, or why it was rejected.
pub fn check(
    id: ClientId,
    envelope: &UpdateEnvelope,
    task: Option<&TrainTask>,
    max_update_norm: Option<f64>,
) -> Result<Accepted, RejectionKind> {
    let task = task.ok_or(RejectionKind::Forged)?;
    let update = open(envelope, task).map_err(|rejection| {
        tracing::warn!(client = id, %rejection, "update rejected");
        rejection.kind()
    })?;
    if let Some(bound) = max_update_norm {
        let norm = update_norm(&update, task);
        // A NaN norm (which finite values never give) is rejected too.
        if norm.is_nan() || norm > bound {
            tracing::warn!(
                client = id,
                norm,
                bound,
                "update rejected: its norm exceeds federation.max_update_norm"
            );
            return Err(RejectionKind::NormBound);
        }
    }
    Ok(Accepted {
        client: id,
        update,
        loss: envelope.loss,
        train_seconds: envelope.train_seconds,
    })
}

/// ‖values − sent‖₂ of a decoded update against its task, in f64: over every dense tensor
/// (matched by name) and, for each sharded layer, over the returned factor columns `U'_I`, `V'_I`
/// against the ones sent. This is the server's own measure of the envelope's `update_norm`.
pub fn update_norm(update: &DecodedUpdate, task: &TrainTask) -> f64 {
    let squared = |new: &[f32], old: &[f32]| -> f64 {
        new.iter()
            .zip(old)
            .map(|(&a, &b)| {
                let d = f64::from(a) - f64::from(b);
                d * d
            })
            .sum::<f64>()
    };
    let mut sum = 0.0;
    for t in &update.dense.tensors {
        if let Some(sent) = task.dense.get(&t.name) {
            sum += squared(&t.data, &sent.data);
        }
    }
    for (got, sent) in update.shards.iter().zip(&task.shards) {
        sum += squared(&got.left, &sent.left) + squared(&got.right, &sent.right);
    }
    sum.sqrt()
}
