//! From loaded data to the objects that train and evaluate: each client's trainer (on a core,
//! or gathered into cohorts) and the server's evaluator, on the configured device.

use super::Trainers;
use super::cuda;
use super::loaded::Loaded;
use crate::config::{Device, Model, TrainingSection};
use fedshard_protocol::task::{ClientId, Evaluator, LocalTrainer};
use fedshard_training::models::net::Architecture;
use fedshard_training::train::fedpm::{FedpmClient, FedpmEvaluator};
use fedshard_training::train::gather::{Cohorts, Gathering, InCohorts};
use fedshard_training::train::neural::{
    Cpu, CpuTraining, Examples, LocalMethod, NeuralClient, NeuralEvaluator,
};
use fedshard_training::train::slots::OnACore;
use std::sync::Arc;
use std::time::Duration;

impl Loaded {
    /// The server's evaluator of `model` on the held-out set.
    pub(super) fn into_evaluator(
        self,
        model: &Model,
        seed: u64,
    ) -> anyhow::Result<Arc<dyn Evaluator>> {
        Ok(match (self, model) {
            (Loaded::Table { test, .. }, Model::Masked(network)) => {
                Arc::new(FedpmEvaluator::<Cpu> {
                    network: network.clone(),
                    examples: Box::new(test),
                    seed,
                    device: Default::default(),
                    batch_size: EVAL_BATCH,
                })
            }
            (Loaded::Table { test, .. }, Model::Network { .. }) => {
                neural_evaluator(model, Box::new(test))?
            }
            (Loaded::Text { test, .. }, Model::Network { .. }) => {
                neural_evaluator(model, Box::new(test))?
            }
            (Loaded::Linear { test, .. }, Model::Ridge { .. }) => Arc::new(test),
            (_, model) => return Err(mismatch(model)),
        })
    }

    /// The trainers of `model` for the clients `ids` (each below `self.sizes().len()`), each
    /// scheduled on the core pool: alone ([`OnACore`]) or, for neural clients under
    /// `gatherer`, in cohorts that take the pool's cores themselves.
    pub(super) fn trainers(
        &self,
        model: &Model,
        ids: &[ClientId],
        gatherer: &Gatherer,
    ) -> anyhow::Result<Trainers> {
        let mut trainers = Trainers::new();
        let on_a_core = |trainer: Arc<dyn LocalTrainer>| -> Arc<dyn LocalTrainer> {
            Arc::new(OnACore(trainer))
        };
        for &id in ids {
            let c = id as usize;
            let trainer: Arc<dyn LocalTrainer> = match (self, model) {
                (Loaded::Table { train, parts, .. }, Model::Masked(network)) => {
                    on_a_core(Arc::new(FedpmClient::<CpuTraining> {
                        network: network.clone(),
                        examples: Box::new(train.subset(&parts[c])?),
                        device: Default::default(),
                    }))
                }
                (Loaded::Table { train, parts, .. }, Model::Network { .. }) => {
                    neural_trainer(model, Box::new(train.subset(&parts[c])?), gatherer)?
                }
                (Loaded::Text { train, .. }, Model::Network { .. }) => {
                    neural_trainer(model, Box::new(train[c].clone()), gatherer)?
                }
                (Loaded::Linear { clients, .. }, Model::Ridge { .. }) => {
                    on_a_core(Arc::new(clients[c].clone()))
                }
                (_, model) => return Err(mismatch(model)),
            };
            trainers.insert(id, trainer);
        }
        Ok(trainers)
    }
}

/// A model that does not read the loaded data, which [`Config::validate`] rules out.
pub(super) fn mismatch(model: &Model) -> anyhow::Error {
    anyhow::anyhow!("field `model`: {model:?} does not read this dataset")
}

