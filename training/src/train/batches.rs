//! The batch loops every neural trainer and evaluator shares: a client's local steps (epochs of
//! mini-batches in the order of its seeded [`Purpose::Training`] stream, mean loss, divergence
//! check) and a held-out pass (accuracy and mean cross-entropy over fixed-size batches). The
//! model-specific part of a step or a forward pass is a closure.

use crate::train::neural::{Examples, cross_entropy};
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use fedshard_protocol::task::{EvalError, Evaluation, Recipe, TrainError};
use fedshard_strategies::rng::{ChaCha20Rng, Purpose, stream};
use rayon::prelude::*;

/// The tensors of one batch: the rows of `samples` (`rows × width`) and their targets; the
/// filled vectors move into them.
pub(crate) fn batch<B: Backend>(
    examples: &dyn Examples,
    samples: &[usize],
    device: &B::Device,
) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    let rows = samples.len();
    let mut x = Vec::with_capacity(rows * examples.width());
    let mut y = Vec::with_capacity(rows * examples.targets_per_row());
    examples.fill(samples, &mut x, &mut y);
    let targets = y.len();
    (
        Tensor::from_data(TensorData::new(x, [rows, examples.width()]), device),
        Tensor::from_data(TensorData::new(y, [targets]), device),
    )
}

/// A client's local steps under a recipe: `recipe.epochs` passes over its examples, each in a
/// fresh order from the `(seed, round, client)` stream of [`Purpose::Training`], cut into
/// batches of `recipe.batch_size`.
pub(crate) struct LocalSteps<'a> {
    examples: &'a dyn Examples,
    epochs: usize,
    batch_size: usize,
    order_rng: ChaCha20Rng,
}

impl<'a> LocalSteps<'a> {
    /// Refuses a client without examples and a batch size of 0.
    pub(crate) fn new(
        examples: &'a dyn Examples,
        recipe: &Recipe,
        seed: u64,
        round: u64,
        client: u64,
    ) -> Result<Self, TrainError> {
        if examples.is_empty() {
            return Err(TrainError::NoSamples);
        }
        if recipe.batch_size == 0 {
            return Err(TrainError::ZeroBatchSize);
        }
        Ok(Self {
            examples,
            epochs: recipe.epochs,
            batch_size: recipe.batch_size,
            order_rng: stream(seed, round, client, Purpose::Training),
        })
    }

    /// Every batch's samples, in training order: `epochs` passes, each in a fresh order.
    pub(crate) fn batches(mut self) -> Vec<Vec<usize>> {
        let mut order: Vec<usize> = (0..self.examples.len()).collect();
        let mut batches = Vec::new();
        for _ in 0..self.epochs {
            crate::data::shuffle(&mut order, &mut self.order_rng);
            batches.extend(order.chunks(self.batch_size).map(<[usize]>::to_vec));
        }
        batches
    }

    /// Runs `step` on every batch in turn, threading `model` through it; `step` returns the
    /// updated model and the loss to report for the batch. Returns the trained model and the
    /// mean reported loss over all steps, or an error if that mean is not finite.
    ///
    /// The losses are summed on the device and read once, at the end: reading each step's loss
    /// would make the host wait for every step to finish, which on a GPU serialises the
    /// launches of one step behind the completion of the last (docs/performance.md). A loss
    /// that turns NaN or infinite stays so in the sum, so a diverged client is still refused,
    /// after its last step instead of at the first bad one.
    pub(crate) fn run<B: Backend, M>(
        mut self,
        mut model: M,
        device: &B::Device,
        mut step: impl FnMut(M, Tensor<B, 2>, Tensor<B, 1, Int>) -> (M, Tensor<B, 1>),
    ) -> Result<(M, f64), TrainError> {
        let mut order: Vec<usize> = (0..self.examples.len()).collect();
        let mut loss_sum = Tensor::<B, 1>::zeros([1], device);
        let mut steps = 0usize;
        for _ in 0..self.epochs {
            crate::data::shuffle(&mut order, &mut self.order_rng);
            for samples in order.chunks(self.batch_size) {
                let (inputs, targets) = batch::<B>(self.examples, samples, device);
                let (next, loss) = step(model, inputs, targets);
                model = next;
                loss_sum = loss_sum + loss.detach();
                steps += 1;
            }
        }
        let total: f64 = loss_sum.into_scalar().elem();
        let mean = total / steps.max(1) as f64;
        if !mean.is_finite() {
            return Err(TrainError::Diverged { mean_loss: mean });
        }
        Ok((model, mean))
    }
}

