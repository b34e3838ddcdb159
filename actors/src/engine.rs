//! The round engine: one driver, `ServerState::step`, for every schedule the server runs
//! ([`Schedule`]: synchronous rounds, over-committed rounds, buffered asynchronous aggregation).
//!
//! A schedule decides what is handed out and when the aggregate closes (it *collects*: a
//! round's selection answered or timed out, an over-committed round's first accepted updates,
//! a FedBuff buffer filled by clients handed work one at a time) and how an update is weighted
//! (one weight per update, or FedBuff's staleness weight s(τ)). Everything else is the driver's
//! and happens once for every schedule: the shared hand-out (`ServerState::prepare`: plan,
//! tasks, uplink settings), the one sorting of answers ([`crate::round::classify`]) and checks
//! ([`crate::round::check`]), the uplink memory, the fold through the [`Aggregator`] seam, the
//! evaluation, the one record builder ([`record`]), the checkpoint and the events.
//!
//! With `[privacy]` the run's aggregator is wrapped in DP-FedAvg's [`Private`] for every
//! schedule, and each record carries the ε of the releases so far: every fold of every schedule
//! goes through the one [`Aggregator`] seam (blocks for a round, weight-space changes for a
//! buffer or a private round, a sum for a secure round).
//!
//! What cannot combine is refused when the engine is built ([`Engine::new`]), before a client
//! trains, by the rules of [`crate::policies`]: for instance an aggregator that cannot fold a
//! buffer ([`Aggregator::folds_changes`]) or a two-phase selector
//! ([`fedshard_strategies::selection::ClientSelector::needs_update_norms`]) in async mode.

use crate::coordinator::Registry;
use crate::error::{Error, Result};
use crate::policies::{Checked, Policies};
use crate::privacy::{PrivacyRecord, PrivacySettings};
use crate::record::PhaseSeconds;
use crate::round::{
    Accepted, Buffered, ClientFailure, FoldContext, Folded, Private, Release, RoundSummary, Tally,
    Tasks, build_tasks, fold, fold_buffered, fold_changes, record, update_cosine,
};
use crate::schedule::{Schedule, Staleness};
use crate::secure::{SecureSettings, SessionOutcome, fold_sum};
use crate::server::{RuntimeConfig, ServerState};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::shard_plan::{Participant, ShardPlan, Sharding, plan_round};
use fedshard_protocol::task::{ClientId, Recipe, TrainTask};
use fedshard_protocol::uplink::Cohort;
use fedshard_protocol::uplink::UplinkSide;
use fedshard_protocol::width::WidthGroup;
use fedshard_strategies::aggregation::{Aggregator, SumWeight};
use fedshard_strategies::privacy::Accountant;
use fedshard_strategies::server_optimizer::{OptimizerState, ServerOptimizer};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// The schedule and the aggregation policy of a run, checked against each other.
#[derive(Debug, Clone)]
pub struct Engine {
    pub schedule: Schedule,
    pub aggregator: Arc<dyn Aggregator>,
    /// With `[privacy]`: its settings and the accountant of the run's releases.
    pub privacy: Option<(PrivacySettings, Accountant)>,
    /// With `[secure_aggregation]`: its settings and how each client premultiplies its change
    /// (from the aggregator).
    pub secure: Option<(SecureSettings, SumWeight)>,
}

impl Engine {
    /// Resolves the run's schedule and builds its aggregator (or takes `given`, a program's
    /// own, in place of the one `config` names), refusing a combination the schedule cannot
    /// run with [`Error::Unsupported`] ([`Policies::check`]).
    pub fn new(
        config: &RuntimeConfig,
        registry: &Registry,
        given: Option<Arc<dyn Aggregator>>,
    ) -> Result<Self> {
        let policies = Policies::of(config, registry.selector);
        let Checked {
            aggregator,
            privacy,
            secure,
        } = match given {
            Some(aggregator) => policies.check_with(aggregator)?,
            None => policies.check()?,
        };
        Ok(Self {
            schedule: Schedule::of(config),
            aggregator,
            privacy,
            secure,
        })
    }

    /// With `[privacy] target_epsilon`, the ε that release `release` would bring the run to,
    /// when it is past the target; `None` when the run may go on.
    pub fn privacy_budget_reached(&self, release: u64) -> Option<f64> {
        let (settings, accountant) = self.privacy.as_ref()?;
        let target = settings.target_epsilon?;
        let spent = accountant.epsilon(release, settings.delta).epsilon;
        (spent > target).then_some(spent)
    }
}

