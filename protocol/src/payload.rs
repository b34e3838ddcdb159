//! Uplink payloads: opaque bytes with an exact bit count, decoded and validated on the server
//! before anything touches the global model.
//!
//! The identity encoding is bincode of the trained values; the compressors (QSGD, SignSGD,
//! FedPM, each with or without KLMS) are in [`crate::uplink`], selected by the task's
//! [`Uplink`](crate::uplink::Uplink).

use crate::error::Error;
use crate::model::ModelState;
use crate::task::{ClientId, LayerShard, TrainOutput, TrainTask};
use crate::uplink::codec::Update;
use crate::uplink::{self, Compressor, UplinkSide};
use serde::{Deserialize, Serialize};

/// An encoded update as it travels: bytes plus the exact number of bits that carry it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Payload {
    pub compressor: Compressor,
    pub bytes: Vec<u8>,
    /// Under SCAFFOLD, the change of the client's control variate `Δc_i` as
    /// [`ModelState::to_bytes`] (32 bits a value, uncompressed); empty otherwise.
    #[serde(default)]
    pub control: Vec<u8>,
    /// Bits on the wire for this update: `8 × (bytes.len() + control.len())`, every padding
    /// bit included.
    pub bits: u64,
}

/// An encoded update as the server receives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
///
/// Every field is what the client says: `client` and `round` are checked against the task
/// ([`open`]), and the aggregation weight never comes from here but from the server's registry.
pub struct UpdateEnvelope {
    pub client: ClientId,
    pub round: u64,
    pub loss: f64,
    /// ‖update − sent‖₂ over everything the client trained (the norm of 002's U_k).
    pub update_norm: f64,
    pub train_seconds: f64,
    pub payload: Payload,
}

/// Why an update was rejected. Each reason is counted separately.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error, Serialize, Deserialize)]
pub enum Rejection {
    #[error("payload does not decode: {0}")]
    Malformed(String),
    #[error("wrong shape: {0}")]
    Shape(String),
    #[error("non-finite value: {0}")]
    NonFinite(String),
    #[error("indices not given to this client: {0}")]
    Indices(String),
    #[error("update for round {found}, expected round {expected}")]
    Stale { expected: u64, found: u64 },
    #[error("update signed by client {found}, but the task went to client {expected}")]
    Forged { expected: ClientId, found: ClientId },
}

impl Rejection {
    /// What kind of rejection this is, for counting.
    pub fn kind(&self) -> RejectionKind {
        match self {
            Rejection::Malformed(_) => RejectionKind::Malformed,
            Rejection::Shape(_) => RejectionKind::Shape,
            Rejection::NonFinite(_) => RejectionKind::NonFinite,
            Rejection::Indices(_) => RejectionKind::Indices,
            Rejection::Stale { .. } => RejectionKind::Stale,
            Rejection::Forged { .. } => RejectionKind::Forged,
        }
    }

    /// A short, stable label for counting (see [`RejectionKind::label`]).
    pub fn label(&self) -> &'static str {
        self.kind().label()
    }
}

/// Why an update, or a round's aggregate, never reached the global model; the label of each is
/// the `reason` of the rejection counters in `metrics.jsonl` and Prometheus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectionKind {
    Malformed,
    Shape,
    NonFinite,
    Indices,
    /// The envelope names another round than the task's (a replayed or late update).
    Stale,
    /// The envelope names another client than the one the task went to.
    Forged,
    /// Every update passed, but their aggregate overflowed f32 (model left unchanged).
    NonFiniteAggregate,
    /// The update's norm ‖values − sent‖₂, computed by the server against the task, exceeds
    /// `[federation] max_update_norm` (a finite but exploding update).
    NormBound,
}

impl RejectionKind {
    pub const ALL: [RejectionKind; 8] = [
        RejectionKind::Malformed,
        RejectionKind::Shape,
        RejectionKind::NonFinite,
        RejectionKind::Indices,
        RejectionKind::Stale,
        RejectionKind::Forged,
        RejectionKind::NonFiniteAggregate,
        RejectionKind::NormBound,
    ];

    pub fn label(self) -> &'static str {
        match self {
            RejectionKind::Malformed => "malformed",
            RejectionKind::Shape => "shape",
            RejectionKind::NonFinite => "non_finite",
            RejectionKind::Indices => "indices",
            RejectionKind::Stale => "stale",
            RejectionKind::Forged => "forged",
            RejectionKind::NonFiniteAggregate => "non_finite_aggregate",
            RejectionKind::NormBound => "norm_bound",
        }
    }
}

/// Encodes a client's training output as its task's uplink asks. An error (a FedPM output
/// that is not a probability, a non-finite QSGD norm) fails the client, like a training error.
pub fn encode(task: &TrainTask, output: &TrainOutput) -> Result<Payload, Error> {
    let compressor = task.uplink.compressor;
    let (bytes, _) = compressor.codec().encode(task, output)?;
    let control = output
        .control
        .as_ref()
        .map(ModelState::to_bytes)
        .unwrap_or_default();
    Ok(Payload {
        compressor,
        bits: 8 * (bytes.len() + control.len()) as u64,
        bytes,
        control,
    })
}

