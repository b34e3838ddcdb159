//! Every participant's task for a round or for one asynchronous hand-out.

use crate::error::Error;
use fedshard_protocol::model::ModelState;
use fedshard_protocol::shard_plan::{Participant, ShardPlan, Sharding, dense_part};
use fedshard_protocol::task::{ClientId, Recipe, TrainTask, Variates};
use fedshard_protocol::uplink::Uplink;
use fedshard_protocol::width::slice_state;
use std::collections::BTreeMap;

/// The tasks of a round and the bits each takes on the downlink.
#[derive(Debug, Clone, PartialEq)]
pub struct Tasks {
    pub tasks: BTreeMap<ClientId, TrainTask>,
    /// 8 × the bincode length of each task.
    pub bits: BTreeMap<ClientId, u64>,
}

/// Every participant's task: the dense part of the model and its shards of the plan (none
/// without a sharding policy), or under a width strategy the model cut to its slice of the
/// plan; and the round's recipe.
pub fn build_tasks(
    global: &ModelState,
    sharding: Option<&Sharding>,
    plan: Option<&ShardPlan>,
    participants: &[Participant],
    (seed, round): (u64, u64),
    recipe: &Recipe,
) -> Result<Tasks, Error> {
    let spectral = match sharding {
        Some(Sharding::Spectral(policy)) => Some(policy),
        _ => None,
    };
    let dense = dense_part(global, spectral);
    let width = plan.and_then(|p| p.width.as_ref());
    let mut tasks = BTreeMap::new();
    let mut bits = BTreeMap::new();
    for p in participants {
        let shards = plan
            .and_then(|pl| pl.shards.get(&p.client).cloned())
            .unwrap_or_default();
        let slice = width.and_then(|w| Some((w, w.slices.get(&p.client)?)));
        let (dense, width) = match slice {
            Some((w, slice)) => (
                slice_state(global, &w.groups, slice).map_err(Error::Plan)?,
                Some(slice.clone()),
            ),
            None => (dense.clone(), None),
        };
        let task = TrainTask {
            round,
            client: p.client,
            seed,
            dense,
            shards,
            width,
            recipe: recipe.clone(),
            uplink: Uplink::default(),
            variates: None,
        };
        bits.insert(p.client, task_bits(&task));
        tasks.insert(p.client, task);
    }
    Ok(Tasks { tasks, bits })
}

impl Tasks {
    /// Sets every task's uplink from `uplink` (the compressor's settings for that task) and
    /// recounts the downlink bits, which include them.
    pub fn attach_uplinks(
        &mut self,
        uplink: impl Fn(&TrainTask) -> Result<Uplink, fedshard_protocol::Error>,
    ) -> Result<(), Error> {
        for (id, task) in self.tasks.iter_mut() {
            task.uplink = uplink(task).map_err(Error::Uplink)?;
            self.bits.insert(*id, task_bits(task));
        }
        Ok(())
    }

    /// Sends every task SCAFFOLD's server variate `server` (the clients' own are filled in by
    /// their hosts) and recounts the downlink bits, which carry it.
    pub fn attach_variates(&mut self, server: &ModelState) {
        for (id, task) in self.tasks.iter_mut() {
            task.variates = Some(Variates {
                server: server.clone(),
                client: None,
            });
            self.bits.insert(*id, task_bits(task));
        }
    }

    /// Bits of every task on the downlink.
    pub fn downlink_bits(&self) -> u64 {
        self.bits.values().sum()
    }
}

/// Bits of a task as sent: its bincode encoding.
pub(crate) fn task_bits(task: &TrainTask) -> u64 {
    8 * bincode::serde::encode_to_vec(task, bincode::config::standard())
        .map_or(0, |b| b.len() as u64)
}
