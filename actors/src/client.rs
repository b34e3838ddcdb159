//! The client actor: lent a client's state by its [`ClientHost`](crate::host::ClientHost) for
//! one request, it trains off the async executor with the client's [`LocalTrainer`] (its data
//! and model code), answers, and goes back to the host for the next client's request. A
//! trainer error is reported as a failure; a panic is reported and then fails the actor, so its
//! supervisor (the host) learns of it.

use crate::host::HostMsg;
use crate::secure::{SecureClient, SecureStep};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::payload::{UpdateEnvelope, encode};
use fedshard_protocol::task::{ClientId, LocalTrainer, TrainOutput, TrainTask, Work};
use ractor::rpc::CallResult;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Instant;

/// What a client answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ClientReply {
    /// The encoded update.
    Update(UpdateEnvelope),
    /// Phase one of a two-phase round: trained, update kept until asked for.
    Trained { client: ClientId, update_norm: f64 },
    /// A secure round: trained, update kept for the round's secure aggregation (nothing of it
    /// is told, not even its norm).
    Ready { client: ClientId },
    /// A secure round: the client's message of the session's current exchange.
    Secure {
        client: ClientId,
        message: Box<fedshard_secagg::ClientMessage>,
    },
    /// Training failed; the text says why.
    Failed {
        client: ClientId,
        reason: String,
        panicked: bool,
    },
}

/// What a client does with its update once trained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AfterTraining {
    /// Answers with it.
    Upload,
    /// Keeps it for a later [`ClientMsg::Upload`] and answers with its norm (phase one of a
    /// two-phase round).
    Keep,
    /// Keeps it, with its task, for the round's secure aggregation ([`ClientMsg::Secure`]).
    Secure,
}

pub enum ClientMsg {
    /// Train on the task, then do `then` with the update.
    Train {
        task: Box<TrainTask>,
        then: AfterTraining,
        reply: RpcReplyPort<ClientReply>,
    },
    /// Send the update kept from phase one of `round`.
    Upload {
        round: u64,
        reply: RpcReplyPort<ClientReply>,
    },
    /// Take the next step of round `round`'s secure aggregation.
    Secure {
        round: u64,
        step: Box<SecureStep>,
        reply: RpcReplyPort<ClientReply>,
    },
}

/// What a client keeps between two requests of one round.
pub enum Kept {
    /// The update of phase one of a two-phase round, until the server asks for it.
    Update(Box<UpdateEnvelope>),
    /// Its side of the round's secure aggregation.
    Secure(Box<SecureClient>),
}

pub struct ClientActor;

/// What a client actor works with for one request: the client's lasting state, lent by its
/// host.
pub struct ClientArgs {
    pub id: ClientId,
    pub trainer: Arc<dyn LocalTrainer>,
    /// What the client kept from an earlier request of the round, for an `Upload` or a
    /// `Secure` step.
    pub kept: Option<Kept>,
    /// Under SCAFFOLD, for a training: the client's control variate `c_i` from before the
    /// task's round (`None`: zero, or no SCAFFOLD), lent by the host
    /// ([`crate::variates::ClientVariates::lend`]).
    pub variate: Option<ModelState>,
}

/// One request for a client actor: the client it works as, and the work.
pub struct Job {
    pub args: ClientArgs,
    pub work: ClientMsg,
}

/// Under SCAFFOLD, the client's variate after training, `c_i⁺ = c_i + Δc_i`; `None` without
/// variates. A trainer that was sent variates and returned no `Δc_i` fails the client.
fn next_variate(task: &TrainTask, output: &TrainOutput) -> Result<Option<ModelState>, String> {
    let Some(variates) = &task.variates else {
        return Ok(None);
    };
    let change = output
        .control
        .as_ref()
        .ok_or("the trainer was sent SCAFFOLD's variates and returned no Δc_i")?;
    Ok(Some(crate::variates::updated(
        variates.client.as_ref(),
        change,
    )))
}

