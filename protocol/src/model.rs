//! The global model as the server holds it: named f32 tensors in a fixed order.
//!
//! Nothing here knows what the tensors mean; models (in `fedshard`) name them and say which are
//! decomposable for spectral sharding.

use crate::stored::{FileError, Format};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One named tensor, row-major.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl NamedTensor {
    /// A tensor whose data length is checked against its shape.
    pub fn new(
        name: impl Into<String>,
        shape: Vec<usize>,
        data: Vec<f32>,
    ) -> Result<Self, ModelError> {
        let name = name.into();
        let expected: usize = shape.iter().product();
        if expected != data.len() {
            return Err(ModelError::Shape {
                tensor: name,
                expected: format!("{} values for shape {shape:?}", expected),
                found: format!("{} values", data.len()),
            });
        }
        Ok(Self { name, shape, data })
    }

    /// A zero tensor of the given shape.
    pub fn zeros(name: impl Into<String>, shape: Vec<usize>) -> Self {
        let len = shape.iter().product();
        Self {
            name: name.into(),
            shape,
            data: vec![0.0; len],
        }
    }

    /// Rows and columns of the matrix this tensor is sharded as: `(shape[0], Π shape[1..])`, so
    /// a conv kernel (out, in, kh, kw) is the (out, in·kh·kw) matrix of docs/algorithms.md §1.8.
    pub fn matrix_shape(&self) -> (usize, usize) {
        match self.shape.split_first() {
            Some((rows, rest)) => (*rows, rest.iter().product()),
            None => (1, 1),
        }
    }
}

/// Why two model states cannot be combined.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    #[error("tensor `{tensor}`: expected {expected}, found {found}")]
    Shape {
        tensor: String,
        expected: String,
        found: String,
    },
    #[error("tensor `{0}` is missing")]
    Missing(String),
    #[error("tensor `{tensor}` has a non-finite value at position {position}")]
    NonFinite { tensor: String, position: usize },
    #[error("model bytes are malformed: {0}")]
    Bytes(String),
}

/// A whole model: tensors sorted by name, so two states with the same content compare and
/// serialise identically.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ModelState {
    pub tensors: Vec<NamedTensor>,
}

impl ModelState {
    /// Zeros of this state's tensors (names and shapes kept): SCAFFOLD's variates before their
    /// first round.
    pub fn zeros_like(&self) -> Self {
        let tensors = self
            .tensors
            .iter()
            .map(|t| NamedTensor::zeros(t.name.clone(), t.shape.clone()))
            .collect();
        Self { tensors }
    }

    /// Builds a state, sorting the tensors by name and rejecting duplicate names.
    pub fn new(mut tensors: Vec<NamedTensor>) -> Result<Self, ModelError> {
        tensors.sort_by(|a, b| a.name.cmp(&b.name));
        if let Some(w) = tensors.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(ModelError::Shape {
                tensor: w[0].name.clone(),
                expected: "one tensor per name".into(),
                found: "two".into(),
            });
        }
        Ok(Self { tensors })
    }

    pub fn get(&self, name: &str) -> Option<&NamedTensor> {
        self.tensors
            .binary_search_by(|t| t.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.tensors[i])
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut NamedTensor> {
        self.tensors
            .binary_search_by(|t| t.name.as_str().cmp(name))
            .ok()
            .map(|i| &mut self.tensors[i])
    }

    /// The tensor called `name`, or an error naming it.
    pub fn require(&self, name: &str) -> Result<&NamedTensor, ModelError> {
        self.get(name)
            .ok_or_else(|| ModelError::Missing(name.to_string()))
    }

    /// Whether every value is finite.
    pub fn is_finite(&self) -> bool {
        self.check_finite().is_ok()
    }

    pub fn num_parameters(&self) -> usize {
        self.tensors.iter().map(|t| t.data.len()).sum()
    }

    /// Same names and shapes as `reference`, in the same order; names the first difference.
    pub fn check_compatible(&self, reference: &ModelState) -> Result<(), ModelError> {
        for t in &reference.tensors {
            let mine = self
                .get(&t.name)
                .ok_or_else(|| ModelError::Missing(t.name.clone()))?;
            if mine.shape != t.shape || mine.data.len() != t.data.len() {
                return Err(ModelError::Shape {
                    tensor: t.name.clone(),
                    expected: format!("shape {:?}", t.shape),
                    found: format!("shape {:?} with {} values", mine.shape, mine.data.len()),
                });
            }
        }
        if let Some(extra) = self
            .tensors
            .iter()
            .find(|t| reference.get(&t.name).is_none())
        {
            return Err(ModelError::Shape {
                tensor: extra.name.clone(),
                expected: "no such tensor".into(),
                found: "an extra tensor".into(),
            });
        }
        Ok(())
    }

    /// The first non-finite value, if any.
    pub fn check_finite(&self) -> Result<(), ModelError> {
        for t in &self.tensors {
            if let Some(position) = t.data.iter().position(|v| !v.is_finite()) {
                return Err(ModelError::NonFinite {
                    tensor: t.name.clone(),
                    position,
                });
            }
        }
        Ok(())
    }

    /// Exact bytes of the model (bincode of names, shapes and little-endian values): two runs
    /// that agree bit for bit produce the same bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Encoding plain vectors and strings into a Vec cannot fail.
        bincode::serde::encode_to_vec(self, bincode::config::standard())
            .unwrap_or_else(|e| unreachable!("in-memory bincode encoding failed: {e}"))
    }

    /// The model of [`Self::to_bytes`]; what the bytes claim to hold is bounded by their length
    /// ([`crate::bounded`]), so a damaged length cannot ask for terabytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, ModelError> {
        let (state, used): (ModelState, usize) = crate::bounded::decode_from_slice(bytes)
            .map_err(|e| ModelError::Bytes(e.to_string()))?;
        if used != bytes.len() {
            return Err(ModelError::Bytes(format!(
                "{} trailing bytes",
                bytes.len() - used
            )));
        }
        Ok(state)
    }

    /// The bytes of a model file (`model.bin`): [`MODEL_FILE`]'s header, then [`Self::to_bytes`].
    pub fn to_file_bytes(&self) -> Vec<u8> {
        MODEL_FILE.encode(&self.to_bytes())
    }

    /// The model in the file `path` written from [`Self::to_file_bytes`]; a file that is not a
    /// regular one, of another version, damaged, or whose values are not all finite is refused
    /// naming it.
    pub fn read_file(path: &Path) -> Result<Self, FileError> {
        let malformed = |reason: String| FileError::malformed(path, MODEL_FILE.what, reason);
        let state =
            Self::from_bytes(&MODEL_FILE.read(path)?).map_err(|e| malformed(e.to_string()))?;
        state.check_finite().map_err(|e| malformed(e.to_string()))?;
        Ok(state)
    }
}