/// The server optimizer's step on a folded aggregate (docs/algorithms.md §10): `model`, the
/// fold's result, becomes `before + step(model − before)` in the dense weight space of the
/// global model, whatever produced the aggregate (blocks, changes, a buffer, a secure sum, a
/// private release: the noise is in the aggregate before the step, which is post-processing
/// and spends no privacy). An aggregate the optimizer's step makes non-finite is an error.
fn server_step(
    optimizer: ServerOptimizer,
    moments: &mut OptimizerState,
    version: u64,
    before: &ModelState,
    model: &mut ModelState,
) -> Result<()> {
    let fail = |source| Error::ServerOptimizer {
        name: optimizer.name(),
        source,
    };
    let start: Vec<&[f32]> = before.tensors.iter().map(|t| t.data.as_slice()).collect();
    let mut blocks: Vec<&mut [f32]> = model
        .tensors
        .iter_mut()
        .map(|t| t.data.as_mut_slice())
        .collect();
    optimizer
        .step(moments, version, &start, &mut blocks)
        .map_err(fail)?;
    if !model.is_finite() {
        return Err(fail(fedshard_strategies::StrategyError::invalid(
            "server optimizer",
            "its step made the model non-finite; lower server_optimizer.lr",
        )));
    }
    Ok(())
}

/// The updates a synchronous round collected, all trained from the round's model.
#[derive(Debug)]
pub(crate) struct RoundUpdates {
    pub plan: Option<Arc<ShardPlan>>,
    pub tasks: Tasks,
    /// p_k of each participant of the selection that uploaded.
    pub probabilities: BTreeMap<ClientId, f64>,
    pub failures: BTreeMap<ClientId, ClientFailure>,
    /// Ascending by client.
    pub accepted: Vec<Accepted>,
    /// Clients still training when an over-committed round closed.
    pub late: usize,
    /// A secure round: what its session came to (none of its updates is in `accepted`).
    pub secure: Option<Box<SessionOutcome>>,
}

/// What a schedule collected for one aggregate.
#[derive(Debug)]
pub(crate) enum Collected {
    Round(RoundUpdates),
    /// A full FedBuff buffer, in arrival order, and how its updates are weighted by staleness.
    Buffer {
        buffer: Vec<Buffered>,
        staleness: Staleness,
    },
}

/// What folding a collection did.
struct Aggregate {
    folded: Folded,
    /// τ of each buffered update.
    staleness: Vec<u64>,
    update_cosine: Option<f64>,
    /// What a private release spent.
    privacy: Option<PrivacyRecord>,
}

impl Collected {
    /// Each accepted update with the task it answers.
    fn answered(&self) -> Vec<(&Accepted, &TrainTask)> {
        match self {
            Collected::Round(r) => r
                .accepted
                .iter()
                .filter_map(|a| Some((a, r.tasks.tasks.get(&a.client)?)))
                .collect(),
            Collected::Buffer { buffer, .. } => {
                buffer.iter().map(|b| (&b.accepted, &b.task)).collect()
            }
        }
    }

    /// What a compressed uplink told the server, for its memory between versions.
    fn sides(&self) -> Vec<(&TrainTask, &UplinkSide)> {
        self.answered()
            .into_iter()
            .filter_map(|(a, task)| Some((task, a.update.side.as_ref()?)))
            .collect()
    }

