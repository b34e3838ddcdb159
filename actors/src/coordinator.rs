//! The coordinator: who the clients are, how they cluster by keep ratio, and who takes part in
//! each round. The logic is in [`Registry`]; [`Coordinator`] is the actor around it.

use crate::error::Error;
use fedshard_protocol::shard_plan::Participant;
use fedshard_protocol::task::ClientId;
use fedshard_strategies::rng::{Purpose, stream};
use fedshard_strategies::selection::{ClientStats, SelectorName};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What the coordinator knows of a client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientRecord {
    pub id: ClientId,
    /// The fraction of the model this client can afford to train, r ∈ (0, 1].
    pub keep_ratio: f64,
    /// D_c, its number of training samples.
    pub samples: u64,
    /// Rounds in which it failed, over the whole run.
    pub failures: u64,
}

/// The participants of one round with their cluster keep ratios and selection probabilities.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundSelection {
    /// (client, keep ratio of its cluster), ascending by client.
    pub participants: Vec<(ClientId, f64)>,
    /// p_k of each participant, in the same order.
    pub probabilities: Vec<f64>,
}

impl RoundSelection {
    /// The participants as the shard plan takes them.
    pub fn shard_participants(&self) -> Vec<Participant> {
        self.participants
            .iter()
            .map(|&(client, keep_ratio)| Participant { client, keep_ratio })
            .collect()
    }
}

/// The client registry and the selection policy, as plain data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Registry {
    pub clients: BTreeMap<ClientId, ClientRecord>,
    pub selector: SelectorName,
    /// Expected number of full-model uploads per round, m.
    pub budget: f64,
    /// `None`: one cluster per distinct keep ratio; `Some(k)`: at most k buckets of nearby ratios.
    pub max_clusters: Option<usize>,
}

/// The keep ratio of each cluster, looked up from a client's own ratio. With `max_clusters = k`
/// and more than k distinct ratios, the sorted distinct ratios are cut at their k − 1 widest
/// gaps, and a bucket's ratio is its smallest member's, so no client is asked for more than it
/// can afford.
#[derive(Debug, Clone, PartialEq)]
pub struct Clusters {
    /// The registry's distinct keep ratios, ascending.
    distinct: Vec<f64>,
    /// The keep ratio of the cluster of each of `distinct`.
    representative: Vec<f64>,
}

impl Clusters {
    /// The keep ratio of the cluster of a client of the registry whose own ratio is
    /// `keep_ratio`.
    pub fn of(&self, keep_ratio: f64) -> f64 {
        let k = self.distinct.partition_point(|r| *r < keep_ratio);
        self.representative[k]
    }
}

/// What every selection reads of every registered client, gathered once: the clusters of their
/// keep ratios and each client's [`ClientStats`], in id order. Both depend only on who is
/// registered and their keep ratios and sample counts, which a run does not change (only the
/// failure counts move), so the coordinator builds its index when it starts and a round of
/// 10 000 clients out of a million registered ones neither sorts nor copies the million.
#[derive(Debug, Clone, PartialEq)]
pub struct Index {
    clusters: Clusters,
    stats: Vec<ClientStats>,
}

impl Index {
    pub fn of(registry: &Registry) -> Index {
        Index {
            clusters: registry.clusters(),
            stats: registry.stats(None),
        }
    }
}

impl Registry {
    /// The clusters of the registered clients' keep ratios (computed afresh: clients join and
    /// leave). A lookup, not a map of every client: a round of 10 000 clients out of a million
    /// registered ones looks up only its own.
    pub fn clusters(&self) -> Clusters {
        let mut distinct: Vec<f64> = self.clients.values().map(|c| c.keep_ratio).collect();
        distinct.sort_by(f64::total_cmp);
        distinct.dedup();
        let representative = cluster_representatives(&distinct, self.max_clusters);
        Clusters {
            distinct,
            representative,
        }
    }

    fn stats(&self, norms: Option<&BTreeMap<ClientId, f64>>) -> Vec<ClientStats> {
        self.clients
            .values()
            .map(|c| ClientStats {
                id: c.id,
                samples: c.samples as f64,
                keep_ratio: c.keep_ratio,
                update_norm: norms.and_then(|n| n.get(&c.id).copied()),
            })
            .collect()
    }

    /// Whether the selector needs update norms, i.e. a two-phase round.
    pub fn two_phase(&self) -> bool {
        self.selector.build().needs_update_norms()
    }

