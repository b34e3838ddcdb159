//! The cosine between the update the server applied and the one its clients asked for.

use super::{Accepted, term_factors};
use crate::coordinator::Registry;
use fedshard_protocol::model::ModelState;
use fedshard_protocol::task::{ClientId, TrainTask};
use std::collections::BTreeMap;

/// The cosine similarity between the update the server applied to the global model and the one
/// its accepted clients asked for (the sharding paper, Sec. 5 / Fig. 4).
///
/// `Δ = after − before`, flattened over every tensor, is compared with the sample-weighted
/// mean `ū = Σ_c D_c u_c / Σ_c D_c` (D_c from the registry, as in the fold) of each client's own
/// update `u_c` in the full weight space: `values − sent` for a dense tensor, and for a sharded
/// layer the change of the effective weight over the terms the client held,
/// `U'_new V'_newᵀ − U'_sent V'_sentᵀ` (columns `I` only, without the frozen multipliers ω, so in
/// the same space as the server's recomposition `W = Σ u'_i v'_iᵀ`); tensors a client did not
/// train count as zero in its `u_c`. All sums are in f64.
///
/// Why: FedAvg of dense updates gives `Δ = ū` exactly (cosine 1). Spectral sharding averages
/// each singular vector over the clients that held it and recomposes, so `Δ` differs from `ū` by
/// the cross terms of the product and by whom each term was averaged over; a strategy whose
/// aggregate points away from what the clients asked for (a biased sampler, a large ω scaling
/// one term, an aggregator that re-weights) shows a cosine well below 1, however its accuracy
/// happens to move. `None` when the model did not change (`Δ = 0`), when the clients asked for
/// no change (`ū = 0`), or when there is no accepted update.
pub fn update_cosine(
    before: &ModelState,
    after: &ModelState,
    accepted: &[Accepted],
    tasks: &BTreeMap<ClientId, TrainTask>,
    registry: &Registry,
) -> Option<f64> {
    let weight = |id: ClientId| registry.clients.get(&id).map_or(0.0, |c| c.samples as f64);
    let total: f64 = accepted.iter().map(|a| weight(a.client)).sum();
    if accepted.is_empty() || total <= 0.0 {
        return None;
    }
    let (mut dot, mut applied, mut asked) = (0.0f64, 0.0f64, 0.0f64);
    for new in &after.tensors {
        let old = before.get(&new.name)?;
        if old.data.len() != new.data.len() {
            return None;
        }
        let (rows, cols) = new.matrix_shape();
        // ū restricted to this tensor.
        let mut mean = vec![0.0f64; new.data.len()];
        for a in accepted {
            let w = weight(a.client) / total;
            let Some(task) = tasks.get(&a.client) else {
                continue;
            };
            if let (Some(t), Some(sent)) =
                (a.update.dense.get(&new.name), task.dense.get(&new.name))
            {
                for ((m, &v), &s) in mean.iter_mut().zip(&t.data).zip(&sent.data) {
                    *m += w * (f64::from(v) - f64::from(s));
                }
            }
            let shards = a.update.shards.iter().zip(&task.shards);
            for (got, sent) in shards.filter(|(g, _)| g.name == new.name) {
                // w Σ_j (u'_j v'_jᵀ − ū'_j v̄'_jᵀ), as one product over the stacked terms.
                let mut terms = Vec::with_capacity(2 * got.indices.len());
                for j in 0..got.indices.len() {
                    let [ul, ur, sl, sr] = term_factors(got, sent, j, (rows, cols))?;
                    terms.extend([(w, ul, ur), (-w, sl, sr)]);
                }
                let change = fedshard_strategies::svd::weighted_outer_sum(&terms, rows, cols);
                for (m, d) in mean.iter_mut().zip(change) {
                    *m += d;
                }
            }
        }
        for ((m, &n), &o) in mean.iter().zip(&new.data).zip(&old.data) {
            let d = f64::from(n) - f64::from(o);
            dot += d * m;
            applied += d * d;
            asked += m * m;
        }
    }
    if applied == 0.0 || asked == 0.0 {
        return None;
    }
    let cosine = dot / (applied.sqrt() * asked.sqrt());
    cosine.is_finite().then_some(cosine.clamp(-1.0, 1.0))
}
