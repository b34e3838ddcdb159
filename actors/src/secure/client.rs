//! A client's side of a secure round: its input formed from its update, and its state machine
//! between the exchanges.

use super::{InputSpec, SecureStep, session_id};
use crate::round::{Accepted, check};
use fedshard_protocol::payload::UpdateEnvelope;
use fedshard_protocol::task::TrainTask;
use fedshard_protocol::width::positions_in_union;
use fedshard_secagg::ClientMessage;
use fedshard_secagg::message::Round as Step;
use fedshard_strategies::privacy::clip_factor;

/// `update`'s blocks as changes against `task`, laid out by `spec.layout`, clipped, weighted and
/// encoded: a client's input to the sum. The update is opened and checked against its task as
/// the server would check it in the clear.
pub fn input(
    task: &TrainTask,
    update: &UpdateEnvelope,
    spec: &InputSpec,
) -> std::result::Result<Vec<u64>, String> {
    let Accepted { update, .. } = check(task.client, update, Some(task), None)
        .map_err(|kind| format!("its own update does not open against its task ({kind:?})"))?;
    let layout = &spec.layout;
    let mut values = vec![0f64; layout.len()];
    for t in &update.dense.tensors {
        let (offset, len) = layout
            .dense(&t.name)
            .ok_or_else(|| format!("tensor `{}` is not in the round's layout", t.name))?;
        let sent = task
            .dense
            .get(&t.name)
            .ok_or_else(|| format!("tensor `{}` was not sent", t.name))?;
        // Under a width strategy the tensor is cut to the client's slice, and each value has
        // its place in the round's union (docs/algorithms.md §8.3); otherwise it is whole.
        let places = match (&layout.width, &task.width) {
            (Some(w), Some(slice)) => positions_in_union(sent, &w.groups, &slice.kept, &w.union)
                .map_err(|e| e.to_string())?,
            (None, None) => None,
            _ => return Err("the round's layout and the task disagree on width slicing".into()),
        };
        let held = places.as_ref().map_or(len, Vec::len);
        if t.data.len() != held || sent.data.len() != held {
            return Err(format!("tensor `{}` has another length", t.name));
        }
        let input = &mut values[offset..offset + len];
        let changes = t
            .data
            .iter()
            .zip(&sent.data)
            .map(|(&new, &old)| f64::from(new) - f64::from(old));
        match places {
            Some(places) => {
                for (p, change) in places.into_iter().zip(changes) {
                    *input.get_mut(p).ok_or_else(|| {
                        format!("tensor `{}` does not fit the round's layout", t.name)
                    })? = change;
                }
            }
            None => input.iter_mut().zip(changes).for_each(|(v, c)| *v = c),
        }
    }
    if update.shards.len() != layout.layers.len() {
        return Err(format!(
            "{} sharded layers, the round has {}",
            update.shards.len(),
            layout.layers.len()
        ));
    }
    let starts = layout.layer_starts();
    for (((got, sent), layer), start) in update
        .shards
        .iter()
        .zip(&task.shards)
        .zip(&layout.layers)
        .zip(starts)
    {
        for (j, &term) in got.indices.iter().enumerate() {
            if term >= layer.terms {
                return Err(format!("term {term} of `{}` outside the plan", got.name));
            }
            let [u, v] = layer.term_ranges(start, term);
            for (range, new, old) in [(u, &got.left, &sent.left), (v, &got.right, &sent.right)] {
                let len = range.len();
                let (Some(new), Some(old)) = (
                    new.get(j * len..(j + 1) * len),
                    old.get(j * len..(j + 1) * len),
                ) else {
                    return Err(format!("short factors of `{}`", got.name));
                };
                for ((v, &n), &o) in values[range].iter_mut().zip(new).zip(old) {
                    *v = f64::from(n) - f64::from(o);
                }
            }
        }
    }
    let norm = values.iter().map(|v| v * v).sum::<f64>().sqrt();
    let scale = clip_factor(norm, spec.clip_norm) * spec.weight;
    let mut scaled: Vec<f32> = values.iter().map(|v| (v * scale) as f32).collect();
    if spec.count_unclipped {
        let unclipped = norm <= spec.clip_norm;
        scaled.push(if unclipped {
            spec.clip_norm as f32
        } else {
            0.0
        });
    }
    spec.fixed.encode(&scaled).map_err(|e| e.to_string())
}

/// A client's side of a round's session, kept by its host between the exchanges.
pub struct SecureClient {
    round: u64,
    /// The task and the update, until the input is formed.
    trained: Option<(Box<TrainTask>, Box<UpdateEnvelope>)>,
    /// The state machine and the input, once the session began.
    session: Option<(fedshard_secagg::Client, Vec<u64>)>,
    /// Fault injection's `dropout`: the client leaves before its masked input.
    leaves: bool,
}

impl SecureClient {
    /// The client trained `task` into `update`; with `leaves` it will leave the session before
    /// its masked input ([`crate::faults::FaultKind::Dropout`]).
    pub fn new(task: Box<TrainTask>, update: Box<UpdateEnvelope>, leaves: bool) -> SecureClient {
        SecureClient {
            round: task.round,
            trained: Some((task, update)),
            session: None,
            leaves,
        }
    }

    /// The round this session belongs to.
    pub fn round(&self) -> u64 {
        self.round
    }

    /// Whether the client sent its last message (its unmasking shares).
    pub fn finished(&self) -> bool {
        self.trained.is_none() && self.session.is_none()
    }

    /// Answers `step`; an error ends the client's part in the session.
    pub fn answer(&mut self, step: &SecureStep) -> std::result::Result<ClientMessage, String> {
        match step {
            SecureStep::Begin {
                params,
                input: spec,
            } => {
                let (task, update) = self.trained.take().ok_or("the session had already begun")?;
                let input = input(&task, &update, spec)?;
                // The client's secrets: from the operating system, never from the run's
                // streams, which the server can rebuild.
                let mut seed = [0u8; 32];
                getrandom::fill(&mut seed).map_err(|e| format!("no OS entropy: {e}"))?;
                let id = session_id(task.client).map_err(|e| e.to_string())?;
                let mut client = fedshard_secagg::Client::new(params.clone(), id, seed)
                    .map_err(|e| e.to_string())?;
                let message = client.advertise_keys().map_err(|e| e.to_string())?;
                self.session = Some((client, input));
                Ok(message)
            }
            SecureStep::Continue(message) => {
                let (client, input) = self.session.as_mut().ok_or("no session has begun")?;
                let answer = match message.round {
                    Step::MaskedInput if self.leaves => {
                        self.session = None;
                        return Err("injected dropout: left the session before its masked \
                                    input"
                            .into());
                    }
                    Step::ShareKeys => client.share_keys(message),
                    Step::MaskedInput => client.masked_input(message, input),
                    Step::Unmask => client.unmask(message),
                    Step::AdvertiseKeys => {
                        return Err("advertising keys begins a session".into());
                    }
                };
                let finished = message.round == Step::Unmask;
                let answer = answer.map_err(|e| e.to_string());
                if finished || answer.is_err() {
                    self.session = None;
                }
                answer
            }
        }
    }
}