/// ‖output − task‖₂ over every trained value.
fn update_norm(task: &TrainTask, output: &TrainOutput) -> f64 {
    let mut sum = 0.0f64;
    for (a, b) in output.dense.tensors.iter().zip(&task.dense.tensors) {
        sum += a
            .data
            .iter()
            .zip(&b.data)
            .map(|(x, y)| f64::from(x - y).powi(2))
            .sum::<f64>();
    }
    for (a, b) in output.shards.iter().zip(&task.shards) {
        let pairs = a
            .left
            .iter()
            .zip(&b.left)
            .chain(a.right.iter().zip(&b.right));
        sum += pairs.map(|(x, y)| f64::from(x - y).powi(2)).sum::<f64>();
    }
    sum.sqrt()
}

/// Why local work returned no result.
enum Lost {
    /// It panicked, with this text.
    Panicked(String),
    /// The trainer dropped it without running it (a runtime shutting down drops the work
    /// queued for its blocking threads).
    Dropped,
}

impl Lost {
    /// What the client answers.
    fn reason(self) -> String {
        match self {
            Lost::Panicked(text) => text,
            Lost::Dropped => "the trainer dropped the client's work unrun".into(),
        }
    }
}

/// Runs `work` where `trainer` starts it ([`LocalTrainer::start`]: on the core pool, or on a
/// blocking thread of its own) and waits for its result off the executor.
async fn local_work<R: Send + 'static>(
    trainer: &dyn LocalTrainer,
    work: impl FnOnce() -> R + Send + 'static,
) -> Result<R, Lost> {
    let (sender, result) = tokio::sync::oneshot::channel();
    let work: Work = Box::new(move || {
        // Caught here, wherever it runs: a panic on the core pool would abort the process.
        let _ = sender.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)));
    });
    if let Some(work) = trainer.start(work) {
        drop(tokio::task::spawn_blocking(work));
    }
    match result.await {
        Ok(Ok(result)) => Ok(result),
        Ok(Err(panic)) => Err(Lost::Panicked(panic_text(panic))),
        Err(_) => Err(Lost::Dropped),
    }
}

fn panic_text(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

impl Actor for ClientActor {
    type Msg = Job;
    /// The host that lends the actor its clients, keeps what they keep between requests and
    /// takes the actor back when a request is done.
    type State = ActorRef<HostMsg>;
    type Arguments = ActorRef<HostMsg>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Job>,
        host: ActorRef<HostMsg>,
    ) -> Result<ActorRef<HostMsg>, ActorProcessingErr> {
        Ok(host)
    }

    /// Does one request as the job's client, then tells the host it is free for the next.
    async fn handle(
        &self,
        myself: ActorRef<Job>,
        Job { args, work }: Job,
        host: &mut ActorRef<HostMsg>,
    ) -> Result<(), ActorProcessingErr> {
        serve(args, work, host).await?;
        host.send_message(HostMsg::Done(myself))?;
        Ok(())
    }
}

