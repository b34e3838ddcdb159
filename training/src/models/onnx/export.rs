//! A trained model written back as ONNX (`fedshard export`): a model read from ONNX as its
//! own graph with the trained initializers ([`super::write::substitute`]); a shipped MLP or CNN as a
//! graph fedshard writes, node for node the layers its constructor asks the
//! [`Builder`](crate::models::builder::Builder) for, under the same tensor names, so reading
//! the file back as `kind = "onnx"` makes the same Builder calls and trains to the same bytes
//! (docs/onnx.md, "Export").

use crate::models::cnn::{CnnShape, GROUPS};
use crate::models::kernels::{NORM_EPS, Pool};
use crate::models::net::Architecture;
use crate::models::onnx::write::{Attr, GraphWriter, substitute};
use crate::models::onnx::{MAX_FILE_BYTES, OnnxError, OnnxModel, Problem};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::stored::read_regular;
use std::collections::BTreeSet;
use thiserror::Error;

/// Why a model cannot be written as ONNX.
#[derive(Debug, Error)]
pub enum ExportError {
    #[error(
        "the {architecture} architecture cannot be written as ONNX: fedshard writes mlp, \
         softmax, digits-cnn, mnist-cnn and models read from ONNX (docs/onnx.md)"
    )]
    Unsupported { architecture: &'static str },
    #[error(
        "the model has no tensor `{name}`, which the {architecture} architecture needs (a \
         model of another config?)"
    )]
    Missing {
        architecture: &'static str,
        name: String,
    },
    #[error(
        "tensor `{name}` has shape {found:?}, the {architecture} architecture's is {expected:?}"
    )]
    Shape {
        architecture: &'static str,
        name: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("the model holds tensors the {architecture} architecture does not have: {names:?}")]
    Extra {
        architecture: &'static str,
        names: Vec<String>,
    },
    #[error("{file}: initializer `{name}`: {what}")]
    Initializer {
        file: String,
        name: String,
        what: String,
    },
    #[error(transparent)]
    Onnx(#[from] OnnxError),
    #[error("encoding the ONNX model: {0}")]
    Encode(String),
}

/// The architecture's name as a config spells it.
fn name_of(architecture: &Architecture) -> &'static str {
    match architecture {
        Architecture::Mlp { .. } => "mlp",
        Architecture::DigitsCnn { .. } => "digits-cnn",
        Architecture::MnistCnn { .. } => "mnist-cnn",
        Architecture::CharTransformer(_) => "char-transformer",
        Architecture::Resnet18 { .. } => "resnet18",
        Architecture::Cct { .. } => "cct",
        Architecture::Onnx { .. } => "onnx",
    }
}

/// `state` (a global model of `architecture`) as the bytes of an ONNX file. A model read from
/// ONNX is re-read from its path, which must still hold a graph with an initializer for every
/// tensor of `state`.
pub fn to_onnx(architecture: &Architecture, state: &ModelState) -> Result<Vec<u8>, ExportError> {
    let name = name_of(architecture);
    let mut w = Shipped {
        architecture: name,
        state,
        used: BTreeSet::new(),
        graph: GraphWriter::new(name),
    };
    match architecture {
        Architecture::Mlp {
            inputs,
            hidden,
            classes,
        } => w.mlp(*inputs, hidden, *classes)?,
        Architecture::DigitsCnn { classes } => w.cnn(CnnShape::DIGITS, *classes)?,
        Architecture::MnistCnn { classes } => w.cnn(CnnShape::MNIST, *classes)?,
        Architecture::Onnx { path } => {
            let file = path.path.display().to_string();
            let bytes = read_regular(&path.path, MAX_FILE_BYTES, "an ONNX model")
                .map_err(|e| OnnxError::new(&file, Problem::Read(e.to_string())))?;
            let model = OnnxModel::from_bytes(&file, &bytes)?;
            return substitute(&file, &bytes, &model.plan, state);
        }
        Architecture::CharTransformer(_)
        | Architecture::Resnet18 { .. }
        | Architecture::Cct { .. } => {
            return Err(ExportError::Unsupported { architecture: name });
        }
    }
    w.finish()
}

