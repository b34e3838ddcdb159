//! Secure aggregation of a synchronous round (SecAgg+ on [`fedshard_secagg`]; docs/secagg.md,
//! docs/algorithms.md §7): the server learns the sum of the round's updates and nothing of any
//! one of them.
//!
//! A secure round starts like phase one of a two-phase round: every participant trains and keeps
//! its update ([`ClientReply::Ready`](crate::client::ClientReply::Ready)). Four exchanges of the
//! protocol then carry each client's *input*: its update as the plain fold's blocks (every dense
//! tensor, and each singular vector `u'_i`, `v'_i` of each sharded layer, so sharded layers are
//! summed over the union of the factor columns), as changes against what it was sent, zero where
//! it held nothing, clipped to `clip_norm`, premultiplied by its aggregation weight and encoded in
//! fixed point. The server decodes the sum and moves each block by it over the total weight of
//! the surviving clients that held the block: the plain fold's per-block weighted mean
//! ([`fedshard_strategies::aggregation::fold_weighted`]) for FedAvg and uniform weights, up to
//! the fixed-point rounding and the clip. The weights and who held which block are the server's
//! own knowledge (the registry's sample counts, the round's shard plan); only the values are
//! hidden.
//!
//! With `[privacy]` (unsharded models), the clip is DP-FedAvg's of the round, the inputs carry
//! one more value that counts the unclipped changes, and the server releases the decoded sum as
//! DP-FedAvg releases the sum it clipped itself ([`crate::round::Private`]): noised, over the
//! expected number of updates.
//!
//! `session` runs the server's side, `client` a client's, and `fold` folds what the session
//! summed.

mod client;
mod fold;
mod session;

pub use client::{SecureClient, input};
pub use fold::{SecureSum, fold_sum};
pub use session::{SessionOutcome, SessionRecord};

use crate::error::{Error, Result};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::shard_plan::ShardPlan;
use fedshard_protocol::task::{ClientId, TrainTask};
use fedshard_protocol::width::{KeptUnits, WidthGroup, sliced_len, union_of};
use fedshard_secagg::{FixedPoint, Graph, Params, ServerMessage, SessionId};
use fedshard_strategies::rng::{Purpose, stream};
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::Range;

/// `[secure_aggregation]` as the runtime uses it. The weights come from the run's aggregator
/// ([`fedshard_strategies::aggregation::Aggregator::sum_weight`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SecureSettings {
    /// Every client scales its change down to this L2 norm before encoding: it bounds every
    /// coordinate, hence the fixed-point range `[−clip_norm, clip_norm]`. `None` with
    /// `[privacy]`, whose clip norm of each round the clients apply instead.
    pub clip_norm: Option<f64>,
    /// Fixed-point steps per unit: each client's value moves by at most `1 / (2 · scale)`.
    pub scale: f64,
    /// `t` as a fraction of the holders of each secret (a client's neighbours and itself):
    /// `t = ⌈threshold · holders⌉`, in `(1/2, 1]` so that the server cannot split the clients
    /// into two sessions (Bonawitz et al. 2017).
    pub threshold: f64,
    /// SecAgg+'s graph degree `k` (even): each client masks with and shares its secrets among
    /// `k` neighbours; `None`, the complete graph of SecAgg.
    pub degree: Option<usize>,
}

/// The coarsest fixed-point scale: a step of at most 2⁻¹⁰ ≈ 0.001. A coarser one rounds the
/// typical change of one coordinate in a round (a learning rate of 0.01 or so times a gradient
/// entry below 1) to zero, and a model summed at it would not move.
pub const MIN_SCALE: f64 = 1024.0;