/// Does `message` as the client of `state`. An `Err` (a panic in local training, already
/// answered as `Failed { panicked: true }`, or a host that stopped) fails the actor, so that its
/// supervisor, the host, learns of it.
async fn serve(
    mut state: ClientArgs,
    message: ClientMsg,
    host: &ActorRef<HostMsg>,
) -> Result<(), ActorProcessingErr> {
    match message {
        ClientMsg::Train {
            mut task,
            then,
            reply,
        } => {
            if let Some(variates) = task.variates.as_mut() {
                variates.client = state.variate.take();
            }
            let trainer = Arc::clone(&state.trainer);
            let leaves = trainer.drops_out(&task);
            let started = Instant::now();
            let joined = local_work(&*state.trainer, move || {
                // The encoding (for KLMS as costly as training) is part of the client's
                // local work: it runs on the trainer's core and inside its slow-down.
                let mut encoded = None;
                let output = trainer
                    .train_then(&task, &mut |output| {
                        let norm = update_norm(&task, output);
                        let payload = encode(&task, output)
                            .map_err(|e| format!("encoding the update: {e}"))?;
                        encoded = Some((payload, norm));
                        Ok(())
                    })
                    .map_err(|e| e.to_string())?;
                let (payload, norm) =
                    encoded.ok_or("the trainer returned without encoding the update")?;
                let variate = next_variate(&task, &output)?;
                // The task comes back: a secure round keeps it with the update.
                Ok((payload, output.loss, norm, task, variate))
            })
            .await;
            let id = state.id;
            match joined {
                Ok(Ok((payload, loss, update_norm, task, variate))) => {
                    let envelope = UpdateEnvelope {
                        client: id,
                        round: task.round,
                        loss,
                        update_norm,
                        train_seconds: started.elapsed().as_secs_f64(),
                        payload,
                    };
                    // A kept update goes to the host before the answer, so the host holds it
                    // by the time the server can ask for it; so does a new variate, so that
                    // the client's next task finds it.
                    let envelope = Box::new(envelope);
                    if let (Some(variate), false) = (variate, leaves) {
                        let round = task.round;
                        let kept = host
                            .call(
                                |stored| HostMsg::Variate {
                                    client: id,
                                    round,
                                    variate,
                                    stored,
                                },
                                None,
                            )
                            .await;
                        let why = match kept {
                            Ok(CallResult::Success(Ok(()))) => None,
                            Ok(CallResult::Success(Err(e))) => Some(e),
                            _ => Some("the host did not answer".to_string()),
                        };
                        if let Some(why) = why {
                            let _ = reply.send(ClientReply::Failed {
                                client: id,
                                reason: format!("keeping its control variate: {why}"),
                                panicked: false,
                            });
                            return Ok(());
                        }
                    }
                    let answer = match then {
                        AfterTraining::Upload | AfterTraining::Keep if leaves => {
                            ClientReply::Failed {
                                client: id,
                                reason: "injected dropout: left before sending its update".into(),
                                panicked: false,
                            }
                        }
                        AfterTraining::Upload => ClientReply::Update(*envelope),
                        AfterTraining::Keep => {
                            host.send_message(HostMsg::Keep {
                                client: id,
                                kept: Kept::Update(envelope),
                            })?;
                            ClientReply::Trained {
                                client: id,
                                update_norm,
                            }
                        }
                        AfterTraining::Secure => {
                            let secure = SecureClient::new(task, envelope, leaves);
                            host.send_message(HostMsg::Keep {
                                client: id,
                                kept: Kept::Secure(Box::new(secure)),
                            })?;
                            ClientReply::Ready { client: id }
                        }
                    };
                    let _ = reply.send(answer);
                }
                Ok(Err(reason)) => {
                    let _ = reply.send(ClientReply::Failed {
                        client: id,
                        reason,
                        panicked: false,
                    });
                }
                Err(lost) => {
                    let panicked = matches!(lost, Lost::Panicked(_));
                    let reason = lost.reason();
                    let _ = reply.send(ClientReply::Failed {
                        client: id,
                        reason: reason.clone(),
                        panicked,
                    });
                    if panicked {
                        return Err(
                            format!("client {id} panicked in local training: {reason}").into()
                        );
                    }
                }
            }
        }
        ClientMsg::Upload { round, reply } => {
            let answer = match state.kept.take() {
                Some(Kept::Update(envelope)) if envelope.round == round => {
                    ClientReply::Update(*envelope)
                }
                _ => ClientReply::Failed {
                    client: state.id,
                    reason: format!("no update kept for round {round}"),
                    panicked: false,
                },
            };
            let _ = reply.send(answer);
        }
        ClientMsg::Secure { round, step, reply } => {
            let id = state.id;
            let answer = match state.kept.take() {
                Some(Kept::Secure(mut secure)) if secure.round() == round => {
                    // Forming the input and masking it (a pseudorandom vector per
                    // neighbour) is the client's work: off the executor, where it trains.
                    let joined = local_work(&*state.trainer, move || {
                        let answer = secure.answer(&step);
                        (secure, answer)
                    })
                    .await;
                    match joined {
                        Ok((secure, Ok(message))) => {
                            if !secure.finished() {
                                host.send_message(HostMsg::Keep {
                                    client: id,
                                    kept: Kept::Secure(secure),
                                })?;
                            }
                            ClientReply::Secure {
                                client: id,
                                message: Box::new(message),
                            }
                        }
                        Ok((_, Err(reason))) => ClientReply::Failed {
                            client: id,
                            reason: format!("secure aggregation: {reason}"),
                            panicked: false,
                        },
                        Err(lost) => ClientReply::Failed {
                            client: id,
                            panicked: matches!(lost, Lost::Panicked(_)),
                            reason: format!("secure aggregation: {}", lost.reason()),
                        },
                    }
                }
                _ => ClientReply::Failed {
                    client: id,
                    reason: format!("no secure aggregation under way for round {round}"),
                    panicked: false,
                },
            };
            let _ = reply.send(answer);
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use fedshard_protocol::model::{ModelState, NamedTensor};
    use fedshard_protocol::task::{Recipe, TrainError};

    /// Adds `step` to every dense value; panics when the step is NaN.
    pub(crate) struct Shift(pub(crate) f32);

    impl LocalTrainer for Shift {
        fn samples(&self) -> u64 {
            4
        }
        fn train(&self, task: &TrainTask) -> Result<TrainOutput, TrainError> {
            assert!(!self.0.is_nan(), "asked to panic");
            if self.0 < 0.0 {
                return Err(TrainError::Model("negative step".into()));
            }
            let mut dense = task.dense.clone();
            dense.tensors[0].data.iter_mut().for_each(|x| *x += self.0);
            Ok(TrainOutput {
                dense,
                shards: vec![],
                loss: 0.5,
                control: None,
            })
        }
    }

    /// [`Shift`] whose work starts on a thread it spawns (as the core pool's would), or is
    /// dropped unrun.
    struct Starts {
        shift: Shift,
        runs: bool,
    }

    impl LocalTrainer for Starts {
        fn samples(&self) -> u64 {
            self.shift.samples()
        }
        fn train(&self, task: &TrainTask) -> Result<TrainOutput, TrainError> {
            self.shift.train(task)
        }
        fn start(&self, work: Work) -> Option<Work> {
            if self.runs {
                std::thread::spawn(work);
            }
            None
        }
    }

    pub(crate) fn task(round: u64) -> Box<TrainTask> {
        Box::new(TrainTask {
            round,
            client: 7,
            seed: 1,
            dense: ModelState::new(vec![NamedTensor::zeros("b", vec![4])]).unwrap(),
            width: None,
            shards: vec![],
            recipe: Recipe {
                learning_rate: 0.1,
                epochs: 1,
                batch_size: 1,
                momentum: 0.0,
                weight_decay: 0.0,
                clip_lr: None,
                proximal_mu: 0.0,
            },
            uplink: Default::default(),
            variates: None,
        })
    }

    /// Stands in for the host: passes on the actor of each `Done`.
    struct Takes;

    impl Actor for Takes {
        type Msg = HostMsg;
        type State = tokio::sync::mpsc::UnboundedSender<ractor::ActorId>;
        type Arguments = tokio::sync::mpsc::UnboundedSender<ractor::ActorId>;

        async fn pre_start(
            &self,
            _myself: ActorRef<HostMsg>,
            done: Self::Arguments,
        ) -> Result<Self::State, ActorProcessingErr> {
            Ok(done)
        }

        async fn handle(
            &self,
            _myself: ActorRef<HostMsg>,
            message: HostMsg,
            done: &mut Self::State,
        ) -> Result<(), ActorProcessingErr> {
            if let HostMsg::Done(worker) = message {
                let _ = done.send(worker.get_id());
            }
            Ok(())
        }
    }

    /// A client actor, its task, and the `Done`s it sent (as its own id).
    async fn spawn_client() -> (
        ActorRef<Job>,
        tokio::task::JoinHandle<()>,
        tokio::sync::mpsc::UnboundedReceiver<ractor::ActorId>,
    ) {
        let (done, reported) = tokio::sync::mpsc::unbounded_channel();
        let (host, _) = Actor::spawn(None, Takes, done).await.unwrap();
        let (actor, handle) = Actor::spawn(None, ClientActor, host).await.unwrap();
        (actor, handle, reported)
    }

    /// Round `round` of the client 7 with `trainer`, on `actor`.
    async fn train(actor: &ActorRef<Job>, trainer: impl LocalTrainer, round: u64) -> ClientReply {
        let args = ClientArgs {
            id: 7,
            trainer: Arc::new(trainer),
            kept: None,
            variate: None,
        };
        ractor::call!(actor, |reply| Job {
            args,
            work: ClientMsg::Train {
                task: task(round),
                then: AfterTraining::Upload,
                reply,
            },
        })
        .unwrap()
    }

    #[tokio::test]
    async fn a_client_actor_trains_reports_its_norm_and_takes_the_next_request() {
        let (actor, _, mut done) = spawn_client().await;
        for round in [3, 4] {
            match train(&actor, Shift(0.5), round).await {
                ClientReply::Update(e) => {
                    assert_eq!((e.client, e.round), (7, round));
                    // ‖(0.5, 0.5, 0.5, 0.5)‖ = 1.
                    assert!((e.update_norm - 1.0).abs() < 1e-12);
                    assert_eq!(e.payload.bits, 8 * e.payload.bytes.len() as u64);
                }
                other => panic!("{other:?}"),
            }
            // Done, and back to the host for the next request.
            assert_eq!(done.recv().await, Some(actor.get_id()));
        }
        assert_eq!(actor.get_status(), ractor::ActorStatus::Running);
    }

    #[tokio::test]
    async fn errors_are_reported_and_panics_fail_the_actor() {
        let (actor, handle, mut done) = spawn_client().await;
        let reply = train(&actor, Shift(-1.0), 1).await;
        assert_eq!(
            reply,
            ClientReply::Failed {
                client: 7,
                reason: "negative step".into(),
                panicked: false
            }
        );
        assert_eq!(done.recv().await, Some(actor.get_id()));

        match train(&actor, Shift(f32::NAN), 1).await {
            ClientReply::Failed {
                reason, panicked, ..
            } => {
                assert!(panicked);
                assert!(reason.contains("asked to panic"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        // The actor itself fails, so its supervisor (the client host) learns of the panic.
        handle.await.unwrap();
        assert_eq!(actor.get_status(), ractor::ActorStatus::Stopped);
    }

    #[tokio::test]
    async fn work_a_trainer_starts_itself_reports_as_on_a_thread_of_its_own() {
        let (actor, handle, _) = spawn_client().await;
        let starts = |shift, runs| Starts { shift, runs };
        match train(&actor, starts(Shift(0.5), true), 3).await {
            ClientReply::Update(e) => assert!((e.update_norm - 1.0).abs() < 1e-12),
            other => panic!("{other:?}"),
        }

        // Work dropped unrun is a failure, not a hang.
        match train(&actor, starts(Shift(0.5), false), 1).await {
            ClientReply::Failed {
                reason, panicked, ..
            } => assert!(!panicked && reason.contains("unrun"), "{reason}"),
            other => panic!("{other:?}"),
        }

        // A panic where the trainer started the work is caught there and fails the actor.
        match train(&actor, starts(Shift(f32::NAN), true), 1).await {
            ClientReply::Failed {
                reason, panicked, ..
            } => assert!(panicked && reason.contains("asked to panic"), "{reason}"),
            other => panic!("{other:?}"),
        }
        handle.await.unwrap();
    }
}
