//! What model a node's config builds, as a hello carries it: a node started from a config with
//! another architecture would train tensors of other shapes, so every one of its updates would
//! fail and the run would go on without it, silently. The server compares the digest of the
//! tensors' names and shapes (and the model kind) and refuses the hello, naming both models.

use fedshard_protocol::model::ModelState;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::hash::Hasher;

/// The model kind, the tensors' names and shapes, summarised for people and digested for the
/// comparison.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// Such as `softmax: 650 parameters in 2 tensors`.
    pub description: String,
    /// FNV-1a of the kind and every tensor's name and shape, in name order.
    pub digest: u64,
}

impl ModelSpec {
    /// The longest description a server prints from a peer's hello.
    pub const MAX_DESCRIPTION: usize = 256;

    /// The spec of the model `state` of the config's model kind `kind` (`softmax`, `neural`…).
    pub fn of(kind: &str, state: &ModelState) -> Self {
        let mut hasher = fnv::FnvHasher::default();
        hasher.write(kind.as_bytes());
        hasher.write_u8(0);
        let mut parameters = 0usize;
        for tensor in &state.tensors {
            hasher.write(tensor.name.as_bytes());
            hasher.write_u8(0);
            hasher.write_usize(tensor.shape.len());
            for &dim in &tensor.shape {
                hasher.write_u64(dim as u64);
            }
            parameters += tensor.shape.iter().product::<usize>();
        }
        Self {
            description: format!(
                "{kind}: {parameters} parameters in {} tensors",
                state.tensors.len()
            ),
            digest: hasher.finish(),
        }
    }

    /// Why a node whose config builds `node's` cannot join a server training `self`, if it
    /// cannot. A description that is too long or not printable is refused on its own (it is
    /// peer input and goes into the log).
    pub fn refusal(&self, node: &ModelSpec) -> Option<String> {
        if node.description.len() > Self::MAX_DESCRIPTION
            || node.description.chars().any(char::is_control)
        {
            return Some(format!(
                "a model description must be at most {} printable characters",
                Self::MAX_DESCRIPTION
            ));
        }
        (node.digest != self.digest).then(|| {
            format!(
                "the server trains {self}; this node's config has {node}: start every node \
                 from the server's config"
            )
        })
    }
}

impl fmt::Display for ModelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (digest {:016x})", self.description, self.digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedshard_protocol::model::NamedTensor;

    fn mlp(widths: &[usize]) -> ModelState {
        let mut tensors = Vec::new();
        for (i, pair) in widths.windows(2).enumerate() {
            tensors.push(NamedTensor::zeros(
                format!("fc{i}.weight"),
                vec![pair[1], pair[0]],
            ));
            tensors.push(NamedTensor::zeros(format!("fc{i}.bias"), vec![pair[1]]));
        }
        ModelState::new(tensors).unwrap()
    }

    #[test]
    fn another_architecture_is_refused_naming_both_models() {
        let server = ModelSpec::of("softmax", &mlp(&[64, 10]));
        assert_eq!(server.description, "softmax: 650 parameters in 2 tensors");
        assert_eq!(
            server.refusal(&ModelSpec::of("softmax", &mlp(&[64, 10]))),
            None
        );
        let node = ModelSpec::of("neural", &mlp(&[64, 32, 10]));
        let refusal = server.refusal(&node).unwrap();
        assert!(
            refusal.contains("the server trains softmax: 650 parameters")
                && refusal.contains("this node's config has neural: 2410 parameters")
                && refusal.contains(&format!("{:016x}", server.digest))
                && refusal.contains(&format!("{:016x}", node.digest)),
            "{refusal}"
        );
        // Same parameter count, other shapes: still another model.
        let transposed = ModelSpec::of("softmax", &mlp(&[10, 64]));
        assert_ne!(transposed.digest, server.digest);
    }

    #[test]
    fn a_description_that_is_not_printable_is_refused() {
        let server = ModelSpec::of("softmax", &mlp(&[64, 10]));
        let forged = ModelSpec {
            description: "x\n".repeat(10),
            digest: server.digest,
        };
        assert!(server.refusal(&forged).unwrap().contains("printable"));
    }
}