impl SecureSettings {
    /// Checks the settings on their own, for clients that clip to `clip_norm` (this section's,
    /// or with `[privacy]` DP-FedAvg's, given as `dp_clip`), and returns the fixed-point
    /// encoding they use: one clip norm, given once; a scale of at least [`MIN_SCALE`]; the
    /// secure-aggregation parameters' own ranges (the threshold, the degree, the fixed point).
    pub fn validate(&self, dp_clip: Option<f64>) -> Result<FixedPoint> {
        const FIELD: &str = "secure_aggregation.clip_norm";
        let invalid = |field, expected, found: String| Error::Invalid {
            field,
            expected,
            found,
        };
        let clip = match (self.clip_norm, dp_clip) {
            (Some(clip), None) if clip.is_finite() && clip > 0.0 => clip,
            (Some(clip), None) => {
                return Err(invalid(FIELD, "a positive number", clip.to_string()));
            }
            (None, None) => {
                return Err(invalid(
                    FIELD,
                    "a positive number (each client's change is scaled down to it before \
                     encoding)",
                    "none".into(),
                ));
            }
            (Some(clip), Some(_)) => {
                return Err(invalid(
                    FIELD,
                    "no value with [privacy], whose `clip_norm` the clients clip to",
                    clip.to_string(),
                ));
            }
            (None, Some(clip)) => clip,
        };
        if !(self.scale >= MIN_SCALE && self.scale.is_finite()) {
            return Err(invalid(
                "secure_aggregation.scale",
                "fixed-point steps per unit of at least 1024 (a coarser step rounds a round's \
                 change of a coordinate to zero), with clip_norm × scale at most 2⁵²",
                self.scale.to_string(),
            ));
        }
        fedshard_secagg::params::check_threshold_fraction(self.threshold)
            .map_err(Error::SecureAggregation)?;
        if let Some(degree) = self.degree {
            Graph::RandomRegular { degree, seed: 0 }
                .validate()
                .map_err(Error::SecureAggregation)?;
        }
        self.fixed_point(clip)
    }

    /// The fixed-point encoding of inputs clipped to `clip_norm`.
    pub fn fixed_point(&self, clip_norm: f64) -> Result<FixedPoint> {
        FixedPoint::new(clip_norm, self.scale).map_err(Error::SecureAggregation)
    }

    /// The public parameters of round `round`'s session among `clients` (ascending) over
    /// vectors of `vector_len` in `fixed`: a session id and the graph's relabelling drawn from
    /// the run's stream, `t` from [`SecureSettings::threshold`], and the bits that hold the sum
    /// of all of them without wrapping.
    pub fn params(
        &self,
        (seed, round): (u64, u64),
        clients: &[ClientId],
        vector_len: usize,
        fixed: &FixedPoint,
    ) -> Result<Params> {
        let mut rng = stream(seed, round, 0, Purpose::SecureSession);
        let mut session = [0u8; 16];
        rng.fill_bytes(&mut session);
        let graph = match self.degree {
            Some(degree) => Graph::RandomRegular {
                degree,
                seed: rng.next_u64(),
            },
            None => Graph::Complete,
        };
        let clients = clients
            .iter()
            .map(|&c| session_id(c))
            .collect::<Result<Vec<_>>>()?;
        let mut params = Params {
            session: SessionId(session),
            bits: fixed
                .bits_for(clients.len())
                .map_err(Error::SecureAggregation)?,
            clients,
            threshold: 1,
            graph,
            vector_len,
        };
        params.threshold =
            fedshard_secagg::params::threshold_of(self.threshold, params.holders_per_secret())
                .map_err(Error::SecureAggregation)?;
        params.validate().map_err(Error::SecureAggregation)?;
        Ok(params)
    }
}

/// A federation client's id in a session (sessions number clients in 32 bits).
pub fn session_id(client: ClientId) -> Result<fedshard_secagg::ClientId> {
    fedshard_secagg::ClientId::try_from(client).map_err(|_| {
        Error::SecureAggregation(fedshard_secagg::Error::Params(format!(
            "client id {client} does not fit a session's 32-bit ids"
        )))
    })
}

/// Where each block of a round's model sits in a secure input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockLayout {
    /// The tensors the round trains densely, in the global model's order, with their lengths
    /// (under a width strategy, cut to [`WidthLayout::union`]).
    pub dense: Vec<(String, usize)>,
    /// The sharded layers, in the plan's order: all their terms' `u'` vectors, then all `v'`.
    pub layers: Vec<LayerLayout>,
    /// Under a width strategy: the round's tensors are summed over the union of the clients'
    /// kept units, each client's values at their places in it (docs/algorithms.md §8.3).
    pub width: Option<WidthLayout>,
}

/// A width round's secure input: the model's widths and the units any of the session's clients
/// keeps. Values outside the union nobody trained, so no input carries them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WidthLayout {
    pub groups: Vec<WidthGroup>,
    pub union: KeptUnits,
}

