//! Models from ONNX files (`[model] kind = "onnx"`): a graph exported by `torch.onnx.export`
//! is read at run time (no code generation) and built through the same
//! [`Builder`](crate::models::builder::Builder) as the shipped models, so each `Conv` and each
//! `Gemm`/`MatMul` whose weight is an initializer is a shardable layer, trained on the same
//! kernels, its initial values the file's initializers (docs/onnx.md).
//!
//! [`graph`] decodes the file into plain data, [`ops`] parses and checks each node's operator,
//! [`plan`] resolves the graph against its input shape into steps over activations,
//! parameters and constants (refusing what it cannot run, before any run), and [`net`] is
//! the burn module that interprets those steps; [`widths`] traces the graph's hidden widths
//! for the width strategies and narrows the plan to a client's slice. [`export`] writes a
//! trained model back as ONNX through [`mod@write`], with the same protobuf types.

pub mod export;
pub mod graph;
pub mod net;
pub mod ops;
pub mod plan;
pub mod widths;
pub mod write;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_export;
#[cfg(test)]
mod tests_ops;
#[cfg(test)]
mod tests_widths;

use crate::models::onnx::graph::Graph;
use crate::models::onnx::ops::SUPPORTED;
use crate::models::onnx::plan::Plan;
use crate::models::onnx::widths::Widths;
use fedshard_protocol::model::ModelState;
use fedshard_protocol::stored::read_regular;
use std::path::Path;
use std::sync::Arc;
use thiserror::Error;

pub use net::OnnxNet;

/// The largest ONNX file read (weights inline): 512 MiB.
pub const MAX_FILE_BYTES: u64 = 512 << 20;

/// Why an ONNX file cannot be trained: the file and the problem.
#[derive(Debug, Error)]
#[error("{file}: {problem}")]
pub struct OnnxError {
    pub file: String,
    pub problem: Box<Problem>,
}

impl OnnxError {
    pub fn new(file: &str, problem: Problem) -> Self {
        Self {
            file: file.to_string(),
            problem: Box::new(problem),
        }
    }
}

/// What is wrong with an ONNX file; each variant names the node, tensor or dimension.
#[derive(Debug, Error)]
pub enum Problem {
    #[error("cannot read it: {0}")]
    Read(String),
    #[error("not an ONNX model: {0}")]
    Decode(String),
    #[error("{0}")]
    Graph(String),
    #[error(
        "node `{node}`: operator {op} is not supported (supported: {})",
        SUPPORTED.join(", ")
    )]
    Unsupported { node: String, op: String },
    #[error("node `{node}` ({op}): attribute `{attribute}` is {found}, supported: {expected}")]
    Attribute {
        node: String,
        op: String,
        attribute: String,
        found: String,
        expected: String,
    },
    #[error("node `{node}` ({op}): {what}")]
    Node {
        node: String,
        op: String,
        what: String,
    },
    #[error("tensor `{name}` has ONNX data type {code}; supported: 1 (float32), 7 (int64)")]
    DataType { name: String, code: i32 },
    #[error("the model's input `{name}` has shape {found}, the data's rows are {expected}")]
    InputShape {
        name: String,
        found: String,
        expected: String,
    },
}

/// A checked ONNX model: its graph resolved into a [`Plan`], and the initial values of its
/// trainable tensors.
#[derive(Debug)]
pub struct OnnxModel {
    /// The file's name, for messages.
    pub file: String,
    pub plan: Arc<Plan>,
    /// The graph's hidden widths, traced once when the file is read.
    pub widths: Widths,
}

impl OnnxModel {
    /// Reads and checks `path` (a regular file of at most [`MAX_FILE_BYTES`]).
    pub fn read(path: &Path) -> Result<Self, OnnxError> {
        let file = path.display().to_string();
        let bytes = read_regular(path, MAX_FILE_BYTES, "an ONNX model")
            .map_err(|e| OnnxError::new(&file, Problem::Read(e.to_string())))?;
        Self::from_bytes(&file, &bytes)
    }

    /// Decodes and checks an ONNX file's bytes; `file` names it in errors.
    pub fn from_bytes(file: &str, bytes: &[u8]) -> Result<Self, OnnxError> {
        let graph = Graph::decode(file, bytes)?;
        let plan = Plan::new(&graph).map_err(|p| OnnxError::new(file, p))?;
        Ok(Self::from_plan(file, plan))
    }

    /// A model of a resolved plan, its widths traced.
    pub fn from_plan(file: &str, plan: Plan) -> Self {
        Self {
            file: file.to_string(),
            widths: Widths::trace(&plan),
            plan: Arc::new(plan),
        }
    }

    /// Features per input row (the product of the input's dimensions after the batch's).
    pub fn input_width(&self) -> usize {
        self.plan.input_tail.iter().product()
    }

    /// Refuses data whose rows do not have the model's input width.
    pub fn check_input(&self, width: usize) -> Result<(), OnnxError> {
        if width == self.input_width() {
            return Ok(());
        }
        Err(OnnxError::new(
            &self.file,
            Problem::InputShape {
                name: self.plan.input_name.clone(),
                found: format!(
                    "[N, {:?}] ({} features)",
                    self.plan.input_tail,
                    self.input_width()
                ),
                expected: format!("{width} features"),
            },
        ))
    }

    /// The plan a builder builds: the whole graph, or in a narrowed load (a width slice) the
    /// graph narrowed to the units the builder keeps of each width.
    pub fn plan_for<B: burn::tensor::backend::Backend>(
        &self,
        builder: &crate::models::builder::Builder<B>,
    ) -> Arc<Plan> {
        let units: std::collections::BTreeMap<String, usize> = self
            .widths
            .groups
            .iter()
            .map(|g| (g.name.clone(), builder.units(&g.name, g.units)))
            .collect();
        if self.widths.groups.iter().all(|g| units[&g.name] == g.units) {
            return self.plan.clone();
        }
        Arc::new(self.widths.narrow(&self.plan, &units))
    }

    /// The file's trainable initializers as the server's initial state.
    pub fn initial_state(&self) -> &ModelState {
        &self.plan.initial
    }
}

/// An ONNX model named by its path, as a config names it: read and checked when the config is
/// (deserialising it reads the file), written back as the path. Two are equal when their
/// paths are.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "std::path::PathBuf", into = "std::path::PathBuf")]
pub struct OnnxFile {
    pub path: std::path::PathBuf,
    pub model: Arc<OnnxModel>,
}

impl OnnxFile {
    pub fn read(path: &Path) -> Result<Self, OnnxError> {
        Ok(Self {
            path: path.to_path_buf(),
            model: Arc::new(OnnxModel::read(path)?),
        })
    }
}

impl TryFrom<std::path::PathBuf> for OnnxFile {
    type Error = OnnxError;

    fn try_from(path: std::path::PathBuf) -> Result<Self, OnnxError> {
        Self::read(&path)
    }
}

impl From<OnnxFile> for std::path::PathBuf {
    fn from(file: OnnxFile) -> Self {
        file.path
    }
}

impl PartialEq for OnnxFile {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path
    }
}

impl std::fmt::Debug for OnnxFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.path)
    }
}
