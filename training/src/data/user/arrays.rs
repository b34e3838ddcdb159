//! NumPy arrays: an `.npz` archive (what `np.savez` and `np.savez_compressed` write) or a
//! folder of `.npy` files, holding `x` (features, shape `[N, …]`), `y` (integer labels, `[N]`)
//! and, for a natural split, `client` (an integer client id per row, `[N]`).
//!
//! The NPY header and element decoding are npyz's; the archive is read with zip, one member at
//! a time. Values stream from the file into one `Vec<f32>` (features) or `Vec<i64>` (labels,
//! clients), so memory is 4 bytes per feature value plus zip's and npyz's small buffers: an
//! `f64` array is never held next to its `f32` copy.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use npyz::{DType, Deserialize, NpyFile, Order, TypeChar, WriterBuilder};

use super::Rows;
use crate::data::files::FileError;

/// The arrays of a dataset, as the docs name them.
const FEATURES: &str = "x";
const LABELS: &str = "y";
const CLIENTS: &str = "client";
/// What the loader expects of each array, for errors.
const EXPECTED_X: &str = "features of shape [N, …], any integer, float or bool dtype";
const EXPECTED_Y: &str = "integer labels of shape [N]";
const EXPECTED_CLIENT: &str = "an integer client id per row, shape [N], for natural_split";
/// Elements reserved up front at most: a header can claim any length, the file decides.
const RESERVE: usize = 1 << 20;

/// Reads the arrays of the `.npz` archive at `path`.
pub fn load_npz(path: &Path, natural_split: bool) -> Result<Rows, FileError> {
    let file = File::open(path).map_err(|cause| FileError::Io {
        path: path.to_path_buf(),
        cause,
    })?;
    let mut archive =
        zip::ZipArchive::new(BufReader::new(file)).map_err(|e| FileError::Format {
            path: path.to_path_buf(),
            expected: "an NPZ archive (np.savez or np.savez_compressed)",
            cause: e.to_string(),
        })?;
    let mut found: Vec<String> = archive
        .file_names()
        .map(|n| n.trim_end_matches(".npy").to_owned())
        .collect();
    found.sort();
    let x = member(&mut archive, path, FEATURES, EXPECTED_X, &found)?.features(path, FEATURES)?;
    let y = member(&mut archive, path, LABELS, EXPECTED_Y, &found)?.integers(path, LABELS)?;
    let client = match natural_split {
        true => Some(
            member(&mut archive, path, CLIENTS, EXPECTED_CLIENT, &found)?
                .integers(path, CLIENTS)?,
        ),
        false => None,
    };
    rows(path, x, y, client)
}

/// The header of the archive member `name.npy`, or the error naming what the archive holds.
fn member<'a>(
    archive: &'a mut zip::ZipArchive<BufReader<File>>,
    path: &Path,
    name: &str,
    expected: &'static str,
    found: &[String],
) -> Result<Array<zip::read::ZipFile<'a, BufReader<File>>>, FileError> {
    let member = archive
        .by_name(&format!("{name}.npy"))
        .map_err(|_| missing(path, name, expected, found))?;
    array(path, name, member)
}

/// Reads `x.npy`, `y.npy` (and `client.npy`) from the folder `dir`.
pub fn load_npy_folder(dir: &Path, natural_split: bool) -> Result<Rows, FileError> {
    let open = |name: &str, expected: &'static str| {
        let file_path = dir.join(format!("{name}.npy"));
        match File::open(&file_path) {
            Ok(file) => array(&file_path, name, BufReader::new(file)),
            Err(_) => Err(missing(dir, name, expected, &npy_names(dir))),
        }
    };
    let x = open(FEATURES, EXPECTED_X)?.features(&dir.join("x.npy"), FEATURES)?;
    let y = open(LABELS, EXPECTED_Y)?.integers(&dir.join("y.npy"), LABELS)?;
    let client = match natural_split {
        true => Some(open(CLIENTS, EXPECTED_CLIENT)?.integers(&dir.join("client.npy"), CLIENTS)?),
        false => None,
    };
    rows(dir, x, y, client)
}

/// The `.npy` files of `dir`, without the suffix, for an error listing what is there.
fn npy_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".npy")
                .map(String::from)
        })
        .collect();
    names.sort();
    names
}

fn missing(path: &Path, name: &str, expected: &'static str, found: &[String]) -> FileError {
    FileError::MissingPart {
        path: path.to_path_buf(),
        what: "array",
        name: name.to_owned(),
        expected,
        found: found.to_vec(),
    }
}