    /// Folds the collection into `model`, version `version − 1`, through `aggregator` (the
    /// run's, or it wrapped in [`Private`]): a secure round's sum as a sum, a round's updates as
    /// blocks when the aggregator folds blocks and as weight-space changes when it must see each
    /// change, a buffer's as changes scaled by their staleness.
    fn fold(
        &self,
        model: &mut ModelState,
        (aggregator, groups): (&dyn Aggregator, &[WidthGroup]),
        registry: &Registry,
        (min_successful, version): (usize, u64),
    ) -> Result<Aggregate> {
        let unchanged = |folded| Aggregate {
            folded,
            staleness: vec![],
            update_cosine: None,
            privacy: None,
        };
        match self {
            Collected::Round(RoundUpdates {
                secure: Some(outcome),
                plan,
                tasks,
                ..
            }) => {
                let folded = match outcome.as_ref() {
                    SessionOutcome::Finished { sum, .. }
                        if sum.survivors.len() >= min_successful.max(1) =>
                    {
                        fold_sum(model, plan.as_deref(), &tasks.tasks, sum, aggregator)?
                    }
                    SessionOutcome::Finished { sum, .. } => Folded::Unchanged(format!(
                        "{} clients in the secure sum, the minimum is {}",
                        sum.survivors.len(),
                        min_successful.max(1)
                    )),
                    SessionOutcome::NotFinished(why) => Folded::Unchanged(why.clone()),
                };
                Ok(unchanged(folded))
            }
            Collected::Round(r) if aggregator.folds_blocks() => {
                let before = model.clone();
                let folded = fold(
                    model,
                    r.plan.as_deref(),
                    &r.accepted,
                    aggregator,
                    FoldContext {
                        registry,
                        probabilities: &r.probabilities,
                        failures: &r.failures,
                        min_successful,
                    },
                )?;
                // The cosine compares tensors value by value in the global model's layout,
                // which a width slice's update is not in: not computed for width strategies.
                let sliced = r.plan.as_ref().is_some_and(|p| p.width.is_some());
                let update_cosine = match folded {
                    Folded::Updated if !sliced => {
                        update_cosine(&before, model, &r.accepted, &r.tasks.tasks, registry)
                    }
                    _ => None,
                };
                Ok(Aggregate {
                    update_cosine,
                    ..unchanged(folded)
                })
            }
            Collected::Round(_) => {
                let updates: Vec<(&Accepted, &TrainTask, f64)> = self
                    .answered()
                    .into_iter()
                    .map(|(accepted, task)| (accepted, task, 1.0))
                    .collect();
                let folded = fold_changes(model, &updates, (aggregator, groups), registry)?;
                Ok(unchanged(folded))
            }
            Collected::Buffer { buffer, staleness } => {
                let (folded, staleness) = fold_buffered(
                    model,
                    buffer,
                    (aggregator, groups),
                    registry,
                    (*staleness, version - 1),
                )?;
                Ok(Aggregate {
                    staleness,
                    ..unchanged(folded)
                })
            }
        }
    }
}

