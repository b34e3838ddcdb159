//! FedPM's masked networks (docs/algorithms.md §4.6; the KLMS paper (Isik et al.), Appendix A.1): every
//! weight is a frozen random value `w_init` times a Bernoulli mask bit, and what is learned is
//! the mask's probability `θ = sigmoid(s)` through trainable scores `s`.
//!
//! * `w_init` is the reference's "signed constant" (`ME_init` in its `masked_layers.py`):
//!   `±c` with equal probability, `c = e · √(1/fan_in)` (`e` is Euler's number,
//!   `np.e * np.sqrt(1 / in_features)` in the reference). It is drawn from the run seed and the
//!   tensor's name ([`signed_constant`]), so every client and the server's evaluator rebuild
//!   the same weights and only θ crosses the wire.
//! * The global model is θ, one tensor per masked layer, named like the layer's weight
//!   (`fc0.weight`, `conv1.weight`) with the weight's shape.
//! * The layers have no biases (the reference also masks ±c biases; a bias-free network keeps
//!   one tensor per layer, the form the uplink compressor codes).
//! * A forward pass uses `w_init ⊙ m` with `m ~ Bern(θ)` drawn by the caller
//!   ([`MaskedNet::sampled_weights`]): in training a fresh mask per batch with the reference's
//!   straight-through rule, in evaluation one mask for the whole test set.
//!
//! The architecture is an MLP, optionally after masked 3×3 convolutions (each followed by ReLU
//! and 2×2 max pooling) on square single-channel images: [`MaskedNetwork`].

use crate::models::NetError;
use crate::models::kernels::{self, ConvGeometry, Kernels, Pool};
use crate::models::layers::param;
use burn::module::{Module, Param};
use burn::tensor::activation::{relu, sigmoid};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use fedshard_protocol::model::{ModelState, NamedTensor};
use fedshard_strategies::rng::{ChaCha20Rng, Purpose, stream, uniform};
use rand::Rng;

/// Side of the masked convolutions' square kernels.
const KERNEL: usize = 3;

/// θ is clamped to `[THETA_FLOOR, 1 − THETA_FLOOR]` before a client takes its logit (the
/// reference's received masks are 0.01 / 0.99, so its θ never leaves this range either).
pub const THETA_FLOOR: f64 = 0.01;

/// The θ a client returns stays within `[THETA_EPS, 1 − THETA_EPS]`: strictly inside (0, 1) in
/// f32, so its logit and a KL divergence against it are finite even where sigmoid saturates.
pub const THETA_EPS: f64 = 1e-6;

/// The shape of a masked network; inputs and classes come from the dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaskedNetwork {
    /// Features per input row; with convolutions, a square single-channel image of
    /// `√inputs × √inputs` pixels.
    pub inputs: usize,
    /// Output channels of the masked 3×3 convolutions (padding 1), each followed by ReLU and
    /// 2×2 max pooling; empty for an MLP.
    pub conv: Vec<usize>,
    /// Widths of the hidden masked linear layers (each followed by ReLU).
    pub hidden: Vec<usize>,
    /// Outputs of the last layer.
    pub classes: usize,
}

/// One masked layer: the name of its θ tensor, the tensor's shape and the fan-in of `c`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaskedLayerSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub fan_in: usize,
}

impl MaskedLayerSpec {
    /// Rows of the weight matrix (output channels or units).
    pub fn rows(&self) -> usize {
        self.shape[0]
    }

    /// Columns of the weight matrix (`c_in · k · k` for a convolution).
    pub fn cols(&self) -> usize {
        self.shape[1..].iter().product()
    }

    /// Weights in the layer.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl MaskedNetwork {
    /// The image side with convolutions (`None` without); an error when `inputs` is not a
    /// square or the side does not halve `conv.len()` times.
    pub fn side(&self) -> Result<Option<usize>, NetError> {
        if self.conv.is_empty() {
            return Ok(None);
        }
        let side = (self.inputs as f64).sqrt().round() as usize;
        if side * side != self.inputs {
            return Err(NetError::MaskedShape(format!(
                "masked convolutions need square images, but {} inputs are not a square",
                self.inputs
            )));
        }
        let halvings = 1usize << self.conv.len();
        if !side.is_multiple_of(halvings) {
            return Err(NetError::MaskedShape(format!(
                "{} masked convolutions halve the side {} times, but {side} is not divisible by {halvings}",
                self.conv.len(),
                self.conv.len()
            )));
        }
        Ok(Some(side))
    }

