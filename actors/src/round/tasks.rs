//! Every participant's task for a round or for one asynchronous hand-out.

use crate::error::Error;
use fedshard_protocol::model::ModelState;
use fedshard_protocol::shard_plan::{Participant, ShardPlan, ShardingPolicy, dense_part};
use fedshard_protocol::task::{ClientId, Recipe, TrainTask};
use fedshard_protocol::uplink::Uplink;
use std::collections::BTreeMap;

/// The tasks of a round and the bits each takes on the downlink.
#[derive(Debug, Clone, PartialEq)]
pub struct Tasks {
    pub tasks: BTreeMap<ClientId, TrainTask>,
    /// 8 × the bincode length of each task.
    pub bits: BTreeMap<ClientId, u64>,
}

/// Every participant's task: the dense part of the model, its shards of the plan (none without
/// a sharding policy) and the round's recipe.
pub fn build_tasks(
    global: &ModelState,
    policy: Option<&ShardingPolicy>,
    plan: Option<&ShardPlan>,
    participants: &[Participant],
    (seed, round): (u64, u64),
    recipe: &Recipe,
) -> Tasks {
    let dense = dense_part(global, policy);
    let mut tasks = BTreeMap::new();
    let mut bits = BTreeMap::new();
    for p in participants {
        let shards = plan
            .and_then(|pl| pl.shards.get(&p.client).cloned())
            .unwrap_or_default();
        let task = TrainTask {
            round,
            client: p.client,
            seed,
            dense: dense.clone(),
            shards,
            recipe: recipe.clone(),
            uplink: Uplink::default(),
        };
        bits.insert(p.client, task_bits(&task));
        tasks.insert(p.client, task);
    }
    Tasks { tasks, bits }
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
