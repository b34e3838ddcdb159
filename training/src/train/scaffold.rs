//! SCAFFOLD's local side (docs/algorithms.md §12; Karimireddy et al., *SCAFFOLD: Stochastic
//! Controlled Averaging for Federated Learning*, ICML 2020, Algorithm 1 with option II): every
//! local step follows `g_i(y) + c − c_i` (line 10; with momentum the correction joins the step
//! outside it, `cohort/sgd.rs`), and after its `K` steps the client's new variate is
//! `c_i⁺ = c_i − c + (x − y)/(K η_l)` (line 12), of which it sends the change
//! `Δc_i = c_i⁺ − c_i = (x − y)/(K η_l) − c` (line 13).
//!
//! Both terms are taken in the dense weight space of the tensors the client trains, which is
//! the global model's: SCAFFOLD is refused for sharded and width-sliced clients
//! (`RuntimeConfig`'s requirements say why), whose steps move only a sub-model's coordinates
//! while `(x − y)/(K η_l)` would estimate the gradient of every weight.

use fedshard_protocol::model::{ModelError, ModelState, NamedTensor};
use fedshard_protocol::task::Variates;

/// `c − c_i` of `variates`, tensor by tensor in the layout of `sent` (the task's tensors): what
/// each local step adds to the gradient. A client without a variate yet has `c_i = 0`.
pub(crate) fn correction(variates: &Variates, sent: &ModelState) -> Result<ModelState, ModelError> {
    variates.server.check_compatible(sent)?;
    if let Some(own) = &variates.client {
        own.check_compatible(sent)?;
    }
    let tensors = sent
        .tensors
        .iter()
        .map(|t| {
            let server = variates.server.require(&t.name)?;
            let data = match variates.client.as_ref() {
                Some(own) => {
                    let own = own.require(&t.name)?;
                    server
                        .data
                        .iter()
                        .zip(&own.data)
                        .map(|(c, ci)| c - ci)
                        .collect()
                }
                None => server.data.clone(),
            };
            NamedTensor::new(t.name.clone(), t.shape.clone(), data)
        })
        .collect::<Result<Vec<_>, _>>()?;
    ModelState::new(tensors)
}

/// `Δc_i = (x − y)/(K η) − c`: `sent` is `x`, `trained` is `y` after `steps` (`K ≥ 1`) local
/// steps at rate `learning_rate` (`η_l`), `server` is `c`. Computed in f64 per value.
pub(crate) fn control_delta(
    sent: &ModelState,
    trained: &ModelState,
    server: &ModelState,
    steps: usize,
    learning_rate: f64,
) -> Result<ModelState, ModelError> {
    let scale = 1.0 / (steps as f64 * learning_rate);
    let tensors = sent
        .tensors
        .iter()
        .map(|x| {
            let y = trained.require(&x.name)?;
            let c = server.require(&x.name)?;
            let data = x
                .data
                .iter()
                .zip(&y.data)
                .zip(&c.data)
                .map(|((&x, &y), &c)| ((f64::from(x) - f64::from(y)) * scale - f64::from(c)) as f32)
                .collect();
            NamedTensor::new(x.name.clone(), x.shape.clone(), data)
        })
        .collect::<Result<Vec<_>, _>>()?;
    ModelState::new(tensors)
}

#[cfg(test)]
#[path = "scaffold_tests.rs"]
mod tests;