    /// The masked layers in forward order: `conv0 …` then `fc0 …`; an error names a zero
    /// width or an image that the convolutions cannot pool.
    pub fn layers(&self) -> Result<Vec<MaskedLayerSpec>, NetError> {
        if self.inputs == 0 || self.classes == 0 {
            return Err(NetError::MaskedShape(format!(
                "a masked network needs inputs and classes, found {} and {}",
                self.inputs, self.classes
            )));
        }
        if let Some(at) = self.conv.iter().position(|&c| c == 0) {
            return Err(NetError::MaskedShape(format!(
                "`conv[{at}]`: a convolution needs at least 1 channel"
            )));
        }
        if let Some(at) = self.hidden.iter().position(|&h| h == 0) {
            return Err(NetError::MaskedShape(format!(
                "`hidden[{at}]`: a layer needs at least 1 unit"
            )));
        }
        let mut layers = Vec::new();
        let mut flat = self.inputs;
        if let Some(side) = self.side()? {
            let mut c_in = 1;
            for (i, &c_out) in self.conv.iter().enumerate() {
                layers.push(MaskedLayerSpec {
                    name: format!("conv{i}.weight"),
                    shape: vec![c_out, c_in, KERNEL, KERNEL],
                    fan_in: c_in * KERNEL * KERNEL,
                });
                c_in = c_out;
            }
            let pooled = side >> self.conv.len();
            flat = c_in * pooled * pooled;
        }
        let widths: Vec<usize> = std::iter::once(flat)
            .chain(self.hidden.iter().copied())
            .chain(std::iter::once(self.classes))
            .collect();
        for (i, w) in widths.windows(2).enumerate() {
            layers.push(MaskedLayerSpec {
                name: format!("fc{i}.weight"),
                shape: vec![w[1], w[0]],
                fan_in: w[0],
            });
        }
        Ok(layers)
    }

    /// The initial global θ: `sigmoid(s)` with `s ~ N(0, 1)` per weight, as the reference
    /// initialises its scores (`torch.randn_like`), drawn from the run's
    /// [`Purpose::Init`] stream of each tensor (client slot = [`name_key`]).
    pub fn initial_state(&self, seed: u64) -> Result<ModelState, NetError> {
        let tensors = self
            .layers()?
            .into_iter()
            .map(|layer| {
                let mut rng = stream(seed, 0, name_key(&layer.name), Purpose::Init);
                let data = (0..layer.len())
                    .map(|_| {
                        // Box–Muller; 1 − u keeps the logarithm finite.
                        let (u1, u2) = (1.0 - uniform(&mut rng), uniform(&mut rng));
                        let s = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                        theta_of_score(s)
                    })
                    .collect();
                NamedTensor {
                    name: layer.name,
                    shape: layer.shape,
                    data,
                }
            })
            .collect();
        Ok(ModelState::new(tensors)?)
    }