/// Pairs features, labels and clients row by row, refusing arrays of different lengths.
fn rows(
    path: &Path,
    (shape, features): (Vec<usize>, Vec<f32>),
    (y_shape, labels): (Vec<usize>, Vec<i64>),
    client: Option<(Vec<usize>, Vec<i64>)>,
) -> Result<Rows, FileError> {
    let n = shape.first().copied().unwrap_or(0);
    let one_per_row = |name: &str, found: &[usize], expected: &str| {
        let flat = found.iter().skip(1).all(|&d| d == 1);
        match found.first() == Some(&n) && flat {
            true => Ok(()),
            false => Err(FileError::Shape {
                path: path.to_path_buf(),
                part: format!("array `{name}`"),
                expected: format!("{expected}, N = {n} as the rows of `x`"),
                found: format!("shape {found:?}"),
            }),
        }
    };
    one_per_row(LABELS, &y_shape, EXPECTED_Y)?;
    if let Some((client_shape, _)) = &client {
        one_per_row(CLIENTS, client_shape, EXPECTED_CLIENT)?;
    }
    let row_shape = match shape.len() {
        0 | 1 => vec![1],
        _ => shape[1..].to_vec(),
    };
    Ok(Rows {
        features,
        shape: row_shape,
        labels,
        clients: client.map(|(_, ids)| ids.iter().map(i64::to_string).collect()),
        class_names: None,
    })
}

/// One array's header, ready to stream its values.
struct Array<R: Read> {
    npy: NpyFile<R>,
    shape: Vec<usize>,
    path: PathBuf,
    name: String,
}

/// Reads the NPY header of array `name` from `reader`, refusing what cannot be rows: a
/// Fortran-ordered array, a structured or object dtype, a shape whose size overflows.
fn array<R: Read>(path: &Path, name: &str, reader: R) -> Result<Array<R>, FileError> {
    let shape_error = |expected: &str, found: String| FileError::Shape {
        path: path.to_path_buf(),
        part: format!("array `{name}`"),
        expected: expected.to_owned(),
        found,
    };
    let npy = NpyFile::new(reader).map_err(|e| {
        shape_error(
            "an NPY array (magic \\x93NUMPY, a valid header)",
            e.to_string(),
        )
    })?;
    if npy.order() == Order::Fortran && npy.shape().len() > 1 {
        return Err(shape_error(
            "C order (np.ascontiguousarray before saving)",
            "Fortran order".into(),
        ));
    }
    let shape: Vec<usize> = npy
        .shape()
        .iter()
        .map(|&d| usize::try_from(d).unwrap_or(usize::MAX))
        .collect();
    if shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .is_none()
    {
        return Err(shape_error(
            "a size that fits in memory",
            format!("shape {shape:?}"),
        ));
    }
    Ok(Array {
        npy,
        shape,
        path: path.to_path_buf(),
        name: name.to_owned(),
    })
}

impl<R: Read> Array<R> {
    fn error(&self, expected: &str, found: String) -> FileError {
        FileError::Shape {
            path: self.path.clone(),
            part: format!("array `{}`", self.name),
            expected: expected.to_owned(),
            found,
        }
    }

    fn dtype(&self) -> Option<(TypeChar, u64)> {
        match self.npy.dtype() {
            DType::Plain(ts) => Some((ts.type_char(), ts.size_field())),
            _ => None,
        }
    }

    /// Every value as `T`, converted by `convert(index, value)` as it streams from the file.
    fn collect<T: Deserialize, U>(
        self,
        mut convert: impl FnMut(usize, T) -> Result<U, FileError>,
    ) -> Result<Vec<U>, FileError> {
        let len = self.npy.len();
        let expected = format!("{len} values as its header says");
        let reader = (self.npy.data::<T>()).map_err(|e| FileError::Shape {
            path: self.path.clone(),
            part: format!("array `{}`", self.name),
            expected: "a numeric dtype".into(),
            found: e.to_string(),
        })?;
        let mut out = Vec::with_capacity(usize::try_from(len).unwrap_or(0).min(RESERVE));
        for (at, value) in reader.enumerate() {
            let value = value.map_err(|e| FileError::Shape {
                path: self.path.clone(),
                part: format!("array `{}`", self.name),
                expected: expected.clone(),
                found: format!("a read error at value {at}: {e}"),
            })?;
            out.push(convert(at, value)?);
        }
        Ok(out)
    }

    /// The values as `f32` (integers and `f64` rounded to the nearest `f32`), with the shape.
    fn features(self, path: &Path, name: &str) -> Result<(Vec<usize>, Vec<f32>), FileError> {
        let shape = self.shape.clone();
        if shape.is_empty() {
            return Err(self.error(EXPECTED_X, "a scalar (shape [])".into()));
        }
        let ok = |v: f32| Ok::<f32, FileError>(v);
        let values = match self.dtype() {
            Some((TypeChar::Float, 4)) => self.collect::<f32, _>(|_, v| ok(v))?,
            Some((TypeChar::Float, 8)) => self.collect::<f64, _>(|_, v| ok(v as f32))?,
            Some((TypeChar::Int, 1)) => self.collect::<i8, _>(|_, v| ok(f32::from(v)))?,
            Some((TypeChar::Int, 2)) => self.collect::<i16, _>(|_, v| ok(f32::from(v)))?,
            Some((TypeChar::Int, 4)) => self.collect::<i32, _>(|_, v| ok(v as f32))?,
            Some((TypeChar::Int, 8)) => self.collect::<i64, _>(|_, v| ok(v as f32))?,
            Some((TypeChar::Uint, 1)) => self.collect::<u8, _>(|_, v| ok(f32::from(v)))?,
            Some((TypeChar::Uint, 2)) => self.collect::<u16, _>(|_, v| ok(f32::from(v)))?,
            Some((TypeChar::Uint, 4)) => self.collect::<u32, _>(|_, v| ok(v as f32))?,
            Some((TypeChar::Uint, 8)) => self.collect::<u64, _>(|_, v| ok(v as f32))?,
            Some((TypeChar::Bool, 1)) => {
                self.collect::<bool, _>(|_, v| ok(f32::from(u8::from(v))))?
            }
            _ => {
                let found = format!("dtype {}", self.npy.dtype().descr());
                return Err(dtype_error(path, name, EXPECTED_X, found));
            }
        };
        Ok((shape, values))
    }

