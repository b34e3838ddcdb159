//! Model parameters as an ordered list of named `f32` tensors: the common currency between a
//! local trainer, the wire and the aggregator, independent of how a model computes.
//!
//! Invariants of a [`ModelState`] (established by [`ModelState::new`], by deserialisation and
//! by [`ModelState::from_le_bytes`]): tensors sorted by name, names unique, every tensor's data
//! length equal to the product of its shape. Sorting by name makes two states with the same
//! parameters identical, byte for byte, whatever order they were built in.

use serde::{Deserialize, Serialize};

use super::{ModelError, Result};

/// One parameter tensor, row-major.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamedTensor {
    /// Parameter name, e.g. `"weight"`.
    pub name: String,
    /// Dimensions, outermost first; `[]` is a scalar.
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values, row-major.
    pub data: Vec<f32>,
}

impl NamedTensor {
    /// A tensor after checking that `data` fills `shape` exactly.
    pub fn new(name: impl Into<String>, shape: Vec<usize>, data: Vec<f32>) -> Result<Self> {
        let tensor = Self {
            name: name.into(),
            shape,
            data,
        };
        tensor.check_length()?;
        Ok(tensor)
    }

    /// A tensor of zeros.
    pub fn zeros(name: impl Into<String>, shape: Vec<usize>) -> Self {
        let len = shape.iter().product();
        Self {
            name: name.into(),
            shape,
            data: vec![0.0; len],
        }
    }

    /// Number of values, the product of the shape.
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    fn check_length(&self) -> Result<()> {
        let expected = self
            .shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d));
        if expected != Some(self.data.len()) {
            return Err(ModelError::DataLength {
                name: self.name.clone(),
                shape: self.shape.clone(),
                expected: expected.unwrap_or(usize::MAX),
                actual: self.data.len(),
            });
        }
        Ok(())
    }
}

/// All parameters of a model, sorted by tensor name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "UncheckedState")]
pub struct ModelState {
    /// The tensors, sorted by name, names unique.
    pub tensors: Vec<NamedTensor>,
}

/// What arrives over serde before the invariants are checked.
#[derive(Deserialize)]
struct UncheckedState {
    tensors: Vec<NamedTensor>,
}

impl TryFrom<UncheckedState> for ModelState {
    type Error = ModelError;
    fn try_from(raw: UncheckedState) -> Result<Self> {
        ModelState::new(raw.tensors)
    }
}

/// Identifies the byte encoding ("fedshard model state") and its version.
const MAGIC: &[u8; 4] = b"FSMS";
const VERSION: u32 = 1;