impl ServerState {
    /// The one driver: collects the updates of model version `version` as the schedule says,
    /// then remembers what their uplinks told, folds them through the aggregator, evaluates,
    /// records, checkpoints and reports.
    pub(crate) async fn step(&mut self, version: u64) -> Result<()> {
        let started = Instant::now();
        let mut tally = Tally::default();
        let mut phases = PhaseSeconds::default();
        let schedule = self.engine.schedule;
        let collected = match (schedule, self.engine.secure) {
            (Schedule::Rounds { .. }, Some(secure)) => {
                let collect = self.collect_secure_round(version, secure, &mut tally, &mut phases);
                Collected::Round(collect.await?)
            }
            (Schedule::Rounds { over_commit }, None) => {
                let collect = self.collect_round(version, over_commit, &mut tally, &mut phases);
                Collected::Round(collect.await?)
            }
            (Schedule::Buffered(settings), _) => {
                let collect = self.collect_buffer(version, settings, &mut tally, &mut phases);
                Collected::Buffer {
                    buffer: collect.await?,
                    staleness: settings.staleness,
                }
            }
        };

        let aggregating = Instant::now();
        let config = self.fed.config.clone();
        self.fed
            .uplink
            .observe(config.compressor, &config.compression, &collected.sides())
            .map_err(|source| Error::UplinkState { version, source })?;
        let aggregator = Arc::clone(&self.engine.aggregator);
        // The registry travels to the fold and back, as the model does: a clone would copy every
        // registered client each round.
        let registry = Registry {
            clients: std::mem::take(&mut self.fed.registry.clients),
            ..self.fed.registry.clone()
        };
        let mut model = std::mem::take(&mut self.fed.model);
        let how = (config.min_successful, version);
        let (seed, min_successful) = (config.seed, config.min_successful);
        // A buffer's or a private round's width-sliced updates fold as changes at their slices'
        // coordinates of these widths (docs/algorithms.md §8.3).
        let groups: Vec<WidthGroup> = match &config.sharding {
            Some(Sharding::Width(policy)) => policy.groups.clone(),
            _ => Vec::new(),
        };
        let private = self.engine.privacy.as_ref().map(|(settings, accountant)| {
            (
                *settings,
                settings.clip_norm(&self.fed.history),
                accountant.epsilon(version, settings.delta),
            )
        });
        let optimizer = config
            .server_optimizer
            .map(|o| (o, std::mem::take(&mut self.fed.optimizer)));
        // The fold, the server optimizer's step and the cosine diagnostic run off the executor;
        // the collection travels with them and comes back for the record.
        let (model, aggregate, collected, registry, optimizer) =
            tokio::task::spawn_blocking(move || {
                let mut optimizer = optimizer;
                let before = optimizer.as_ref().map(|_| model.clone());
                let private = private.as_ref().map(|(settings, clip_norm, epsilon)| {
                    let release = Release {
                        settings,
                        clip_norm: *clip_norm,
                        seed,
                        release: version,
                        epsilon: *epsilon,
                        min_successful,
                    };
                    Private::new(aggregator.as_ref(), release)
                });
                let folding: &dyn Aggregator = match &private {
                    Some(private) => private,
                    None => aggregator.as_ref(),
                };
                let aggregate = collected
                    .fold(&mut model, (folding, &groups), &registry, how)
                    .map(|aggregate| Aggregate {
                        privacy: private.as_ref().map(Private::spent),
                        ..aggregate
                    })
                    .and_then(|aggregate| {
                        if let (Folded::Updated, Some((o, moments)), Some(before)) =
                            (&aggregate.folded, optimizer.as_mut(), &before)
                        {
                            server_step(*o, moments, version, before, &mut model)?;
                        }
                        Ok(aggregate)
                    });
                (model, aggregate, collected, registry, optimizer)
            })
            .await
            .map_err(|e| Error::panicked("aggregation", e))?;
        self.fed.model = model;
        self.fed.registry = registry;
        if let Some((_, moments)) = optimizer {
            self.fed.optimizer = moments;
        }
        let aggregate = aggregate?;
        // SCAFFOLD's server variate moves with the model it belongs to: by the accepted
        // clients' Δc_i when the aggregate was applied, not at all when the model stayed.
        if config.scaffold && aggregate.folded == Folded::Updated {
            let changes: Vec<&ModelState> = collected
                .answered()
                .into_iter()
                .filter_map(|(a, _)| a.update.control.as_ref())
                .collect();
            let population = self.fed.registry.clients.len();
            crate::variates::server_step(&mut self.fed.control, &changes, population);
        }
        match &aggregate.folded {
            Folded::Updated => {}
            Folded::Unchanged(why) => tracing::warn!(version, "global model unchanged: {why}"),
            Folded::NonFinite => tracing::warn!(
                version,
                "the aggregate of the accepted updates is not finite (diverging local training: lower the learning rate); global model unchanged"
            ),
        }
        phases.aggregate = aggregating.elapsed().as_secs_f64();

        let evaluator = Arc::clone(&self.fed.evaluator);
        let model = self.fed.model.clone();
        let evaluating = Instant::now();
        let evaluation = tokio::task::spawn_blocking(move || evaluator.evaluate(&model))
            .await
            .map_err(|e| Error::panicked("evaluation", e))??;
        phases.evaluate = evaluating.elapsed().as_secs_f64();
        let (accepted, plan, late, session): (Vec<&Accepted>, _, _, _) = match &collected {
            Collected::Round(r) => (
                r.accepted.iter().collect(),
                r.plan.as_deref(),
                r.late,
                r.secure.as_ref().and_then(|s| s.record()),
            ),
            Collected::Buffer { buffer, .. } => {
                (buffer.iter().map(|b| &b.accepted).collect(), None, 0, None)
            }
        };
        let record = record(RoundSummary {
            round: version,
            tally: &tally,
            accepted: &accepted,
            folded: &aggregate.folded,
            plan,
            evaluation,
            parameters: self.fed.model.num_parameters(),
            learning_rate: config.learning_rate(version),
            seconds: started.elapsed().as_secs_f64(),
            update_cosine: aggregate.update_cosine,
            late,
            staleness: aggregate.staleness,
            phases,
            privacy: aggregate.privacy,
            secure: session,
            byzantine: &self.fed.byzantine,
        });
        self.fed.history.push(record.clone());
        self.persist(&record).await?;
        if let Some(events) = &self.fed.events {
            let _ = events.send(record);
        }
        Ok(())
    }