    /// Selects the round's participants with the stream (seed, round, 0, Selection). For a
    /// two-phase selector, call first without norms (every live client trains and reports its
    /// norm), then with the reported norms of the clients that succeeded.
    pub fn select(
        &self,
        seed: u64,
        round: u64,
        norms: Option<&BTreeMap<ClientId, f64>>,
    ) -> Result<RoundSelection, Error> {
        self.select_with_budget(seed, round, norms, self.budget)
    }

    /// [`Registry::select`] with another budget than the registry's m: over-commitment selects
    /// with ⌈over_commit · m⌉ and keeps the first updates (see [`over_committed`]).
    pub fn select_with_budget(
        &self,
        seed: u64,
        round: u64,
        norms: Option<&BTreeMap<ClientId, f64>>,
        budget: f64,
    ) -> Result<RoundSelection, Error> {
        self.select_indexed(&Index::of(self), seed, round, norms, budget)
    }

    /// [`Registry::select_with_budget`] with what it reads of every client already gathered in
    /// `index` (built from this registry): the same draws, without a pass over the registry.
    pub fn select_indexed(
        &self,
        index: &Index,
        seed: u64,
        round: u64,
        norms: Option<&BTreeMap<ClientId, f64>>,
        budget: f64,
    ) -> Result<RoundSelection, Error> {
        let selector = self.selector.build();
        let clusters = &index.clusters;
        let mut stats = std::borrow::Cow::Borrowed(index.stats.as_slice());
        if selector.needs_update_norms() {
            match norms {
                None => {
                    let participants = stats
                        .iter()
                        .map(|s| (s.id, clusters.of(s.keep_ratio)))
                        .collect();
                    return Ok(RoundSelection {
                        participants,
                        probabilities: vec![1.0; stats.len()],
                    });
                }
                Some(n) => {
                    let mut reported = self.stats(Some(n));
                    reported.retain(|s| s.update_norm.is_some());
                    stats = std::borrow::Cow::Owned(reported);
                }
            }
        }
        if stats.is_empty() {
            return Err(Error::NoLiveClient);
        }
        let mut rng = stream(seed, round, 0, Purpose::Selection);
        let selection = selector
            .select(&stats, budget, &mut rng)
            .map_err(|source| Error::Selector {
                selector: self.selector,
                source,
            })?;
        let participants = selection
            .chosen
            .iter()
            .map(|&k| (stats[k].id, clusters.of(stats[k].keep_ratio)))
            .collect();
        let probabilities = selection
            .chosen
            .iter()
            .map(|&k| selection.probabilities[k])
            .collect();
        Ok(RoundSelection {
            participants,
            probabilities,
        })
    }
}

/// Over-commitment of a round with budget m (`[federation] over_commit` = c ≥ 1): the clients
/// asked, ⌈c · m⌉, and the accepted updates that close the round, max(1, ⌊m⌋), which is what a
/// uniform selection of budget m asks for. For a two-phase selector the first number is the
/// count of phase-one answers (trained, norm reported) that closes phase one instead.
pub fn over_committed(budget: f64, over_commit: f64) -> (f64, usize) {
    let target = (budget.floor() as usize).max(1);
    let asked = (over_commit * budget).ceil().max(target as f64);
    (asked, target)
}

/// The clients whose updates a one-phase round averages, out of the `asked`: all of them, or
/// with over-commitment ([`over_committed`]) the `target` that close the round. SGLD scales each
/// client's noise for this count (`σ² = 2/(η κ² C)`, §4.9): scaled for the ⌈c · m⌉ asked, the
/// mean of the first m updates would move the chain by the right drift but c times the
/// Langevin noise variance.
pub fn averaged(asked: usize, over: Option<(f64, usize)>) -> usize {
    over.map_or(asked, |(_, target)| target.min(asked))
}

/// For each sorted distinct ratio, its cluster's representative (smallest member).
fn cluster_representatives(distinct: &[f64], max_clusters: Option<usize>) -> Vec<f64> {
    let k = max_clusters.unwrap_or(usize::MAX).max(1);
    if distinct.len() <= k {
        return distinct.to_vec();
    }
    let mut gaps: Vec<usize> = (1..distinct.len()).collect();
    gaps.sort_by(|&a, &b| {
        (distinct[b] - distinct[b - 1])
            .total_cmp(&(distinct[a] - distinct[a - 1]))
            .then(a.cmp(&b))
    });
    let mut cuts: Vec<usize> = gaps.into_iter().take(k - 1).collect();
    cuts.sort_unstable();
    let mut representative = Vec::with_capacity(distinct.len());
    let mut start = 0;
    for end in cuts.into_iter().chain([distinct.len()]) {
        representative.extend(std::iter::repeat_n(distinct[start], end - start));
        start = end;
    }
    representative
}