    /// The network with scores `s = logit(clamp(θ, 0.01, 0.99))` from the global `theta` and
    /// the frozen weights of `seed`. Errors name a missing, misshapen or unknown tensor and one
    /// holding a value outside [0, 1] (NaN included).
    pub fn load<B: Backend>(
        &self,
        theta: &ModelState,
        seed: u64,
        device: &B::Device,
    ) -> Result<MaskedNet<B>, NetError> {
        let layers = self.layers()?;
        if let Some(extra) = theta
            .tensors
            .iter()
            .find(|t| !layers.iter().any(|l| l.name == t.name))
        {
            return Err(NetError::UnknownTensors {
                names: vec![extra.name.clone()],
            });
        }
        let mut convs = Vec::new();
        let mut fcs = Vec::new();
        for layer in &layers {
            let t = theta
                .get(&layer.name)
                .ok_or_else(|| NetError::MissingTensor {
                    name: layer.name.clone(),
                })?;
            if t.shape != layer.shape {
                return Err(NetError::TensorShape {
                    name: layer.name.clone(),
                    found: t.shape.clone(),
                    expected: layer.shape.clone(),
                });
            }
            if let Some(&value) = t.data.iter().find(|v| !(0.0..=1.0).contains(*v)) {
                return Err(NetError::NotAProbability {
                    name: layer.name.clone(),
                    value,
                });
            }
            let scores = t.data.iter().map(|&p| score_of_theta(p)).collect();
            let weight = signed_constant(seed, layer);
            let [rows, cols] = [layer.rows(), layer.cols()];
            let masked = MaskedLayer {
                scores: param(scores, [rows, cols], device),
                weight: Tensor::from_data(TensorData::new(weight, [rows, cols]), device),
            };
            if layer.name.starts_with("conv") {
                convs.push(masked);
            } else {
                fcs.push(masked);
            }
        }
        Ok(MaskedNet {
            convs,
            fcs,
            side: self.side()?.unwrap_or(0),
        })
    }
}