/// A model file: the final model of a run (`model.bin`). Version 1: the model bytes of
/// [`ModelState::to_bytes`].
pub const MODEL_FILE: Format = Format {
    what: "a fedshard model",
    magic: *b"FSMODEL\0",
    version: 1,
};

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> ModelState {
        ModelState::new(vec![
            NamedTensor::new("w", vec![2, 3], vec![1.0; 6]).unwrap(),
            NamedTensor::new("b", vec![2], vec![0.5, -0.5]).unwrap(),
        ])
        .unwrap()
    }

    #[test]
    fn tensors_are_sorted_and_found() {
        let s = state();
        assert_eq!(s.tensors[0].name, "b");
        assert_eq!(s.get("w").unwrap().matrix_shape(), (2, 3));
        assert_eq!(s.num_parameters(), 8);
    }

    #[test]
    fn bytes_round_trip_exactly() {
        let s = state();
        assert_eq!(ModelState::from_bytes(&s.to_bytes()).unwrap(), s);
        let mut bytes = s.to_bytes();
        bytes.push(0);
        assert!(ModelState::from_bytes(&bytes).is_err());
    }

    /// A model file round-trips; a flipped byte in the middle of its values (which bincode alone
    /// would read as another finite or NaN value) is refused naming the file.
    #[test]
    fn a_model_file_round_trips_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.bin");
        let s = state();
        std::fs::write(&path, s.to_file_bytes()).unwrap();
        assert_eq!(ModelState::read_file(&path).unwrap(), s);
        let mut bytes = s.to_file_bytes();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let error = ModelState::read_file(&path).unwrap_err().to_string();
        assert!(
            error.contains("model.bin") && error.contains("checksum"),
            "{error}"
        );
        // An intact file of a model that is not finite is no model either.
        let mut nan = s.clone();
        nan.get_mut("w").unwrap().data[2] = f32::NAN;
        std::fs::write(&path, nan.to_file_bytes()).unwrap();
        let error = ModelState::read_file(&path).unwrap_err().to_string();
        assert!(error.contains("non-finite"), "{error}");
    }

    #[test]
    fn compatibility_names_the_tensor() {
        let s = state();
        let mut other = s.clone();
        other.get_mut("w").unwrap().shape = vec![3, 2];
        let err = other.check_compatible(&s).unwrap_err().to_string();
        assert!(err.contains("`w`"), "{err}");
        let mut nan = s.clone();
        nan.get_mut("b").unwrap().data[1] = f32::NAN;
        assert!(nan.check_finite().is_err());
        assert!(NamedTensor::new("x", vec![2, 2], vec![0.0; 3]).is_err());
    }
}