impl ModelState {
    /// A state from tensors in any order: sorts them by name and checks names are unique and
    /// every tensor's data fills its shape.
    pub fn new(mut tensors: Vec<NamedTensor>) -> Result<Self> {
        tensors.sort_by(|a, b| a.name.cmp(&b.name));
        for tensor in &tensors {
            tensor.check_length()?;
        }
        if let Some(pair) = tensors.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(ModelError::DuplicateTensor {
                name: pair[0].name.clone(),
            });
        }
        Ok(Self { tensors })
    }

    /// The tensor called `name`, if any.
    pub fn get(&self, name: &str) -> Option<&NamedTensor> {
        self.index_of(name).map(|i| &self.tensors[i])
    }

    /// The tensor called `name`, mutably; the shape must not be changed through it.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut NamedTensor> {
        self.index_of(name).map(move |i| &mut self.tensors[i])
    }

    /// The tensor called `name`, or an error naming it: for models that require the tensor.
    pub fn require(&self, name: &str) -> Result<&NamedTensor> {
        self.get(name).ok_or_else(|| ModelError::MissingTensor {
            name: name.to_owned(),
        })
    }

    fn index_of(&self, name: &str) -> Option<usize> {
        self.tensors
            .binary_search_by(|t| t.name.as_str().cmp(name))
            .ok()
    }

    /// Total number of scalar parameters.
    pub fn num_parameters(&self) -> usize {
        self.tensors.iter().map(NamedTensor::numel).sum()
    }

    /// Whether every parameter is finite: a NaN or infinite update must never reach the global
    /// model.
    pub fn is_finite(&self) -> bool {
        self.tensors
            .iter()
            .all(|t| t.data.iter().all(|v| v.is_finite()))
    }

    /// Checks that `other` has the same tensor names and shapes as `self` (the expected
    /// layout); the error names the first mismatching tensor and both shapes.
    pub fn check_compatible(&self, other: &ModelState) -> Result<()> {
        for (position, (mine, theirs)) in self.tensors.iter().zip(&other.tensors).enumerate() {
            if mine.name != theirs.name {
                return Err(ModelError::NameMismatch {
                    position,
                    expected: mine.name.clone(),
                    found: theirs.name.clone(),
                });
            }
            if mine.shape != theirs.shape {
                return Err(ModelError::ShapeMismatch {
                    name: mine.name.clone(),
                    expected: mine.shape.clone(),
                    found: theirs.shape.clone(),
                });
            }
        }
        if self.tensors.len() != other.tensors.len() {
            return Err(ModelError::TensorCount {
                expected: self.tensors.len(),
                found: other.tensors.len(),
            });
        }
        Ok(())
    }

    /// Exact little-endian encoding: `"FSMS"`, version `u32`, tensor count `u32`, then per
    /// tensor name length `u32`, UTF-8 name, rank `u32`, dims `u64` each, values as `f32` bits.
    ///
    /// Two states are bit-identical exactly when their encodings are equal (NaN payloads and
    /// signed zeros included), which is what determinism checks compare.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        let size = 12
            + self
                .tensors
                .iter()
                .map(|t| 8 + t.name.len() + 8 * t.shape.len() + 4 * t.data.len())
                .sum::<usize>();
        let mut out = Vec::with_capacity(size);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u32).to_le_bytes());
        for t in &self.tensors {
            out.extend_from_slice(&(t.name.len() as u32).to_le_bytes());
            out.extend_from_slice(t.name.as_bytes());
            out.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for &d in &t.shape {
                out.extend_from_slice(&(d as u64).to_le_bytes());
            }
            for &v in &t.data {
                out.extend_from_slice(&v.to_bits().to_le_bytes());
            }
        }
        out
    }

    /// Decodes [`ModelState::to_le_bytes`]. Malformed input (truncated, trailing bytes, bad
    /// UTF-8, sizes that do not fit, unsorted or duplicate names) is an error naming the
    /// offset; nothing is allocated beyond what the input can actually hold.
    pub fn from_le_bytes(bytes: &[u8]) -> Result<Self> {
        let mut r = Reader { bytes, offset: 0 };
        if r.take(4)? != MAGIC {
            return Err(r.error(0, "not a fedshard model state (bad magic)"));
        }
        let version = r.u32()?;
        if version != VERSION {
            return Err(r.error(4, format!("unsupported version {version}")));
        }
        let count = r.u32()? as usize;
        let mut tensors = Vec::with_capacity(count.min(r.remaining() / 8));
        for _ in 0..count {
            let at = r.offset;
            let name_len = r.u32()? as usize;
            let name = std::str::from_utf8(r.take(name_len)?)
                .map_err(|e| r.error(at + 4, format!("tensor name is not UTF-8: {e}")))?
                .to_owned();
            let rank = r.u32()? as usize;
            let mut shape = Vec::with_capacity(rank.min(r.remaining() / 8));
            for _ in 0..rank {
                let d = r.u64()?;
                shape.push(
                    usize::try_from(d)
                        .map_err(|_| r.error(r.offset - 8, format!("dimension {d} too large")))?,
                );
            }
            let numel = shape
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .filter(|n| n.checked_mul(4).is_some_and(|b| b <= r.remaining()))
                .ok_or_else(|| {
                    r.error(
                        r.offset,
                        format!("tensor {name:?} of shape {shape:?} does not fit the input"),
                    )
                })?;
            let data = r
                .take(numel * 4)?
                .chunks_exact(4)
                .map(|c| f32::from_bits(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect();
            tensors.push(NamedTensor { name, shape, data });
        }
        if r.remaining() != 0 {
            return Err(r.error(r.offset, format!("{} trailing bytes", r.remaining())));
        }
        if let Some(w) = tensors.windows(2).find(|w| w[0].name >= w[1].name) {
            return Err(r.error(
                0,
                format!(
                    "tensors not in strictly ascending name order ({:?} before {:?})",
                    w[0].name, w[1].name
                ),
            ));
        }
        Ok(Self { tensors })
    }
}

/// A bounds-checked cursor over the encoding.
struct Reader<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.offset
    }

    fn error(&self, offset: usize, problem: impl Into<String>) -> ModelError {
        ModelError::Decode {
            offset,
            problem: problem.into(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.error(
                self.offset,
                format!("needed {n} bytes, {} left", self.remaining()),
            ));
        }
        let slice = &self.bytes[self.offset..self.offset + n];
        self.offset += n;
        Ok(slice)
    }

    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        let mut word = [0u8; 8];
        word.copy_from_slice(b);
        Ok(u64::from_le_bytes(word))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> ModelState {
        ModelState::new(vec![
            NamedTensor::new("weight", vec![2, 3], vec![1.0, -2.0, 3.5, 0.0, -0.0, 7.25]).unwrap(),
            NamedTensor::new("bias", vec![2], vec![0.5, f32::MIN_POSITIVE]).unwrap(),
        ])
        .unwrap()
    }

    #[test]
    fn tensors_are_sorted_and_found_by_name() {
        let s = state();
        let names: Vec<&str> = s.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["bias", "weight"]);
        assert_eq!(s.get("weight").unwrap().shape, vec![2, 3]);
        assert!(s.get("nope").is_none());
        assert_eq!(s.num_parameters(), 8);
        assert!(s.is_finite());
    }

    #[test]
    fn construction_rejects_bad_lengths_and_duplicates() {
        assert!(matches!(
            NamedTensor::new("w", vec![2, 2], vec![0.0; 3]),
            Err(ModelError::DataLength {
                expected: 4,
                actual: 3,
                ..
            })
        ));
        let dup = ModelState::new(vec![
            NamedTensor::zeros("a", vec![1]),
            NamedTensor::zeros("a", vec![2]),
        ]);
        assert_eq!(dup, Err(ModelError::DuplicateTensor { name: "a".into() }));
    }

    #[test]
    fn compatibility_names_the_first_mismatch() {
        let a = state();
        let mut b = state();
        b.tensors[1] = NamedTensor::zeros("weight", vec![3, 2]);
        let e = a.check_compatible(&b).unwrap_err();
        assert_eq!(
            e,
            ModelError::ShapeMismatch {
                name: "weight".into(),
                expected: vec![2, 3],
                found: vec![3, 2]
            }
        );
        assert!(e.to_string().contains("weight") && e.to_string().contains("[3, 2]"));
        let short = ModelState::new(vec![NamedTensor::zeros("bias", vec![2])]).unwrap();
        assert!(matches!(
            a.check_compatible(&short),
            Err(ModelError::TensorCount { .. })
        ));
        assert!(a.check_compatible(&state()).is_ok());
    }

    #[test]
    fn non_finite_values_are_detected() {
        let mut s = state();
        s.get_mut("bias").unwrap().data[1] = f32::NAN;
        assert!(!s.is_finite());
    }

    #[test]
    fn bytes_round_trip_exactly() {
        let mut s = state();
        s.get_mut("bias").unwrap().data[0] = f32::from_bits(0x7fc0_0001); // a NaN payload
        let bytes = s.to_le_bytes();
        let back = ModelState::from_le_bytes(&bytes).unwrap();
        assert_eq!(back.to_le_bytes(), bytes);
        assert_eq!(back.tensors[0].data[0].to_bits(), 0x7fc0_0001);
        // -0.0 and 0.0 are different bits.
        assert_ne!(state().to_le_bytes(), {
            let mut z = state();
            z.get_mut("weight").unwrap().data[4] = 0.0;
            z.to_le_bytes()
        });
    }

    #[test]
    fn malformed_bytes_are_rejected_without_panics() {
        let bytes = state().to_le_bytes();
        for cut in 0..bytes.len() {
            assert!(
                ModelState::from_le_bytes(&bytes[..cut]).is_err(),
                "cut {cut}"
            );
        }
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(ModelState::from_le_bytes(&trailing).is_err());
        let mut huge = bytes.clone();
        // Rank-1 bias dimension (after magic, version, count, name length, "bias", rank).
        huge[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            ModelState::from_le_bytes(&huge),
            Err(ModelError::Decode { .. })
        ));
    }

    #[test]
    fn serde_checks_invariants() {
        let json = serde_json::to_string(&state()).unwrap();
        let back: ModelState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, state());
        let bad = r#"{"tensors":[{"name":"w","shape":[2],"data":[1.0]}]}"#;
        assert!(serde_json::from_str::<ModelState>(bad).is_err());
    }
}