    /// The values as `i64`: integer dtypes, or floats that hold whole numbers.
    fn integers(self, path: &Path, name: &str) -> Result<(Vec<usize>, Vec<i64>), FileError> {
        let shape = self.shape.clone();
        let label = |row: usize, value: String| FileError::Label {
            path: path.to_path_buf(),
            row,
            value,
            expected: format!("an integer (array `{name}`)"),
        };
        let whole = |row: usize, v: f64| {
            if v.fract() == 0.0 && v.abs() < 9.0e15 {
                Ok(v as i64)
            } else {
                Err(label(row, v.to_string()))
            }
        };
        let ok = |v: i64| Ok::<i64, FileError>(v);
        let values = match self.dtype() {
            Some((TypeChar::Int, 1)) => self.collect::<i8, _>(|_, v| ok(i64::from(v)))?,
            Some((TypeChar::Int, 2)) => self.collect::<i16, _>(|_, v| ok(i64::from(v)))?,
            Some((TypeChar::Int, 4)) => self.collect::<i32, _>(|_, v| ok(i64::from(v)))?,
            Some((TypeChar::Int, 8)) => self.collect::<i64, _>(|_, v| ok(v))?,
            Some((TypeChar::Uint, 1)) => self.collect::<u8, _>(|_, v| ok(i64::from(v)))?,
            Some((TypeChar::Uint, 2)) => self.collect::<u16, _>(|_, v| ok(i64::from(v)))?,
            Some((TypeChar::Uint, 4)) => self.collect::<u32, _>(|_, v| ok(i64::from(v)))?,
            Some((TypeChar::Uint, 8)) => self.collect::<u64, _>(|row, v| {
                i64::try_from(v).map_err(|_| label(row, v.to_string()))
            })?,
            Some((TypeChar::Float, 4)) => self.collect::<f32, _>(|r, v| whole(r, f64::from(v)))?,
            Some((TypeChar::Float, 8)) => self.collect::<f64, _>(whole)?,
            _ => {
                let found = format!("dtype {}", self.npy.dtype().descr());
                return Err(dtype_error(path, name, "an integer dtype", found));
            }
        };
        Ok((shape, values))
    }
}

fn dtype_error(path: &Path, name: &str, expected: &str, found: String) -> FileError {
    FileError::Shape {
        path: path.to_path_buf(),
        part: format!("array `{name}`"),
        expected: expected.to_owned(),
        found,
    }
}

/// An array to write: its name in the archive, its shape and its values.
pub enum NamedArray<'a> {
    F32(&'a str, Vec<u64>, &'a [f32]),
    I64(&'a str, Vec<u64>, &'a [i64]),
}

/// Writes one array of `shape` in NPY's format (its default dtype, C order) to `out`.
fn write_npy<T: npyz::AutoSerialize + Copy>(
    out: &mut impl std::io::Write,
    shape: &[u64],
    values: &[T],
) -> std::io::Result<()> {
    let mut writer = npyz::WriteOptions::<T>::new()
        .default_dtype()
        .shape(shape)
        .writer(out)
        .begin_nd()?;
    writer.extend(values.iter().copied())?;
    writer.finish()
}

/// Writes `arrays` as an uncompressed `.npz` archive at `path` (what `np.savez` writes;
/// `np.load` reads it back).
pub fn write_npz(path: &Path, arrays: &[NamedArray]) -> Result<(), FileError> {
    let io = |cause: std::io::Error| FileError::Io {
        path: path.to_path_buf(),
        cause,
    };
    let zip_io = |e: zip::result::ZipError| io(std::io::Error::other(e));
    let file = File::create(path).map_err(io)?;
    let mut zip = zip::ZipWriter::new(std::io::BufWriter::new(file));
    let stored =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for array in arrays {
        let name = match array {
            NamedArray::F32(name, ..) | NamedArray::I64(name, ..) => name,
        };
        zip.start_file(format!("{name}.npy"), stored)
            .map_err(zip_io)?;
        match array {
            NamedArray::F32(_, shape, values) => write_npy(&mut zip, shape, values),
            NamedArray::I64(_, shape, values) => write_npy(&mut zip, shape, values),
        }
        .map_err(io)?;
    }
    zip.finish().map_err(zip_io)?;
    Ok(())
}