/// Accuracy and mean cross-entropy over `examples` in order, `batch_size` rows (at least 1) per
/// forward pass. `forward` maps a batch's inputs and targets to the logits and targets to
/// score (`scored rows × classes` and `scored rows`).
///
/// The batches are scored in parallel on rayon's pool: the server evaluates between rounds,
/// when the clients' cores are free, and one thread left the other core idle for a tenth of
/// the main job. Their counts and loss sums are added in batch order, so the result does not
/// depend on the number of threads.
pub(crate) fn evaluate<B: Backend>(
    examples: &dyn Examples,
    batch_size: usize,
    device: &B::Device,
    forward: impl Fn(Tensor<B, 2>, Tensor<B, 1, Int>) -> (Tensor<B, 2>, Tensor<B, 1, Int>) + Sync,
) -> Result<Evaluation, EvalError> {
    let order: Vec<usize> = (0..examples.len()).collect();
    let scores: Vec<(usize, f64, usize)> = order
        .par_chunks(batch_size.max(1))
        .map(|samples| {
            let (inputs, targets) = batch::<B>(examples, samples, device);
            let (logits, targets) = forward(inputs, targets);
            let rows = targets.dims()[0];
            let hits: i64 = logits
                .clone()
                .argmax(1)
                .reshape([rows])
                .equal(targets.clone())
                .int()
                .sum()
                .into_scalar()
                .elem();
            let loss: f64 = cross_entropy(logits, targets).into_scalar().elem();
            (hits as usize, loss * rows as f64, rows)
        })
        .collect();
    let (correct, loss_sum, scored) = scores
        .iter()
        .fold((0, 0.0, 0), |(c, l, n), &(hits, loss, rows)| {
            (c + hits, l + loss, n + rows)
        });
    if scored == 0 {
        return Err(EvalError::EmptyTestSet);
    }
    Ok(Evaluation {
        accuracy: correct as f64 / scored as f64,
        loss: loss_sum / scored as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Dataset;
    use burn_ndarray::NdArray;

    /// Six rows holding 1, 2, …, 6 (one value each), all of class 0 of 3.
    fn one_to_six() -> Dataset {
        Dataset {
            features: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            labels: vec![0; 6],
            dim: 1,
            classes: 3,
        }
    }

    /// Runs two epochs in batches of 4 (steps of 4 and 2 rows) with a "loss" per step of the
    /// batch's input sum, or of `poison` from the third step on.
    fn run(poison: Option<f32>) -> Result<(usize, f64), TrainError> {
        let recipe = Recipe {
            epochs: 2,
            batch_size: 4,
            ..Recipe::default()
        };
        let examples = one_to_six();
        let steps = LocalSteps::new(&examples, &recipe, 7, 1, 0)?;
        let device = Default::default();
        steps.run::<NdArray, usize>(0, &device, |taken, inputs, _| {
            let loss = match poison {
                Some(bad) if taken >= 2 => Tensor::from_floats([bad], &device),
                _ => inputs.sum().reshape([1]),
            };
            (taken + 1, loss)
        })
    }

    #[test]
    fn the_reported_loss_is_the_mean_over_all_steps() {
        // Each epoch's two batches hold all six rows: 2 · (1 + … + 6) = 42 over 4 steps.
        assert_eq!(run(None).expect("trains"), (4, 10.5));
    }

    #[test]
    fn evaluation_does_not_depend_on_the_number_of_threads() {
        let device = Default::default();
        // Logits (x, −x, x/2) for an input x > 0: class 0 wins, the target of every row.
        let forward =
            |x: Tensor<NdArray, 2>, y| (Tensor::cat(vec![x.clone(), -x.clone(), x / 2], 1), y);
        let on = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a thread pool")
                .install(|| evaluate::<NdArray>(&one_to_six(), 2, &device, forward))
        };
        let one = on(1).expect("evaluated on one thread");
        assert_eq!(one.accuracy, 1.0);
        // Mean over the rows of −log softmax₀ = log(1 + e^(−2x) + e^(−x/2)).
        let expected = (1..=6)
            .map(|x| (1.0 + (-2.0 * x as f64).exp() + (-0.5 * x as f64).exp()).ln())
            .sum::<f64>()
            / 6.0;
        assert!(
            (one.loss - expected).abs() < 1e-6,
            "{} vs {expected}",
            one.loss
        );
        for threads in [2, 3] {
            let many = on(threads).expect("evaluated on several threads");
            assert_eq!(many.loss.to_bits(), one.loss.to_bits(), "{threads} threads");
            assert_eq!(many.accuracy, one.accuracy);
        }
    }

    #[test]
    fn a_loss_that_turns_nan_or_infinite_refuses_the_client() {
        for bad in [f32::NAN, f32::INFINITY] {
            let err = run(Some(bad)).expect_err("a diverged client must be refused");
            assert!(
                matches!(err, TrainError::Diverged { mean_loss } if !mean_loss.is_finite()),
                "{err}"
            );
        }
    }
}
