//! The client actor: holds a [`LocalTrainer`] (its data and model code) and trains off the async
//! executor. A trainer error is reported as a failure; a panic is reported and then fails the
//! actor, so its supervisor (the server) restarts it.

use crate::payload::{Encoding, Payload, encode};
use crate::trainer::{ClientId, LocalTrainer, TrainOutput, TrainTask};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Instant;

/// An encoded update as the server receives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpdateEnvelope {
    pub client: ClientId,
    pub round: u64,
    pub samples: u64,
    pub loss: f64,
    /// ‖update − sent‖₂ over everything the client trained (the norm of 002's U_k).
    pub update_norm: f64,
    pub train_seconds: f64,
    pub payload: Payload,
}

/// What a client answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ClientReply {
    /// The encoded update.
    Update(UpdateEnvelope),
    /// Phase one of a two-phase round: trained, update kept until asked for.
    Trained {
        client: ClientId,
        update_norm: f64,
        samples: u64,
    },
    /// Training failed; the text says why.
    Failed {
        client: ClientId,
        reason: String,
        panicked: bool,
    },
}

pub enum ClientMsg {
    /// Train on the task; `upload: false` keeps the update for a later [`ClientMsg::Upload`].
    Train {
        task: Box<TrainTask>,
        upload: bool,
        encoding: Encoding,
        reply: RpcReplyPort<ClientReply>,
    },
    /// Send the update kept from phase one of `round`.
    Upload {
        round: u64,
        reply: RpcReplyPort<ClientReply>,
    },
}

pub struct ClientActor;

pub struct ClientState {
    id: ClientId,
    trainer: Arc<dyn LocalTrainer>,
    kept: Option<UpdateEnvelope>,
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

fn panic_text(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

impl Actor for ClientActor {
    type Msg = ClientMsg;
    type State = ClientState;
    type Arguments = (ClientId, Arc<dyn LocalTrainer>);

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        (id, trainer): Self::Arguments,
    ) -> Result<ClientState, ActorProcessingErr> {
        Ok(ClientState {
            id,
            trainer,
            kept: None,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut ClientState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ClientMsg::Train {
                task,
                upload,
                encoding,
                reply,
            } => {
                let trainer = Arc::clone(&state.trainer);
                let started = Instant::now();
                let joined = tokio::task::spawn_blocking(move || {
                    let output = trainer.train(&task);
                    output.map(|o| {
                        let norm = update_norm(&task, &o);
                        (encode(&o, encoding), o.samples, o.loss, norm, task.round)
                    })
                })
                .await;
                let id = state.id;
                match joined {
                    Ok(Ok((payload, samples, loss, update_norm, round))) => {
                        let envelope = UpdateEnvelope {
                            client: id,
                            round,
                            samples,
                            loss,
                            update_norm,
                            train_seconds: started.elapsed().as_secs_f64(),
                            payload,
                        };
                        if upload {
                            let _ = reply.send(ClientReply::Update(envelope));
                        } else {
                            state.kept = Some(envelope);
                            let _ = reply.send(ClientReply::Trained {
                                client: id,
                                update_norm,
                                samples,
                            });
                        }
                    }
                    Ok(Err(reason)) => {
                        let _ = reply.send(ClientReply::Failed {
                            client: id,
                            reason,
                            panicked: false,
                        });
                    }
                    Err(join) => {
                        let reason = if join.is_panic() {
                            panic_text(join.into_panic())
                        } else {
                            join.to_string()
                        };
                        let _ = reply.send(ClientReply::Failed {
                            client: id,
                            reason: reason.clone(),
                            panicked: true,
                        });
                        return Err(
                            format!("client {id} panicked in local training: {reason}").into()
                        );
                    }
                }
            }
            ClientMsg::Upload { round, reply } => {
                let answer = match state.kept.take() {
                    Some(envelope) if envelope.round == round => ClientReply::Update(envelope),
                    _ => ClientReply::Failed {
                        client: state.id,
                        reason: format!("no update kept for round {round}"),
                        panicked: false,
                    },
                };
                let _ = reply.send(answer);
            }
        }
        Ok(())
    }
}
