//! MNIST-style IDX files (<http://yann.lecun.com/exdb/mnist/>), plain or gzipped.
//!
//! An IDX file is a big-endian header, magic `00 00 <type> <rank>` and one `u32` per dimension,
//! followed by the values. We read the two layouts MNIST and EMNIST use, both with `u8` values
//! (type `0x08`): images, magic `0x00000803`, dimensions `N × rows × cols`; labels, magic
//! `0x00000801`, dimension `N`. Pixels become `p / 255` in `[0, 1]`, row-major.
//!
//! [`load_mnist`] finds the standard MNIST names in a folder; any other IDX pair (EMNIST's
//! `emnist-balanced-train-images-idx3-ubyte.gz`, Fashion-MNIST, …) is loaded by explicit paths
//! with [`load_idx`]. EMNIST stores each image transposed (column-major); the pixels are kept as
//! stored, which a fully-connected model does not mind and a convolutional one learns around.

use std::path::{Path, PathBuf};

use super::Dataset;
use super::files::{FileError, find_one_of, read_maybe_gzip};

/// Magic number of an IDX file of `u8` images, `N × rows × cols`.
pub const IMAGES_MAGIC: u32 = 0x0000_0803;
/// Magic number of an IDX file of `u8` labels, `N`.
pub const LABELS_MAGIC: u32 = 0x0000_0801;
/// Digit classes of MNIST.
pub const MNIST_CLASSES: usize = 10;

/// Decoded IDX images: `count` images of `rows × cols` bytes, row-major, back to back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxImages {
    pub count: usize,
    pub rows: usize,
    pub cols: usize,
    pub pixels: Vec<u8>,
}

/// Reads an images file (magic [`IMAGES_MAGIC`]). Errors name the file for a wrong magic number
/// and for a length that is not exactly header plus `N · rows · cols` bytes.
pub fn read_images(path: &Path) -> Result<IdxImages, FileError> {
    let bytes = read_maybe_gzip(path)?;
    let dims = header::<3>(path, &bytes, IMAGES_MAGIC, "IDX u8 images, N × rows × cols")?;
    let [count, rows, cols] = dims;
    let body = body(path, &bytes, &dims, "image")?;
    Ok(IdxImages {
        count,
        rows,
        cols,
        pixels: body.to_vec(),
    })
}

/// Reads a labels file (magic [`LABELS_MAGIC`]).
pub fn read_labels(path: &Path) -> Result<Vec<u8>, FileError> {
    let bytes = read_maybe_gzip(path)?;
    let dims = header::<1>(path, &bytes, LABELS_MAGIC, "IDX u8 labels, N")?;
    Ok(body(path, &bytes, &dims, "label")?.to_vec())
}

/// The images at `images` with the labels at `labels`, pixels scaled to `[0, 1]`; every label
/// must be below `classes` (10 for MNIST, 47 for EMNIST-balanced, 62 for EMNIST-byclass, …).
pub fn load_idx(images: &Path, labels: &Path, classes: usize) -> Result<Dataset, FileError> {
    let decoded = read_images(images)?;
    let targets = read_labels(labels)?;
    if decoded.count != targets.len() {
        return Err(FileError::CountMismatch {
            images_path: images.to_path_buf(),
            images: decoded.count,
            labels_path: labels.to_path_buf(),
            labels: targets.len(),
        });
    }
    if let Some((record, &value)) = targets
        .iter()
        .enumerate()
        .find(|&(_, &l)| usize::from(l) >= classes)
    {
        return Err(FileError::LabelOutOfRange {
            path: labels.to_path_buf(),
            record,
            field: "label",
            value: u32::from(value),
            classes,
        });
    }
    let features = decoded
        .pixels
        .iter()
        .map(|&p| f32::from(p) / 255.0)
        .collect();
    let labels_u32 = targets.iter().map(|&l| u32::from(l)).collect();
    Dataset::new(features, labels_u32, decoded.rows * decoded.cols, classes).map_err(|cause| {
        FileError::Data {
            path: images.to_path_buf(),
            cause,
        }
    })
}

/// MNIST's training (`train-*`) or test (`t10k-*`) pair from `dir`, each file plain or with
/// `.gz`.
pub fn load_mnist(dir: &Path, train: bool) -> Result<Dataset, FileError> {
    let prefix = if train { "train" } else { "t10k" };
    let find = |kind: &str| -> Result<PathBuf, FileError> {
        let name = format!("{prefix}-{kind}");
        find_one_of(
            dir,
            &[name.clone(), format!("{name}.gz")],
            "the MNIST IDX files train-images-idx3-ubyte, train-labels-idx1-ubyte, \
             t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte (each optionally .gz); \
             other names load with idx::load_idx",
        )
    };
    load_idx(
        &find("images-idx3-ubyte")?,
        &find("labels-idx1-ubyte")?,
        MNIST_CLASSES,
    )
}

/// Checks the magic number (whose low byte is the rank `R`) and returns the `R` dimensions.
/// The magic number is checked before the header length, so a file of another kind is named
/// as such rather than as truncated.
fn header<const R: usize>(
    path: &Path,
    bytes: &[u8],
    magic: u32,
    format: &'static str,
) -> Result<[usize; R], FileError> {
    let header_len = 4 * (1 + R);
    let word = |i: usize| {
        bytes
            .get(4 * i..4 * i + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes)
    };
    let truncated = || FileError::Length {
        path: path.to_path_buf(),
        found: bytes.len(),
        expected: header_len,
        what: format!("at least the {header_len}-byte header of {format}; the file is truncated"),
    };
    let found = word(0).ok_or_else(truncated)?;
    if found != magic {
        return Err(FileError::Magic {
            path: path.to_path_buf(),
            found,
            expected: magic,
            format,
        });
    }
    let mut dims = [0usize; R];
    for (i, dim) in dims.iter_mut().enumerate() {
        *dim = word(i + 1).ok_or_else(truncated)? as usize;
    }
    Ok(dims)
}

/// The values after the header, checking the file holds exactly the product of `dims` of them.
fn body<'a>(
    path: &Path,
    bytes: &'a [u8],
    dims: &[usize],
    what: &str,
) -> Result<&'a [u8], FileError> {
    let header_len = 4 * (1 + dims.len());
    let expected = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .and_then(|values| values.checked_add(header_len));
    if expected == Some(bytes.len()) {
        return Ok(&bytes[header_len..]);
    }
    let expected = expected.unwrap_or(usize::MAX);
    let verdict = if bytes.len() < expected {
        "the file is truncated"
    } else {
        "the file has trailing bytes"
    };
    let dims_text: Vec<String> = dims.iter().map(usize::to_string).collect();
    Err(FileError::Length {
        path: path.to_path_buf(),
        found: bytes.len(),
        expected,
        what: format!(
            "{header_len}-byte header plus {} {what} bytes; {verdict}",
            dims_text.join(" × ")
        ),
    })
}