/// The graph of a shipped model being written, and the tensors of `state` it has taken.
struct Shipped<'s> {
    architecture: &'static str,
    state: &'s ModelState,
    used: BTreeSet<String>,
    graph: GraphWriter,
}

impl Shipped<'_> {
    /// Writes tensor `name` of `shape` from the state as an initializer.
    fn take(&mut self, name: &str, shape: &[usize]) -> Result<(), ExportError> {
        let t = self.state.get(name).ok_or_else(|| ExportError::Missing {
            architecture: self.architecture,
            name: name.to_string(),
        })?;
        if t.shape != shape {
            return Err(ExportError::Shape {
                architecture: self.architecture,
                name: name.to_string(),
                found: t.shape.clone(),
                expected: shape.to_vec(),
            });
        }
        self.graph.initializer(t);
        self.used.insert(name.to_string());
        Ok(())
    }

    /// `Gemm` (`transB = 1`, weight `c_out × c_in` as the Builder holds it) of layer `name`.
    fn gemm(
        &mut self,
        name: &str,
        input: &str,
        c_in: usize,
        c_out: usize,
    ) -> Result<(), ExportError> {
        let inputs = self.layer(name, input, &[c_out, c_in])?;
        let attrs = [("transB", Attr::Int(1))];
        self.graph.node("Gemm", name, &inputs, name, &attrs);
        Ok(())
    }

    /// The inputs of layer `name`: `input`, then its weight of `shape` and its bias (as long
    /// as the weight's first dimension), both taken from the state.
    fn layer(
        &mut self,
        name: &str,
        input: &str,
        shape: &[usize],
    ) -> Result<[String; 3], ExportError> {
        let (weight, bias) = (format!("{name}.weight"), format!("{name}.bias"));
        self.take(&weight, shape)?;
        self.take(&bias, &shape[..1])?;
        Ok([input.to_string(), weight, bias])
    }

    /// A 3×3 `Conv` of stride 1 and padding 1 of layer `name`.
    fn conv(
        &mut self,
        name: &str,
        input: &str,
        c_in: usize,
        c_out: usize,
    ) -> Result<(), ExportError> {
        let inputs = self.layer(name, input, &[c_out, c_in, 3, 3])?;
        let attrs = [
            ("kernel_shape", Attr::Ints(vec![3, 3])),
            ("strides", Attr::Ints(vec![1, 1])),
            ("pads", Attr::Ints(vec![1, 1, 1, 1])),
        ];
        self.graph.node("Conv", name, &inputs, name, &attrs);
        Ok(())
    }

    /// `GroupNormalization` (or `LayerNormalization` when `groups` is `None`) of norm `name`
    /// over `channels`, then `Relu` when `relu`; returns the output's name.
    fn norm(
        &mut self,
        name: &str,
        input: &str,
        channels: usize,
        groups: Option<usize>,
        relu: bool,
    ) -> Result<String, ExportError> {
        let (scale, bias) = (format!("{name}.weight"), format!("{name}.bias"));
        self.take(&scale, &[channels])?;
        self.take(&bias, &[channels])?;
        let epsilon = ("epsilon", Attr::Float(NORM_EPS));
        let inputs = [input, &scale, &bias];
        match groups {
            Some(g) => {
                let attrs = [epsilon, ("num_groups", Attr::Int(g as i64))];
                self.graph
                    .node("GroupNormalization", name, &inputs, name, &attrs);
            }
            None => {
                let attrs = [epsilon, ("axis", Attr::Int(-1))];
                self.graph
                    .node("LayerNormalization", name, &inputs, name, &attrs);
            }
        }
        if !relu {
            return Ok(name.to_string());
        }
        let out = format!("{name}.relu");
        self.graph.node("Relu", &out, &[name], &out, &[]);
        Ok(out)
    }

    /// A 2×2 pooling of disjoint blocks.
    fn pool(&mut self, name: &str, input: &str, kind: Pool) {
        let op = match kind {
            Pool::Max => "MaxPool",
            Pool::Average => "AveragePool",
        };
        let attrs = [
            ("kernel_shape", Attr::Ints(vec![2, 2])),
            ("strides", Attr::Ints(vec![2, 2])),
        ];
        self.graph.node(op, name, &[input], name, &attrs);
    }

    /// [`Mlp`](crate::models::mlp::Mlp): `fc0 … fcL`, a ReLU between two layers.
    fn mlp(&mut self, inputs: usize, hidden: &[usize], classes: usize) -> Result<(), ExportError> {
        let widths: Vec<usize> = std::iter::once(inputs)
            .chain(hidden.iter().copied())
            .chain(std::iter::once(classes))
            .collect();
        self.graph.input("input", &[inputs]);
        let mut x = "input".to_string();
        let last = widths.len() - 2;
        for (i, w) in widths.windows(2).enumerate() {
            let name = format!("fc{i}");
            self.gemm(&name, &x, w[0], w[1])?;
            x = name;
            if i != last {
                let relu = format!("{x}.relu");
                self.graph.node("Relu", &relu, &[&x], &relu, &[]);
                x = relu;
            }
        }
        self.output(&x, classes);
        Ok(())
    }

    /// [`Cnn`](crate::models::cnn::Cnn): its forward pass, layer for layer.
    fn cnn(&mut self, shape: CnnShape, classes: usize) -> Result<(), ExportError> {
        let [w0, w1, w2] = shape.widths;
        self.graph
            .input("input", &[shape.channels, shape.side, shape.side]);
        self.conv("conv0", "input", shape.channels, w0)?;
        let x = self.norm("norm0", "conv0", w0, Some(GROUPS), true)?;
        self.conv("conv1", &x, w0, w1)?;
        let x = self.norm("norm1", "conv1", w1, Some(GROUPS), true)?;
        self.pool("pool1", &x, Pool::Max);
        self.conv("conv2", "pool1", w1, w2)?;
        let x = self.norm("norm2", "conv2", w2, Some(GROUPS), true)?;
        self.pool("pool2", &x, shape.last_pool);
        let flat = w2 * (shape.side / 4) * (shape.side / 4);
        let attrs = [("axis", Attr::Int(1))];
        self.graph
            .node("Flatten", "flatten", &["pool2"], "flatten", &attrs);
        self.gemm("fc0", "flatten", flat, shape.hidden)?;
        let x = self.norm("norm3", "fc0", shape.hidden, None, true)?;
        self.gemm("fc1", &x, shape.hidden, classes)?;
        self.output("fc1", classes);
        Ok(())
    }

    fn output(&mut self, name: &str, classes: usize) {
        self.graph.output(name, classes);
    }

    /// The encoded graph, once every tensor of the state went into it.
    fn finish(self) -> Result<Vec<u8>, ExportError> {
        let extra: Vec<String> = self
            .state
            .tensors
            .iter()
            .map(|t| t.name.clone())
            .filter(|n| !self.used.contains(n))
            .collect();
        if !extra.is_empty() {
            return Err(ExportError::Extra {
                architecture: self.architecture,
                names: extra,
            });
        }
        self.graph.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::onnx::plan::Kernel;
    use fedshard_protocol::model::NamedTensor;
    use std::path::PathBuf;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/onnx")
            .join(name)
    }

    /// `state` with every value moved by an amount that depends on its position, so a value
    /// written to the wrong place (a transpose forgotten) cannot read back equal.
    fn moved(state: &ModelState) -> ModelState {
        let tensors = state
            .tensors
            .iter()
            .map(|t| NamedTensor {
                data: (t.data.iter().enumerate())
                    .map(|(i, v)| v + 0.25 + i as f32 * 1e-3)
                    .collect(),
                ..t.clone()
            })
            .collect();
        ModelState::new(tensors).expect("same names")
    }

    /// Every committed PyTorch export, both exporters (Gemm, MatMul weights held transposed,
    /// convolutions, GroupNorm's γ and β as other initializers): trained values written into
    /// the file read back as exactly those values.
    #[test]
    fn trained_values_substituted_into_a_users_graph_read_back_unchanged() {
        for name in [
            "mlp.onnx",
            "mlp.dynamo.onnx",
            "lenet.onnx",
            "lenet.dynamo.onnx",
            "resnet_gn.onnx",
            "resnet_gn.dynamo.onnx",
        ] {
            let path = fixture(name);
            let model = OnnxModel::read(&path).expect("fixture loads");
            let trained = moved(model.initial_state());
            let file = crate::models::onnx::OnnxFile::read(&path).expect("reads");
            let bytes = to_onnx(&Architecture::Onnx { path: file }, &trained).expect("exports");
            let back = OnnxModel::from_bytes(name, &bytes).expect("reads back");
            assert_eq!(back.initial_state(), &trained, "{name}");
        }
    }

    /// The shipped MLP and CNNs are written with the shipped names and read back as the same
    /// tensors; the CNN's GroupNorms run fused with their ReLU, its LayerNorm on its own kernel.
    #[test]
    fn shipped_models_read_back_under_their_names() {
        for architecture in [
            Architecture::digits_mlp(),
            Architecture::Mlp {
                inputs: 64,
                hidden: Vec::new(),
                classes: 10,
            },
            Architecture::DigitsCnn { classes: 10 },
            Architecture::MnistCnn { classes: 10 },
        ] {
            let (state, _) = architecture.initial_state(3).expect("builds");
            let bytes = to_onnx(&architecture, &state).expect("exports");
            let back = OnnxModel::from_bytes("shipped", &bytes).expect("reads back");
            assert_eq!(back.initial_state(), &state, "{architecture:?}");
            assert_eq!(back.input_width(), architecture.input_width());
            let fused = (back.plan.steps.iter())
                .filter(|s| matches!(s.kernel, Kernel::GroupNorm { relu: true, .. }))
                .count();
            let cnn = !matches!(architecture, Architecture::Mlp { .. });
            assert_eq!(fused, if cnn { 3 } else { 0 }, "{architecture:?}");
        }
    }

    /// An architecture fedshard does not write, and a state of another architecture, are
    /// refused naming the architecture and the tensor.
    #[test]
    fn what_cannot_be_written_is_refused_naming_it() {
        let (state, _) = Architecture::digits_mlp().initial_state(0).expect("builds");
        for (architecture, name) in [
            (Architecture::Resnet18 { classes: 10 }, "resnet18"),
            (Architecture::Cct { classes: 10 }, "cct"),
        ] {
            let e = to_onnx(&architecture, &state).expect_err("not written");
            assert!(e.to_string().contains(name), "{e}");
        }
        let e = to_onnx(&Architecture::DigitsCnn { classes: 10 }, &state).expect_err("other");
        assert!(e.to_string().contains("conv0.weight"), "{e}");
        let wide = Architecture::Mlp {
            inputs: 64,
            hidden: vec![64],
            classes: 10,
        };
        let e = to_onnx(&wide, &state).expect_err("other shape");
        assert!(e.to_string().contains("fc0.weight"), "{e}");
        let softmax = Architecture::Mlp {
            inputs: 64,
            hidden: Vec::new(),
            classes: 10,
        };
        let (mut tensors, _) = softmax.initial_state(0).expect("builds");
        let extra = NamedTensor::new("fc9.weight", vec![1], vec![0.0]).expect("a tensor");
        tensors.tensors.push(extra);
        let state = ModelState::new(tensors.tensors).expect("distinct names");
        let e = to_onnx(&softmax, &state).expect_err("extra tensors");
        assert!(e.to_string().contains("fc9.weight"), "{e}");
    }
}