    /// The hand-out every schedule shares: plans the shards of `participants` (their SVDs and
    /// draws, off the executor) and builds their tasks with model version `version`'s recipe
    /// and the compressor's settings for a cohort of `cohort` clients. `number` keys the draws
    /// and the tasks: the round, or in async mode the count of tasks handed out.
    pub(crate) async fn prepare(
        &self,
        participants: &[Participant],
        number: u64,
        version: u64,
        cohort: usize,
    ) -> Result<(Option<Arc<ShardPlan>>, Tasks)> {
        let config = &self.fed.config;
        let model = self.fed.model.clone();
        let policy = config.sharding.clone();
        let planned = participants.to_vec();
        let seed = config.seed;
        let plan = tokio::task::spawn_blocking(move || match &policy {
            Some(sharding) => plan_round(&model, sharding, &planned, seed, number)
                .map(|p| Some(Arc::new(p)))
                .map_err(Error::Plan),
            None => Ok(None),
        })
        .await
        .map_err(|e| Error::panicked("sharding plan", e))??;
        let recipe = Recipe {
            learning_rate: config.learning_rate(version),
            ..config.recipe.clone()
        };
        let mut tasks = build_tasks(
            &self.fed.model,
            config.sharding.as_ref(),
            plan.as_deref(),
            participants,
            (seed, number),
            &recipe,
        )?;
        let cohort = Cohort {
            population: self.fed.registry.clients.len(),
            participants: cohort,
            round: version,
        };
        let state = &self.fed.uplink;
        tasks.attach_uplinks(|task| {
            state.uplink(config.compressor, &config.compression, cohort, task)
        })?;
        if config.scaffold {
            tasks.attach_variates(&self.fed.control);
        }
        Ok((plan, tasks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Policy;
    use crate::round::tests::{recipe, registry};
    use crate::schedule::AsyncConfig;
    use fedshard_strategies::aggregation::AggregatorName;
    use fedshard_strategies::selection::SelectorName;
    use std::time::Duration;

    fn config(aggregator: AggregatorName, asynchronous: bool) -> RuntimeConfig {
        RuntimeConfig {
            seed: 1,
            rounds: 1,
            aggregator,
            sharding: None,
            recipe: recipe(),
            cosine_schedule: false,
            deadline: Duration::from_secs(1),
            min_successful: 1,
            compressor: Default::default(),
            compression: Default::default(),
            max_update_norm: None,
            privacy: None,
            secure: None,
            server_optimizer: None,
            scaffold: false,
            over_commit: None,
            asynchronous: asynchronous.then_some(AsyncConfig {
                concurrency: 2,
                buffer: 2,
                staleness: Staleness::Constant,
            }),
            clock: None,
        }
    }

    /// FedBuff folds a buffer with FedAvg's or uniform weights; an aggregator whose weights
    /// cannot scale changes, or a selector that needs every norm at once, is refused before
    /// any client trains, by name. Synchronous rounds take them all.
    #[test]
    fn async_mode_refuses_what_cannot_fold_a_buffer_when_the_engine_is_built() {
        let uniform = registry(&[(1, 1), (2, 1)]);
        for name in [AggregatorName::Fedavg, AggregatorName::Uniform] {
            let engine = Engine::new(&config(name, true), &uniform, None).unwrap();
            assert!(matches!(engine.schedule, Schedule::Buffered(_)));
        }
        for name in [AggregatorName::InverseProbability, AggregatorName::Fesc] {
            match Engine::new(&config(name, true), &uniform, None) {
                Err(Error::Unsupported {
                    policy, name: n, ..
                }) => {
                    assert_eq!((policy, n.as_str()), (Policy::Aggregator, name.as_str()));
                }
                other => panic!("{name}: {other:?}"),
            }
            assert!(Engine::new(&config(name, false), &uniform, None).is_ok());
        }
        let two_phase = Registry {
            selector: SelectorName::OptimalPartial,
            ..uniform
        };
        let refused =
            Engine::new(&config(AggregatorName::Fedavg, true), &two_phase, None).unwrap_err();
        assert!(
            matches!(
                &refused,
                Error::Unsupported {
                    policy: Policy::Selector,
                    ..
                }
            ),
            "{refused:?}"
        );
        assert!(refused.to_string().contains("optimal-partial"), "{refused}");
        let engine = Engine::new(&config(AggregatorName::Fedavg, false), &two_phase, None).unwrap();
        assert_eq!(engine.schedule, Schedule::Rounds { over_commit: None });
    }
}
