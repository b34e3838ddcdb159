//! What the server remembers between rounds for the compressors: the location protocol of
//! adaptive KLMS blocks (§4.4) and QSGD's symbol frequencies (§4.7). It is part of a checkpoint,
//! so a resumed run codes its uplinks exactly as an uninterrupted one.

use super::{
    BlockMode, BlockScope, Cohort, CompressionConfig, Compressor, Host, KlmsTask, TaskBlocks,
    Uplink, UplinkSide, qsgd,
};
use crate::error::Error;
use crate::task::TrainTask;
use fedshard_strategies::compression::{
    KSchedule, KlBand, LangevinScaling, Partition, candidates_for_target,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::Range;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct UplinkState {
    /// Adaptive KLMS: the aggregated block ends for each message length (the clients of one
    /// keep ratio hold the same number of values); a length without ends is in `UPDATE`.
    pub ends: BTreeMap<usize, Vec<usize>>,
    /// Adaptive KLMS with `block_scope = "client"`: each client's own block ends (the last end
    /// is its message length); a client without them is in `UPDATE`.
    pub client_ends: BTreeMap<u64, Vec<usize>>,
    /// QSGD: last round's `(−1, 0, +1)` counts at each value of the global layout; empty before
    /// the first decoded round.
    pub counts: Vec<[u16; 3]>,
}

impl UplinkState {
    /// The uplink settings of `task` in its round, whose `cohort` SGLD scales for and whose
    /// number a K schedule follows.
    pub fn uplink(
        &self,
        compressor: Compressor,
        config: &CompressionConfig,
        cohort: Cohort,
        task: &TrainTask,
    ) -> Result<Uplink, Error> {
        let Some(host) = compressor.host() else {
            return Ok(Uplink::default());
        };
        let len = message_len(task);
        let klms = if compressor.klms() {
            Some(match config.blocks {
                BlockMode::Fixed => {
                    let schedule = config
                        .candidates
                        .map_or_else(KSchedule::reference, KSchedule::Constant);
                    KlmsTask {
                        candidates: schedule.candidates(cohort.round)?,
                        blocks: TaskBlocks::Fixed {
                            size: config.block_size,
                        },
                        selection: config.selection,
                    }
                }
                BlockMode::Adaptive => KlmsTask {
                    candidates: candidates_for_target(config.d_target + config.margin_bits)?,
                    blocks: TaskBlocks::Adaptive {
                        d_target: config.d_target,
                        max_block_size: config.max_block_size,
                        ends: match config.block_scope {
                            BlockScope::Global => self.ends.get(&len).cloned(),
                            BlockScope::Client => self
                                .client_ends
                                .get(&task.client)
                                .filter(|ends| ends.last() == Some(&len))
                                .cloned(),
                        },
                    },
                    selection: config.selection,
                },
            })
        } else {
            None
        };
        let prior_counts = if host == Host::Qsgd && !self.counts.is_empty() {
            let mut counts = Vec::with_capacity(len);
            for range in segments(task) {
                let slice = self
                    .counts
                    .get(range.clone())
                    .ok_or_else(|| Error::QsgdCounts {
                        counts: self.counts.len(),
                        needs: range.clone(),
                    })?;
                counts.extend_from_slice(slice);
            }
            Some(counts)
        } else {
            None
        };
        let prior_means = if host == Host::Qsgd && !self.counts.is_empty() {
            Some(qsgd::tensor_frequencies(
                &self.counts,
                &global_tensors(task),
            ))
        } else {
            None
        };
        let langevin = if host == Host::Sgld {
            Some(LangevinScaling::new(
                config.server_lr,
                cohort.population,
                cohort.participants,
            )?)
        } else {
            None
        };
        Ok(Uplink {
            compressor,
            server_lr: config.server_lr,
            temperature_group: config.temperature_group,
            temperature: config.temperature,
            temperature_scale: config.temperature_scale,
            klms,
            rescale_drift: config.rescale_drift && compressor.klms(),
            report_drift: config.report_drift && compressor.klms(),
            prior_counts,
            prior_tensors: if host == Host::Qsgd {
                message_tensors(task)
            } else {
                Vec::new()
            },
            prior_means,
            prior_weight: config.prior_weight,
            langevin,
        })
    }

    /// Learns from a round's decoded uplinks: aggregates uploaded block ends, re-opens `UPDATE`
    /// for a message length whose mean block KL left `[D_target/3, 1.5 D_target]`, and replaces
    /// QSGD's counts with this round's symbols. With `block_scope = "client"` each client's
    /// uploaded ends are kept as its own, and a client whose KL report left the band, or whose
    /// drift ratio fell below `recut_below_drift`, is sent back to `UPDATE` alone.
    pub fn observe(
        &mut self,
        compressor: Compressor,
        config: &CompressionConfig,
        decoded: &[(&TrainTask, &UplinkSide)],
    ) -> Result<(), Error> {
        let adaptive = compressor.klms() && config.blocks == BlockMode::Adaptive;
        if adaptive && config.block_scope == BlockScope::Client {
            let band = KlBand::around(f64::from(config.d_target));
            for (task, side) in decoded {
                if let Some(ends) = &side.ends {
                    self.client_ends.insert(task.client, ends.clone());
                } else if side
                    .mean_kl_bits
                    .is_some_and(|kl| band.needs_repartition(kl))
                    || (config.rescale_drift
                        && side
                            .drift_ratio
                            .is_some_and(|rho| rho < config.recut_below_drift))
                {
                    self.client_ends.remove(&task.client);
                }
            }
        } else if adaptive {
            let mut by_len: BTreeMap<usize, (Vec<Partition>, Vec<f64>)> = BTreeMap::new();
            for (_, side) in decoded {
                let entry = by_len.entry(side.len).or_default();
                if let Some(ends) = &side.ends {
                    entry.0.push(Partition::from_ends(ends.clone())?);
                }
                if let Some(kl) = side.mean_kl_bits {
                    entry.1.push(kl);
                }
            }
            let band = KlBand::around(f64::from(config.d_target));
            for (len, (partitions, reports)) in by_len {
                if !partitions.is_empty() {
                    let global = Partition::aggregate(&partitions, config.max_block_size)?;
                    self.ends.insert(len, global.ends().to_vec());
                } else if !reports.is_empty() {
                    let mean = reports.iter().sum::<f64>() / reports.len() as f64;
                    if band.needs_repartition(mean) {
                        self.ends.remove(&len);
                    }
                }
            }
        }
        if compressor.host() == Some(Host::Qsgd) {
            let Some((first, _)) = decoded.first() else {
                return Ok(());
            };
            let mut counts = vec![[0u16; 3]; global_len(first)];
            for (task, side) in decoded {
                let Some(symbols) = &side.symbols else {
                    continue;
                };
                let positions = segments(task).into_iter().flatten();
                for (g, &y) in positions.zip(symbols) {
                    if let Some(slot) = counts.get_mut(g) {
                        let i = (y.signum() + 1) as usize;
                        slot[i] = slot[i].saturating_add(1);
                    }
                }
            }
            self.counts = counts;
        }
        Ok(())
    }
}

/// The number of values in a task's message.
pub fn message_len(task: &TrainTask) -> usize {
    task.dense
        .tensors
        .iter()
        .map(|t| t.data.len())
        .sum::<usize>()
        + task
            .shards
            .iter()
            .map(|s| s.left.len() + s.right.len())
            .sum::<usize>()
}

/// The tensors of a task's message, by length in message order: each dense tensor, then per
/// sharded layer the rows of `U'` it holds and the rows of `V'`.
fn message_tensors(task: &TrainTask) -> Vec<usize> {
    let mut out: Vec<usize> = task.dense.tensors.iter().map(|t| t.data.len()).collect();
    for s in &task.shards {
        out.push(s.left.len());
        out.push(s.right.len());
    }
    out
}

/// The same tensors in the global layout (all `rank` rows of `U'` and of `V'`), whose symbol
/// frequencies QSGD-KLMS's prior uses.
fn global_tensors(task: &TrainTask) -> Vec<Range<usize>> {
    let (mut out, mut at) = dense_ranges(task);
    for s in &task.shards {
        let rank = s.rows().min(s.cols());
        for part in [rank * s.rows(), rank * s.cols()] {
            out.push(at..at + part);
            at += part;
        }
    }
    out
}

/// The dense tensors' ranges, which lead both layouts, and where they end.
fn dense_ranges(task: &TrainTask) -> (Vec<Range<usize>>, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    for t in &task.dense.tensors {
        out.push(at..at + t.data.len());
        at += t.data.len();
    }
    (out, at)
}

/// Values in the global layout: every dense tensor, then per sharded layer all `rank` rows of
/// `U'` and then of `V'`.
fn global_len(task: &TrainTask) -> usize {
    let dense: usize = task.dense.tensors.iter().map(|t| t.data.len()).sum();
    dense
        + task
            .shards
            .iter()
            .map(|s| s.rows().min(s.cols()) * (s.rows() + s.cols()))
            .sum::<usize>()
}

/// Where each value of a task's message sits in the global layout, in message order: a
/// singular vector keeps its position across rounds and clients, so its symbol counts do.
fn segments(task: &TrainTask) -> Vec<Range<usize>> {
    let (mut out, mut at) = dense_ranges(task);
    for s in &task.shards {
        let (rows, cols) = (s.rows(), s.cols());
        let rank = rows.min(cols);
        for &i in &s.indices {
            out.push(at + i * rows..at + (i + 1) * rows);
        }
        let right = at + rank * rows;
        for &i in &s.indices {
            out.push(right + i * cols..right + (i + 1) * cols);
        }
        at += rank * (rows + cols);
    }
    out
}