/// Where a process's neural clients gather into cohorts (`[training] cohorts`): one queue
/// for all the clients a process hosts, on the configured device.
pub(super) enum Gatherer {
    /// Each client trains alone on a core.
    Off,
    Cpu(Arc<Cohorts<CpuTraining>>),
    Cuda(cuda::Queue),
}

impl Gatherer {
    pub(super) fn of(t: &TrainingSection) -> anyhow::Result<Self> {
        if !t.cohorts {
            return Ok(Gatherer::Off);
        }
        let gathering = |whole_queue| Gathering {
            max_clients: t.cohort_size,
            window: COHORT_WINDOW,
            longest: COHORT_LONGEST,
            whole_queue,
        };
        Ok(match t.device {
            Device::Cpu => Gatherer::Cpu(Cohorts::new(gathering(false))),
            Device::Cuda => Gatherer::Cuda(cuda::queue(gathering(true))?),
        })
    }
}

/// The trainers of neural clients of `architecture`, one per example set, built as a
/// federation builds them under `training` (its device, cohorts and cohort size): for
/// measuring a round's local training without a server (`fedshard bench round`).
pub fn neural_clients(
    training: &TrainingSection,
    architecture: &Architecture,
    examples: Vec<Box<dyn Examples>>,
) -> anyhow::Result<Vec<Arc<dyn LocalTrainer>>> {
    let gatherer = Gatherer::of(training)?;
    let model = Model::Network {
        architecture: architecture.clone(),
        device: training.device,
        method: LocalMethod::Sgd,
    };
    examples
        .into_iter()
        .map(|e| neural_trainer(&model, e, &gatherer))
        .collect()
}

/// How long a round's cohort waits after the last task of its kind was queued before it
/// trains: the server sends a round's tasks at once, and their threads queue within
/// microseconds of each other for a small model, one after another for a large one (each
/// copies its task, 45 MB for ResNet-18, before it queues: an H200's ResNet-18 round, with a
/// fixed 2 ms from the first task, trained its ten clients as several small cohorts); a
/// round's training takes tens of milliseconds at least.
const COHORT_WINDOW: Duration = Duration::from_millis(2);

/// The longest the first task of a round waits for the others, however they trickle in.
const COHORT_LONGEST: Duration = Duration::from_millis(100);

fn neural_trainer(
    model: &Model,
    examples: Box<dyn Examples>,
    gatherer: &Gatherer,
) -> anyhow::Result<Arc<dyn LocalTrainer>> {
    let &Model::Network {
        ref architecture,
        device,
        method,
    } = model
    else {
        return Err(mismatch(model));
    };
    Ok(match device {
        Device::Cpu => {
            let client = Arc::new(NeuralClient::<CpuTraining> {
                architecture: architecture.clone(),
                examples,
                device: Default::default(),
                method,
            });
            match gatherer {
                Gatherer::Cpu(cohorts) => Arc::new(InCohorts {
                    client,
                    cohorts: Arc::clone(cohorts),
                }),
                _ => Arc::new(OnACore(client)),
            }
        }
        Device::Cuda => cuda::trainer(architecture, examples, method, gatherer)?,
    })
}

/// Rows per evaluation forward pass: small enough that a test set of a few hundred rows (the
/// digits' 359) makes several batches for the evaluation's threads to share.
pub(super) const EVAL_BATCH: usize = 64;

/// The server's evaluator of `net` on the held-out `examples`.
fn neural_evaluator(
    model: &Model,
    examples: Box<dyn Examples>,
) -> anyhow::Result<Arc<dyn Evaluator>> {
    let Model::Network {
        architecture,
        device,
        ..
    } = model
    else {
        return Err(mismatch(model));
    };
    Ok(match device {
        Device::Cpu => Arc::new(NeuralEvaluator::<Cpu> {
            architecture: architecture.clone(),
            examples,
            device: Default::default(),
            batch_size: EVAL_BATCH,
        }),
        Device::Cuda => cuda::evaluator(architecture, examples)?,
    })
}