/// One sharded layer's place in a [`BlockLayout`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerLayout {
    pub name: String,
    /// Terms of the round's SVD (the union of every client's columns).
    pub terms: usize,
    pub rows: usize,
    pub cols: usize,
}

impl LayerLayout {
    /// Values of the layer in an input: every term's `u'`, then every term's `v'`.
    fn len(&self) -> usize {
        self.terms * (self.rows + self.cols)
    }

    /// Where term `term`'s `u'` and `v'` sit in an input whose layer begins at `start`.
    fn term_ranges(&self, start: usize, term: usize) -> [Range<usize>; 2] {
        let u = start + term * self.rows;
        let v = start + self.terms * self.rows + term * self.cols;
        [u..u + self.rows, v..v + self.cols]
    }
}

impl BlockLayout {
    /// The layout of a round over `global` with `plan`: the dense tensors any task carries (cut
    /// to the union of the tasks' width slices under a width strategy) and every term of every
    /// sharded layer.
    pub fn of(global: &ModelState, plan: Option<&ShardPlan>, tasks: &[&TrainTask]) -> BlockLayout {
        let width = plan.and_then(|p| p.width.as_ref()).map(|w| WidthLayout {
            groups: w.groups.clone(),
            union: union_of(tasks.iter().filter_map(|t| t.width.as_ref())),
        });
        // The widths' groups and the union's number of units of each, which fix each
        // tensor's length in the union.
        let cut: Option<(&[WidthGroup], BTreeMap<String, usize>)> = width.as_ref().map(|w| {
            let units = w.union.iter().map(|(g, u)| (g.clone(), u.len())).collect();
            (w.groups.as_slice(), units)
        });
        let dense = global
            .tensors
            .iter()
            .filter(|t| tasks.iter().any(|task| task.dense.get(&t.name).is_some()))
            .map(|t| {
                let len = match &cut {
                    Some((groups, units)) => sliced_len(t, groups, units) as usize,
                    None => t.data.len(),
                };
                (t.name.clone(), len)
            })
            .collect();
        let layers = plan
            .map(|p| {
                p.factors
                    .iter()
                    .map(|(name, f)| LayerLayout {
                        name: name.clone(),
                        terms: f.singular_values.len(),
                        rows: f.rows,
                        cols: f.cols,
                    })
                    .collect()
            })
            .unwrap_or_default();
        BlockLayout {
            dense,
            layers,
            width,
        }
    }

    /// Values in an input.
    pub fn len(&self) -> usize {
        let dense: usize = self.dense.iter().map(|(_, n)| n).sum();
        dense + self.layers.iter().map(LayerLayout::len).sum::<usize>()
    }

    /// Whether an input would be empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The offset and length of dense tensor `name`.
    fn dense(&self, name: &str) -> Option<(usize, usize)> {
        let mut offset = 0;
        for (n, len) in &self.dense {
            if n == name {
                return Some((offset, *len));
            }
            offset += len;
        }
        None
    }

    /// The offset of each sharded layer's first `u'` vector.
    fn layer_starts(&self) -> Vec<usize> {
        let mut start: usize = self.dense.iter().map(|(_, n)| n).sum();
        self.layers
            .iter()
            .map(|l| {
                let s = start;
                start += l.len();
                s
            })
            .collect()
    }
}

/// What a client needs, besides its update and its task, to form its input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputSpec {
    pub layout: BlockLayout,
    /// [`SecureSettings::clip_norm`].
    pub clip_norm: f64,
    /// This client's weight over the largest of the round, in `(0, 1]`, so a weighted value
    /// stays inside the clip.
    pub weight: f64,
    pub fixed: FixedPoint,
    /// With `[privacy]`: one more value, `clip_norm` when the change needed no clipping and 0
    /// otherwise, so that the sum also counts the unclipped updates (adaptive clipping's only
    /// input) without telling whose.
    pub count_unclipped: bool,
}

/// One step of a client's session, as the server sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SecureStep {
    /// Round 0: the session's public parameters and how to form the input. The client forms
    /// it, draws its secrets from the operating system and advertises its keys.
    Begin {
        params: Params,
        input: Box<InputSpec>,
    },
    /// Rounds 1–3: the server's message (the neighbours' keys, the shares addressed to the
    /// client, the request to unmask).
    Continue(ServerMessage),
}