/// A stable 64-bit key of a tensor name (FNV-1a), the client slot of its streams: the weights
/// of `fc1.weight` do not change when a layer is added elsewhere.
pub fn name_key(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The frozen weights of `layer` for `seed`: `±e·√(1/fan_in)`, row-major, one sign per bit of
/// the [`Purpose::FedpmWeights`] stream keyed by the tensor's name (bit `j mod 64` of word
/// `⌊j/64⌋`; 1 is +).
pub fn signed_constant(seed: u64, layer: &MaskedLayerSpec) -> Vec<f32> {
    let c = (std::f64::consts::E * (1.0 / layer.fan_in as f64).sqrt()) as f32;
    let mut rng = stream(seed, 0, name_key(&layer.name), Purpose::FedpmWeights);
    let mut out = Vec::with_capacity(layer.len());
    while out.len() < layer.len() {
        let word = rng.next_u64();
        let take = (layer.len() - out.len()).min(64);
        out.extend((0..take).map(|bit| if word >> bit & 1 == 1 { c } else { -c }));
    }
    out
}

/// `sigmoid(s)` in f64, kept within `[THETA_EPS, 1 − THETA_EPS]`, as f32.
pub fn theta_of_score(s: f64) -> f32 {
    let theta = 1.0 / (1.0 + (-s).exp());
    theta.clamp(THETA_EPS, 1.0 - THETA_EPS) as f32
}

/// `logit(clamp(θ, 0.01, 0.99))` in f64, as f32.
pub fn score_of_theta(theta: f32) -> f32 {
    let p = f64::from(theta).clamp(THETA_FLOOR, 1.0 - THETA_FLOOR);
    (p / (1.0 - p)).ln() as f32
}

/// One masked layer: scores (trainable) and frozen weights, both `rows × cols` (a convolution
/// `c_out × c_in·k·k`, row-major over (c_in, kh, kw)). The weight is a plain tensor field, not a
/// `Param`: burn treats it as a constant, so no optimizer ever sees it.
#[derive(Module, Debug)]
pub struct MaskedLayer<B: Backend> {
    pub scores: Param<Tensor<B, 2>>,
    pub weight: Tensor<B, 2>,
}

/// Where a mask's uniforms come from and how its gradient flows.
pub enum MaskDraw<'a> {
    /// A training step: fresh uniforms from the stream, and the reference's straight-through
    /// rule (below).
    Train(&'a mut ChaCha20Rng),
    /// Evaluation: uniforms from the stream, no gradient.
    Eval(&'a mut ChaCha20Rng),
}

impl<B: Backend> MaskedLayer<B> {
    /// The mask probabilities θ = sigmoid(s).
    pub fn theta(&self) -> Tensor<B, 2> {
        sigmoid(self.scores.val())
    }

    /// `w_init ⊙ m`, `m_j = 1{u_j < θ_j}` with `u_j` uniform in [0, 1) (24 random bits each,
    /// row-major, two per 64-bit word of the stream).
    ///
    /// In training, `m` carries the reference's gradient (its `Bern` autograd function:
    /// "first-order gradient of Bernoulli with probability p is p"): `∂m/∂θ := θ`, so
    /// `∂L/∂s = ∂L/∂m · θ · θ(1 − θ)`. It is written `m + ½(θ² − detach(θ²))`, whose value is
    /// exactly `m` (x − x = 0 in floating point) and whose derivative in θ is θ. docs/algorithms.md
    /// §4.6 follows the reference here; the plain straight-through estimator would use
    /// `∂m/∂θ := 1`.
    pub fn masked_weight(&self, draw: &mut MaskDraw<'_>) -> Tensor<B, 2> {
        let [rows, cols] = self.weight.dims();
        let rng = match draw {
            MaskDraw::Train(rng) | MaskDraw::Eval(rng) => &mut **rng,
        };
        let uniforms = uniforms_f32(rng, rows * cols);
        let device = self.weight.device();
        let u = Tensor::<B, 2>::from_data(TensorData::new(uniforms, [rows, cols]), &device);
        let theta = self.theta();
        let mask = u.lower(theta.clone().detach()).float();
        let mask = match draw {
            MaskDraw::Train(_) => {
                let half_square = theta.powi_scalar(2).mul_scalar(0.5);
                mask + half_square.clone() - half_square.detach()
            }
            MaskDraw::Eval(_) => mask,
        };
        self.weight.clone() * mask
    }
}

/// `len` uniforms in [0, 1) with 24 random bits each (exact in f32), two per 64-bit word.
fn uniforms_f32(rng: &mut ChaCha20Rng, len: usize) -> Vec<f32> {
    const SCALE: f32 = 1.0 / (1u32 << 24) as f32;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let word = rng.next_u64();
        out.push((word >> 40) as f32 * SCALE);
        if out.len() < len {
            out.push(((word >> 8) & 0x00ff_ffff) as f32 * SCALE);
        }
    }
    out
}

/// A masked network built by [`MaskedNetwork::load`]: convolutions on `side × side` images
/// (none for an MLP), then linear layers.
#[derive(Module, Debug)]
pub struct MaskedNet<B: Backend> {
    pub convs: Vec<MaskedLayer<B>>,
    pub fcs: Vec<MaskedLayer<B>>,
    pub side: usize,
}

impl<B: Kernels> MaskedNet<B> {
    /// One sampled `w_init ⊙ m` per layer, in forward order (convolutions first).
    pub fn sampled_weights(&self, draw: &mut MaskDraw<'_>) -> Vec<Tensor<B, 2>> {
        self.convs
            .iter()
            .chain(&self.fcs)
            .map(|layer| layer.masked_weight(draw))
            .collect()
    }

    /// Logits of the rows `x` (`N × inputs`) with the effective `weights` of
    /// [`MaskedNet::sampled_weights`].
    pub fn forward(&self, x: Tensor<B, 2>, weights: &[Tensor<B, 2>]) -> Tensor<B, 2> {
        let (conv_weights, fc_weights) = weights.split_at(self.convs.len());
        let n = x.dims()[0];
        let mut h = x;
        if !conv_weights.is_empty() {
            let mut image = h.reshape([n, 1, self.side, self.side]);
            for w in conv_weights {
                let geometry = ConvGeometry {
                    kernel: [KERNEL, KERNEL],
                    stride: [1, 1],
                    padding: [1, 1],
                };
                let conv = kernels::conv2d(image, w.clone(), None, geometry);
                image = kernels::pool(relu(conv), Pool::Max, 2);
            }
            let [_, c, height, width] = image.dims();
            h = image.reshape([n, c * height * width]);
        }
        let last = fc_weights.len().saturating_sub(1);
        for (i, w) in fc_weights.iter().enumerate() {
            let y = kernels::linear(h, w.clone());
            h = if i == last { y } else { relu(y) };
        }
        h
    }

    /// θ = sigmoid(s) of every layer as the server's tensors (names and shapes of `layers`),
    /// computed in f64 and kept within `[THETA_EPS, 1 − THETA_EPS]`.
    pub fn export_theta(&self, layers: &[MaskedLayerSpec]) -> Result<ModelState, NetError> {
        let trained: Vec<&MaskedLayer<B>> = self.convs.iter().chain(&self.fcs).collect();
        if trained.len() != layers.len() {
            return Err(NetError::LayerCount {
                trained: trained.len(),
                described: layers.len(),
            });
        }
        let tensors = layers
            .iter()
            .zip(trained)
            .map(|(spec, layer)| {
                let scores = layer
                    .scores
                    .val()
                    .into_data()
                    .into_vec::<f32>()
                    .map_err(|e| NetError::Read {
                        what: format!("the scores of `{}`", spec.name),
                        cause: format!("{e:?}"),
                    })?;
                Ok(NamedTensor {
                    name: spec.name.clone(),
                    shape: spec.shape.clone(),
                    data: scores
                        .iter()
                        .map(|&s| theta_of_score(f64::from(s)))
                        .collect(),
                })
            })
            .collect::<Result<Vec<_>, NetError>>()?;
        Ok(ModelState::new(tensors)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mlp() -> MaskedNetwork {
        MaskedNetwork {
            inputs: 64,
            conv: vec![],
            hidden: vec![32, 16],
            classes: 10,
        }
    }

    #[test]
    fn layers_are_named_like_weights() {
        let names: Vec<(String, Vec<usize>)> = mlp()
            .layers()
            .unwrap()
            .into_iter()
            .map(|l| (l.name, l.shape))
            .collect();
        assert_eq!(
            names,
            [
                ("fc0.weight".to_string(), vec![32, 64]),
                ("fc1.weight".to_string(), vec![16, 32]),
                ("fc2.weight".to_string(), vec![10, 16]),
            ]
        );
        let cnn = MaskedNetwork {
            inputs: 28 * 28,
            conv: vec![8, 16],
            hidden: vec![32],
            classes: 10,
        };
        let layers = cnn.layers().unwrap();
        assert_eq!(layers[0].shape, [8, 1, 3, 3]);
        assert_eq!(
            (layers[1].shape.clone(), layers[1].fan_in),
            (vec![16, 8, 3, 3], 72)
        );
        assert_eq!(layers[2].shape, [32, 16 * 7 * 7]);
        let three = MaskedNetwork {
            conv: vec![8, 8, 8],
            ..cnn
        };
        assert!(
            three
                .layers()
                .unwrap_err()
                .to_string()
                .contains("not divisible by 8")
        );
    }

    #[test]
    fn signed_constants_are_balanced_and_keyed_by_name() {
        let layers = mlp().layers().unwrap();
        let w = signed_constant(3, &layers[0]);
        let c = (std::f64::consts::E / 8.0) as f32;
        assert!(w.iter().all(|&v| v == c || v == -c));
        let positive = w.iter().filter(|&&v| v > 0.0).count() as f64 / w.len() as f64;
        assert!((positive - 0.5).abs() < 0.05, "{positive}");
        assert_eq!(w, signed_constant(3, &layers[0]));
        assert_ne!(w, signed_constant(4, &layers[0]));
        let renamed = MaskedLayerSpec {
            name: "other.weight".into(),
            ..layers[0].clone()
        };
        assert_ne!(w, signed_constant(3, &renamed));
    }

    #[test]
    fn scores_and_probabilities_round_trip_within_the_clamp() {
        for theta in [0.01f32, 0.2, 0.5, 0.87, 0.99] {
            let back = theta_of_score(f64::from(score_of_theta(theta)));
            assert!((back - theta).abs() < 1e-6, "{theta} → {back}");
        }
        assert_eq!(score_of_theta(0.0), score_of_theta(0.01));
        assert_eq!(score_of_theta(1.0), score_of_theta(0.99));
        assert!(theta_of_score(60.0) < 1.0 && theta_of_score(-60.0) > 0.0);
    }

    #[test]
    fn uniforms_are_in_the_unit_interval_and_spread() {
        let mut rng = stream(1, 0, 0, Purpose::FedpmMasks);
        let u = uniforms_f32(&mut rng, 10_001);
        assert_eq!(u.len(), 10_001);
        assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = u.iter().map(|&x| f64::from(x)).sum::<f64>() / u.len() as f64;
        assert!((mean - 0.5).abs() < 0.01, "{mean}");
    }
}