/// The validated content of an update.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedUpdate {
    pub dense: ModelState,
    pub shards: Vec<LayerShard>,
    /// What a compressed uplink tells the server besides the values (`None` for identity).
    pub side: Option<UplinkSide>,
    /// Under SCAFFOLD, the client's `Δc_i`: the task's tensors, finite.
    pub control: Option<ModelState>,
}

/// Opens an envelope that answers `task`: it must name the task's client and round (else
/// [`Rejection::Forged`] or [`Rejection::Stale`]), then its payload goes through
/// [`decode_and_validate`].
pub fn open(envelope: &UpdateEnvelope, task: &TrainTask) -> Result<DecodedUpdate, Rejection> {
    if envelope.client != task.client {
        return Err(Rejection::Forged {
            expected: task.client,
            found: envelope.client,
        });
    }
    if envelope.round != task.round {
        return Err(Rejection::Stale {
            expected: task.round,
            found: envelope.round,
        });
    }
    decode_and_validate(&envelope.payload, task)
}

/// Decodes `payload` and checks it against the task the client was given: the same dense
/// tensors with the same shapes, the same sharded layers with exactly the indices sent, the right
/// factor lengths, and only finite values.
pub fn decode_and_validate(
    payload: &Payload,
    task: &TrainTask,
) -> Result<DecodedUpdate, Rejection> {
    if payload.compressor != task.uplink.compressor {
        return Err(Rejection::Malformed(format!(
            "payload encoded with `{}`, the task asked for `{}`",
            payload.compressor, task.uplink.compressor
        )));
    }
    let (update, _) = payload
        .compressor
        .codec()
        .decode(task, &payload.bytes)
        .map_err(|e| Rejection::Malformed(e.to_string()))?;
    let (dense, shards, side) = match update {
        Update::Tensors { dense, shards } => (dense, shards, None),
        Update::Message { values, side } => {
            let (dense, shards) = uplink::unflatten(task, &values);
            (dense, shards, Some(side))
        }
    };
    let carried = payload.bytes.len() + payload.control.len();
    if payload.bits != 8 * carried as u64 {
        return Err(Rejection::Malformed(format!(
            "payload claims {} bits but carries {carried} bytes",
            payload.bits,
        )));
    }
    let control = decode_control(&payload.control, task)?;
    dense
        .check_compatible(&task.dense)
        .map_err(|e| Rejection::Shape(e.to_string()))?;
    dense
        .check_finite()
        .map_err(|e| Rejection::NonFinite(e.to_string()))?;
    if shards.len() != task.shards.len() {
        return Err(Rejection::Shape(format!(
            "{} sharded layers, expected {}",
            shards.len(),
            task.shards.len()
        )));
    }
    for (got, sent) in shards.iter().zip(&task.shards) {
        if got.name != sent.name || got.shape != sent.shape {
            return Err(Rejection::Shape(format!(
                "sharded layer `{}` {:?} where `{}` {:?} was sent",
                got.name, got.shape, sent.name, sent.shape
            )));
        }
        if got.indices != sent.indices {
            return Err(Rejection::Indices(format!(
                "layer `{}` returned terms {:?}, was given {:?}",
                got.name, got.indices, sent.indices
            )));
        }
        let n = sent.indices.len();
        if got.left.len() != n * sent.rows() || got.right.len() != n * sent.cols() {
            return Err(Rejection::Shape(format!(
                "layer `{}`: factors of {} and {} values, expected {} and {}",
                got.name,
                got.left.len(),
                got.right.len(),
                n * sent.rows(),
                n * sent.cols()
            )));
        }
        if let Some(p) = got
            .left
            .iter()
            .chain(&got.right)
            .position(|v| !v.is_finite())
        {
            return Err(Rejection::NonFinite(format!(
                "layer `{}` factor value {p}",
                got.name
            )));
        }
    }
    Ok(DecodedUpdate {
        dense,
        shards,
        side,
        control,
    })
}

