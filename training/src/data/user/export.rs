//! The embedded 8×8 digits written out in each `files` format (`fedshard data export-digits`),
//! so the shipped `files-digits-*` configs run without a download and a user sees one example
//! of every layout the loaders read.

use std::path::{Path, PathBuf};

use super::arrays::{NamedArray, write_npz};
use super::images::write_gray_png;
use super::table::write_csv;
use crate::data::files::FileError;
use crate::data::{Dataset, digits};

/// File and folder names written under the export folder.
pub const NPZ: &str = "digits.npz";
pub const CSV: &str = "digits.csv";
pub const PNG: &str = "digits-png";

/// What [`export_digits`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Exported {
    pub npz: PathBuf,
    pub csv: PathBuf,
    pub png: PathBuf,
    pub rows: usize,
}

/// Writes the embedded digits (pixels / 16, as `dataset = "digits"` reads them) under `dir`:
/// `digits.npz` with `x` (`float32`, `[1797, 8, 8]`) and `y` (`int64`), `digits.csv` with a
/// `label` column and `f0`…`f63`, and `digits-png/CLASS/NNNN.png` (8-bit gray, so each pixel
/// is within 1/510 of its value). Rows keep the embedded order; NPZ and CSV give back the same
/// `f32` values exactly.
pub fn export_digits(dir: &Path) -> Result<Exported, FileError> {
    let data = digits::load().map_err(|cause| FileError::Data {
        path: dir.to_path_buf(),
        cause,
    })?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |cause| FileError::Io { path, cause }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let npz = dir.join(NPZ);
    let n = data.len() as u64;
    let labels: Vec<i64> = data.labels.iter().map(|&l| i64::from(l)).collect();
    write_npz(
        &npz,
        &[
            NamedArray::F32("x", vec![n, 8, 8], &data.features),
            NamedArray::I64("y", vec![n], &labels),
        ],
    )?;
    let csv = dir.join(CSV);
    write_csv(&csv, &data.features, &data.labels, data.dim)?;
    let png = dir.join(PNG);
    write_pngs(&png, &data)?;
    Ok(Exported {
        npz,
        csv,
        png,
        rows: data.len(),
    })
}

/// `root/CLASS/NNNN.png`, NNNN the row's index in `data`.
fn write_pngs(root: &Path, data: &Dataset) -> Result<(), FileError> {
    for class in 0..data.classes {
        let dir = root.join(class.to_string());
        std::fs::create_dir_all(&dir).map_err(|cause| FileError::Io {
            path: dir.clone(),
            cause,
        })?;
    }
    for (i, &label) in data.labels.iter().enumerate() {
        let path = root.join(label.to_string()).join(format!("{i:04}.png"));
        write_gray_png(&path, 8, 8, data.row(i))?;
    }
    Ok(())
}
