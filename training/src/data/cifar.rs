//! CIFAR-10 and CIFAR-100 from the official binary distributions
//! (<https://www.cs.toronto.edu/~kriz/cifar.html>, "binary version").
//!
//! Both are flat files of fixed-size records: CIFAR-10 `<label> <3072 pixels>`
//! (`data_batch_1.bin` … `data_batch_5.bin`, `test_batch.bin` in `cifar-10-batches-bin/`),
//! CIFAR-100 `<coarse label> <fine label> <3072 pixels>` (`train.bin`, `test.bin` in
//! `cifar-100-binary/`). The 3072 pixel bytes are the red, green and blue 32 × 32 planes, each
//! row-major: already the CHW layout our models read, so a row of [`Dataset::features`] is the
//! image as stored, `3 × 32 × 32`.
//!
//! Pixels become `(p / 255 − mean_c) / std_c` with the per-channel mean and standard deviation
//! of the training set, so inputs are centred as models in the literature expect.

use std::path::{Path, PathBuf};

use super::Dataset;
use super::files::{FileError, find_one_of, read_maybe_gzip};

/// Channels, rows and columns of an image.
pub const SHAPE: [usize; 3] = [3, 32, 32];
/// Features per image, `3 · 32 · 32`.
pub const IMAGE_DIM: usize = 3072;
/// Coarse (super-)classes of CIFAR-100.
pub const CIFAR100_COARSE: usize = 20;
/// Fine classes of CIFAR-100.
pub const CIFAR100_FINE: usize = 100;

/// Per-channel (R, G, B) pixel mean of the CIFAR-10 training set, pixels in `[0, 1]`.
pub const CIFAR10_MEAN: [f32; 3] = [0.4914, 0.4822, 0.4465];
/// Per-channel pixel standard deviation of the CIFAR-10 training set (over all pixels; the
/// often-copied `0.2023, 0.1994, 0.2010` is the mean of per-image deviations, a different
/// quantity).
pub const CIFAR10_STD: [f32; 3] = [0.2470, 0.2435, 0.2616];
/// Per-channel pixel mean of the CIFAR-100 training set.
pub const CIFAR100_MEAN: [f32; 3] = [0.5071, 0.4865, 0.4409];
/// Per-channel pixel standard deviation of the CIFAR-100 training set.
pub const CIFAR100_STD: [f32; 3] = [0.2673, 0.2564, 0.2762];

/// Which part of a distribution to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    Train,
    Test,
}

/// CIFAR-100 with both label sets: `data.labels` are the 100 fine labels, `coarse` the 20
/// super-class labels of the same images.
#[derive(Debug, Clone, PartialEq)]
pub struct Cifar100 {
    pub data: Dataset,
    pub coarse: Vec<u32>,
}

/// The CIFAR-10 `split` from `dir`: the folder holding the `.bin` files or its parent (the
/// folder the archive was unpacked in, holding `cifar-10-batches-bin/`). Training images come
/// in batch order 1 to 5.
pub fn load_cifar10(dir: &Path, split: Split) -> Result<Dataset, FileError> {
    let names: Vec<String> = match split {
        Split::Train => (1..=5).map(|i| format!("data_batch_{i}.bin")).collect(),
        Split::Test => vec!["test_batch.bin".into()],
    };
    let dir = resolve_dir(dir, "cifar-10-batches-bin", &names[0]);
    let expected = "the CIFAR-10 binary version (data_batch_1.bin … data_batch_5.bin, \
                    test_batch.bin) in this folder or its cifar-10-batches-bin/";
    let mut features = Vec::new();
    let mut labels = Vec::new();
    let mut last = dir.clone();
    for name in &names {
        let path = find_one_of(&dir, std::slice::from_ref(name), expected)?;
        let records = decode(&path, &Format::CIFAR10, &mut features)?;
        labels.extend(records.into_iter().map(|[label, _]| label));
        last = path;
    }
    Dataset::new(features, labels, IMAGE_DIM, 10)
        .map_err(|cause| FileError::Data { path: last, cause })
}