/// The `Δc_i` of a payload: present exactly when the task sent SCAFFOLD's variates, with the
/// task's dense tensors and finite values.
fn decode_control(bytes: &[u8], task: &TrainTask) -> Result<Option<ModelState>, Rejection> {
    match (&task.variates, bytes.is_empty()) {
        (None, true) => Ok(None),
        (None, false) => Err(Rejection::Malformed(
            "a control variate, but the task sent none".into(),
        )),
        (Some(_), true) => Err(Rejection::Malformed(
            "no control variate, but the task sent SCAFFOLD's".into(),
        )),
        (Some(_), false) => {
            let control = ModelState::from_bytes(bytes)
                .map_err(|e| Rejection::Malformed(format!("control variate: {e}")))?;
            control
                .check_compatible(&task.dense)
                .map_err(|e| Rejection::Shape(format!("control variate: {e}")))?;
            control
                .check_finite()
                .map_err(|e| Rejection::NonFinite(format!("control variate: {e}")))?;
            Ok(Some(control))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NamedTensor;
    use crate::task::Recipe;

    fn task() -> TrainTask {
        TrainTask {
            round: 1,
            client: 3,
            seed: 9,
            dense: ModelState::new(vec![NamedTensor::zeros("b", vec![2])]).unwrap(),
            width: None,
            shards: vec![LayerShard {
                name: "w".into(),
                shape: vec![2, 3],
                indices: vec![0, 2],
                left: vec![0.0; 4],
                right: vec![0.0; 6],
                multipliers: vec![1.0, 1.0],
            }],
            recipe: Recipe {
                learning_rate: 0.1,
                epochs: 1,
                batch_size: 4,
                momentum: 0.9,
                weight_decay: 0.0,
                clip_lr: None,
                proximal_mu: 0.0,
            },
            uplink: Default::default(),
            variates: None,
        }
    }

    fn output(task: &TrainTask) -> TrainOutput {
        TrainOutput {
            dense: task.dense.clone(),
            shards: task.shards.clone(),
            loss: 1.0,
            control: None,
        }
    }

    #[test]
    fn identity_round_trip_counts_bits() {
        let t = task();
        let p = encode(&t, &output(&t)).unwrap();
        assert_eq!(p.bits, 8 * p.bytes.len() as u64);
        let d = decode_and_validate(&p, &t).unwrap();
        assert_eq!(d.shards[0].indices, vec![0, 2]);
    }

    #[test]
    fn envelopes_must_answer_their_task() {
        let t = task();
        let envelope = |client, round| UpdateEnvelope {
            client,
            round,
            loss: 1.0,
            update_norm: 0.0,
            train_seconds: 0.0,
            payload: encode(&t, &output(&t)).unwrap(),
        };
        assert!(open(&envelope(3, 1), &t).is_ok());
        assert_eq!(
            open(&envelope(4, 1), &t).unwrap_err(),
            Rejection::Forged {
                expected: 3,
                found: 4
            }
        );
        assert_eq!(open(&envelope(3, 0), &t).unwrap_err().label(), "stale");
    }

    #[test]
    fn rejects_each_kind_of_bad_update() {
        let t = task();
        let mut bad = output(&t);
        bad.shards[0].indices = vec![0, 1];
        assert_eq!(
            decode_and_validate(&encode(&t, &bad).unwrap(), &t)
                .unwrap_err()
                .label(),
            "indices"
        );
        let mut bad = output(&t);
        bad.shards[0].right.pop();
        assert_eq!(
            decode_and_validate(&encode(&t, &bad).unwrap(), &t)
                .unwrap_err()
                .label(),
            "shape"
        );
        let mut bad = output(&t);
        bad.dense.tensors[0].data[0] = f32::NAN;
        assert_eq!(
            decode_and_validate(&encode(&t, &bad).unwrap(), &t)
                .unwrap_err()
                .label(),
            "non_finite"
        );
        let mut p = encode(&t, &output(&t)).unwrap();
        p.bytes.truncate(3);
        assert_eq!(
            decode_and_validate(&p, &t).unwrap_err().label(),
            "malformed"
        );
    }

    /// Under SCAFFOLD an update carries `Δc_i` of the task's dense tensors, counted in its
    /// bits; a missing, unasked-for, misshapen, non-finite or damaged one is rejected.
    #[test]
    fn a_control_variate_travels_counted_and_checked() {
        let mut t = task();
        t.variates = Some(crate::task::Variates {
            server: t.dense.clone(),
            client: None,
        });
        let change = ModelState::new(vec![
            NamedTensor::new("b", vec![2], vec![0.5, -1.0]).unwrap(),
        ])
        .unwrap();
        let good = TrainOutput {
            control: Some(change.clone()),
            ..output(&t)
        };
        let p = encode(&t, &good).unwrap();
        assert_eq!(p.bits, 8 * (p.bytes.len() + p.control.len()) as u64);
        assert_eq!(decode_and_validate(&p, &t).unwrap().control, Some(change));
        let label = |out: &TrainOutput, task: &TrainTask| {
            decode_and_validate(&encode(task, out).unwrap(), task)
                .unwrap_err()
                .label()
        };
        assert_eq!(label(&output(&t), &t), "malformed");
        assert_eq!(label(&good, &task()), "malformed");
        let mut misshapen = good.clone();
        misshapen.control = Some(ModelState::new(vec![NamedTensor::zeros("b", vec![3])]).unwrap());
        assert_eq!(label(&misshapen, &t), "shape");
        let mut nan = good.clone();
        if let Some(c) = nan.control.as_mut() {
            c.tensors[0].data[1] = f32::NAN;
        }
        assert_eq!(label(&nan, &t), "non_finite");
        let mut damaged = encode(&t, &good).unwrap();
        damaged.control.truncate(2);
        damaged.bits = 8 * (damaged.bytes.len() + damaged.control.len()) as u64;
        assert_eq!(
            decode_and_validate(&damaged, &t).unwrap_err().label(),
            "malformed"
        );
    }
}