/// Messages the coordinator answers.
pub enum CoordinatorMsg {
    /// Selects the participants of a round (see [`Registry::select`]).
    Select {
        seed: u64,
        round: u64,
        norms: Option<BTreeMap<ClientId, f64>>,
        /// Overrides the registry's budget (over-commitment); `None` keeps it.
        budget: Option<f64>,
        /// The selection, or the [`Error`] that prevented it.
        reply: RpcReplyPort<Result<RoundSelection, Error>>,
    },
    /// Counts a failed round of a client.
    CountFailure { client: ClientId },
    /// The registry as it is now, for checkpoints.
    Snapshot { reply: RpcReplyPort<Registry> },
}

/// The coordinator actor.
pub struct Coordinator;

impl Actor for Coordinator {
    type Msg = CoordinatorMsg;
    /// The registry and its [`Index`]; only failure counts change after the start, and the
    /// index reads none.
    type State = (Registry, Index);
    type Arguments = Registry;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        registry: Registry,
    ) -> Result<Self::State, ActorProcessingErr> {
        let index = Index::of(&registry);
        Ok((registry, index))
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        (registry, index): &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            CoordinatorMsg::Select {
                seed,
                round,
                norms,
                budget,
                reply,
            } => {
                let budget = budget.unwrap_or(registry.budget);
                let selection = registry.select_indexed(index, seed, round, norms.as_ref(), budget);
                let _ = reply.send(selection);
            }
            CoordinatorMsg::CountFailure { client } => {
                if let Some(c) = registry.clients.get_mut(&client) {
                    c.failures += 1;
                }
            }
            CoordinatorMsg::Snapshot { reply } => {
                let _ = reply.send(registry.clone());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry(ratios: &[f64], max_clusters: Option<usize>) -> Registry {
        Registry {
            clients: ratios
                .iter()
                .enumerate()
                .map(|(i, &r)| {
                    (
                        i as u64,
                        ClientRecord {
                            id: i as u64,
                            keep_ratio: r,
                            samples: 10,
                            failures: 0,
                        },
                    )
                })
                .collect(),
            selector: SelectorName::Uniform,
            budget: 2.0,
            max_clusters,
        }
    }

    /// The keep ratio of each client's cluster, in client order.
    fn cluster_of_each(r: &Registry) -> Vec<f64> {
        let clusters = r.clusters();
        r.clients
            .values()
            .map(|c| clusters.of(c.keep_ratio))
            .collect()
    }

    #[test]
    fn exact_clusters_keep_every_ratio() {
        let r = registry(&[0.2, 0.4, 0.2, 0.4], None);
        assert_eq!(cluster_of_each(&r), vec![0.2, 0.4, 0.2, 0.4]);
    }

    #[test]
    fn buckets_cut_at_the_widest_gaps_and_take_the_smallest_ratio() {
        let r = registry(&[0.1, 0.12, 0.5, 0.55, 0.9], Some(3));
        assert_eq!(cluster_of_each(&r), vec![0.1, 0.1, 0.5, 0.5, 0.9]);
        let one = registry(&[0.1, 0.5, 0.9], Some(1));
        assert_eq!(cluster_of_each(&one), vec![0.1; 3]);
    }

    #[test]
    fn over_commitment_asks_for_more_and_keeps_the_budget() {
        assert_eq!(over_committed(10.0, 1.3), (13.0, 10));
        assert_eq!(over_committed(10.0, 1.0), (10.0, 10));
        assert_eq!(over_committed(2.5, 1.5), (4.0, 2));
        assert_eq!(over_committed(0.5, 1.2), (1.0, 1));
        // SGLD's cohort is the 10 the round keeps, not the 13 it asks.
        assert_eq!(averaged(13, Some(over_committed(10.0, 1.3))), 10);
        assert_eq!(averaged(13, None), 13);
        // A population smaller than the target: every client asked is averaged.
        assert_eq!(averaged(4, Some(over_committed(10.0, 1.3))), 4);
        let r = registry(&[0.5; 20], None);
        let s = r.select_with_budget(3, 1, None, 13.0).unwrap();
        assert_eq!(s.participants.len(), 13);
        assert!(s.probabilities.iter().all(|&p| p == 13.0 / 20.0));
    }

    /// The coordinator selects from the index it built when it started: failure counts move
    /// after that and change nothing, and its draws are the registry's own (uniform and
    /// Poisson, several rounds, mixed keep ratios in three clusters).
    #[test]
    fn an_index_built_at_the_start_draws_what_the_registry_draws() {
        for selector in [SelectorName::Uniform, SelectorName::Poisson] {
            let mut r = registry(&[0.2, 0.4, 0.2, 0.4, 1.0, 0.5, 0.2, 1.0, 0.3, 0.9], Some(3));
            r.selector = selector;
            r.budget = 4.0;
            let index = Index::of(&r);
            for c in r.clients.values_mut() {
                c.failures += c.id;
            }
            for round in 1..=5 {
                let fresh = r.select(7, round, None).unwrap();
                assert_eq!(
                    r.select_indexed(&index, 7, round, None, 4.0).unwrap(),
                    fresh,
                    "{selector:?}, round {round}"
                );
                assert!(!fresh.participants.is_empty() || selector == SelectorName::Poisson);
            }
        }
    }

    #[test]
    fn selection_is_deterministic_under_a_seed() {
        let r = registry(&[0.5; 6], None);
        let a = r.select(3, 1, None).unwrap();
        assert_eq!(a, r.select(3, 1, None).unwrap());
        assert_eq!(a.participants.len(), 2);
        assert_ne!(
            a,
            r.select(3, 2, None).unwrap(),
            "another round, another draw"
        );
    }

    /// Over-commitment with the two-phase `optimal-partial` selector closes phase one at the
    /// first ⌈c · m⌉ norms, and its probabilities p_k are those of a selection among the clients
    /// that answered: they are not corrected for the clients cut off, whose inclusion
    /// probability is 0, not p_k. This measures the resulting bias of the Horvitz–Thompson
    /// estimate `Σ_{k∈S} D_k x_k / (p_k Σ_all D)` of the population mean `Σ D_k x_k / Σ D_k`
    /// over 4000 rounds: 20 clients, the 8 slow ones (cut off every round, as stragglers are)
    /// ask for x = 3, the fast ones for x = 1, m = 6 and c = 2 (phase one closes at 12).
    #[test]
    fn over_committed_optimal_partial_is_unbiased_only_without_a_cut_off() {
        let n = 20;
        let mut r = registry(&[1.0; 20], None);
        r.selector = SelectorName::OptimalPartial;
        r.budget = 6.0;
        for (id, c) in r.clients.iter_mut() {
            c.samples = 10 + id;
        }
        let x = |id: ClientId| if id >= 12 { 3.0 } else { 1.0 };
        let d = |id: ClientId| (10 + id) as f64;
        let total: f64 = (0..n).map(d).sum();
        let truth: f64 = (0..n).map(|k| d(k) * x(k)).sum::<f64>() / total;
        let (asked, _) = over_committed(r.budget, 2.0);
        let answered: Vec<ClientId> = (0..asked as u64).collect();
        let estimate = |round: u64, pool: &[ClientId]| -> f64 {
            let norms: BTreeMap<ClientId, f64> = pool.iter().map(|&k| (k, x(k))).collect();
            let s = r.select(11, round, Some(&norms)).unwrap();
            s.participants
                .iter()
                .zip(&s.probabilities)
                .map(|(&(k, _), p)| d(k) * x(k) / (p * total))
                .sum()
        };
        let rounds = 4000;
        let all: Vec<ClientId> = (0..n).collect();
        let mean = |pool: &[ClientId]| -> (f64, f64) {
            let e: Vec<f64> = (1..=rounds).map(|t| estimate(t, pool)).collect();
            let m = e.iter().sum::<f64>() / rounds as f64;
            let var = e.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (rounds - 1) as f64;
            (m, (var / rounds as f64).sqrt())
        };
        let (full, full_se) = mean(&all);
        let (cut, cut_se) = mean(&answered);
        // With the cut, E = Σ_{answered} D x / Σ_all D: the slow clients' share is missing.
        let predicted: f64 = answered.iter().map(|&k| d(k) * x(k)).sum::<f64>() / total;
        let answered_d: f64 = answered.iter().map(|&k| d(k)).sum();
        // Re-weighting by Σ_all D / Σ_answered D (a ratio correction) gives the answered mean.
        let ratio = cut * total / answered_d;
        eprintln!(
            "optimal-partial + over_commit 2 (m = 6, 12 of 20 answer): truth {truth:.4}; \
             no cut-off {full:.4} ± {full_se:.4} (bias {:+.4}); cut-off {cut:.4} ± {cut_se:.4} \
             (bias {:+.4}, predicted {:+.4}); ratio-corrected {ratio:.4} (bias {:+.4})",
            full - truth,
            cut - truth,
            predicted - truth,
            ratio - truth
        );
        assert!((full - truth).abs() < 4.0 * full_se, "{full} vs {truth}");
        assert!(
            (cut - predicted).abs() < 4.0 * cut_se,
            "{cut} vs {predicted}"
        );
        assert!(truth - cut > 0.5, "the cut-off biases the estimate down");
    }
}