/// The CIFAR-100 `split` (`train.bin` or `test.bin`) from `dir` or its `cifar-100-binary/`.
pub fn load_cifar100(dir: &Path, split: Split) -> Result<Cifar100, FileError> {
    let name = match split {
        Split::Train => "train.bin",
        Split::Test => "test.bin",
    };
    let dir = resolve_dir(dir, "cifar-100-binary", name);
    let expected = "the CIFAR-100 binary version (train.bin, test.bin) in this folder or its \
                    cifar-100-binary/";
    let path = find_one_of(&dir, &[name.to_owned()], expected)?;
    let mut features = Vec::new();
    let records = decode(&path, &Format::CIFAR100, &mut features)?;
    let (coarse, fine) = records.into_iter().map(|[c, f]| (c, f)).unzip();
    let data = Dataset::new(features, fine, IMAGE_DIM, CIFAR100_FINE)
        .map_err(|cause| FileError::Data { path, cause })?;
    Ok(Cifar100 { data, coarse })
}

/// `dir` itself when it holds `probe`, else `dir/official` when that does, else `dir` (whose
/// missing files are then reported).
fn resolve_dir(dir: &Path, official: &str, probe: &str) -> PathBuf {
    let nested = dir.join(official);
    if !dir.join(probe).is_file() && nested.join(probe).is_file() {
        nested
    } else {
        dir.to_path_buf()
    }
}

/// A record layout: the label bytes in front of the pixels, their names and class counts, and
/// the normalisation of the pixels.
struct Format {
    name: &'static str,
    labels: &'static [(&'static str, usize)],
    mean: [f32; 3],
    std: [f32; 3],
}

impl Format {
    const CIFAR10: Format = Format {
        name: "CIFAR-10",
        labels: &[("label", 10)],
        mean: CIFAR10_MEAN,
        std: CIFAR10_STD,
    };
    const CIFAR100: Format = Format {
        name: "CIFAR-100",
        labels: &[
            ("coarse label", CIFAR100_COARSE),
            ("fine label", CIFAR100_FINE),
        ],
        mean: CIFAR100_MEAN,
        std: CIFAR100_STD,
    };

    fn record(&self) -> usize {
        self.labels.len() + IMAGE_DIM
    }
}

/// Decodes every record of the file at `path`: normalised pixels are appended to `features`,
/// the label bytes returned per record (the second slot repeats the first for CIFAR-10).
fn decode(
    path: &Path,
    format: &Format,
    features: &mut Vec<f32>,
) -> Result<Vec<[u32; 2]>, FileError> {
    let bytes = read_maybe_gzip(path)?;
    let record = format.record();
    if bytes.len() % record != 0 {
        return Err(FileError::RecordLength {
            path: path.to_path_buf(),
            len: bytes.len(),
            record,
            format: format.name,
        });
    }
    let plane = IMAGE_DIM / SHAPE[0];
    features.reserve(bytes.len() / record * IMAGE_DIM);
    let mut labels = Vec::with_capacity(bytes.len() / record);
    for (at, chunk) in bytes.chunks_exact(record).enumerate() {
        let (label_bytes, pixels) = chunk.split_at(format.labels.len());
        let mut pair = [0u32; 2];
        for (slot, (&value, &(field, classes))) in label_bytes.iter().zip(format.labels).enumerate()
        {
            if usize::from(value) >= classes {
                return Err(FileError::LabelOutOfRange {
                    path: path.to_path_buf(),
                    record: at,
                    field,
                    value: u32::from(value),
                    classes,
                });
            }
            pair[slot] = u32::from(value);
        }
        if format.labels.len() == 1 {
            pair[1] = pair[0];
        }
        labels.push(pair);
        for (channel, plane_pixels) in pixels.chunks_exact(plane).enumerate() {
            let (mean, std) = (format.mean[channel], format.std[channel]);
            features.extend(
                plane_pixels
                    .iter()
                    .map(|&p| (f32::from(p) / 255.0 - mean) / std),
            );
        }
    }
    Ok(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalisation_maps_the_mean_to_zero() {
        let mut features = Vec::new();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("one.bin");
        let mut record = vec![3u8];
        record.extend(std::iter::repeat_n(255u8, IMAGE_DIM));
        std::fs::write(&path, &record).unwrap();
        let labels = decode(&path, &Format::CIFAR10, &mut features).unwrap();
        assert_eq!(labels, vec![[3, 3]]);
        assert_eq!(features.len(), IMAGE_DIM);
        let expected = (1.0 - CIFAR10_MEAN[2]) / CIFAR10_STD[2];
        assert!((features[IMAGE_DIM - 1] - expected).abs() < 1e-6);
    }
}
