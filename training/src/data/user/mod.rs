//! Datasets a user brings as files (`dataset = "files"`): NPY/NPZ arrays ([`arrays`]), CSV
//! tables ([`table`]) and image folders in torchvision's `ImageFolder` layout ([`images`]).
//!
//! Each loader reads its file into the same [`Rows`] (features as `f32`, integer labels, and
//! the client id of each row where the file has one); [`finish`] then checks the labels against
//! the classes once for every format and builds the [`Dataset`], so the rules on labels cannot
//! drift apart between formats. Normalisation ([`normalize`]) happens after the train/test
//! split, with statistics of the training rows only.
//!
//! Nothing here panics on file content: every problem is a [`FileError`] naming the file, the
//! part (array, column, row, image) and the expected form.

pub mod arrays;
pub mod export;
pub mod images;
pub mod normalize;
pub mod table;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::Dataset;
use super::files::FileError;

/// How the files are laid out.
#[derive(Debug, Clone, PartialEq)]
pub enum Format {
    /// One `.npz` archive (`np.savez`, compressed or not) holding arrays `x`, `y` and, for a
    /// natural split, `client`.
    Npz,
    /// A folder of `x.npy`, `y.npy` and, for a natural split, `client.npy`.
    Npy,
    /// A CSV table with a header row.
    Csv(CsvColumns),
    /// `root/CLASS/*.png|jpg` (a natural split: `root/CLIENT/CLASS/…`).
    Images,
}

/// Which CSV columns hold what.
#[derive(Debug, Clone, PartialEq)]
pub struct CsvColumns {
    /// The label column.
    pub label: String,
    /// The feature columns in this order; `None` for every column but the label (and the
    /// client column of a natural split).
    pub features: Option<Vec<String>>,
    /// The client column, read only for a natural split.
    pub client: String,
}

/// What is known of the classes before a file is read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Classes {
    /// The number of classes; `None` to take the largest label + 1 (images: the number of
    /// class folders).
    pub count: Option<usize>,
    /// The class folder names in class-index order (images); a test folder's classes are
    /// looked up by name in those of its training folder.
    pub names: Option<Vec<String>>,
    /// Refuse a class in `0..count` without rows ([`FileError::EmptyClass`]): set for the
    /// training data when the config states `classes`.
    pub every_class: bool,
}

/// One file's rows, as every loader delivers them to [`finish`].
#[derive(Debug, Clone, PartialEq)]
pub struct Rows {
    /// Row-major features, `labels.len() × dim`.
    pub features: Vec<f32>,
    /// The shape of one row (`[C, H, W]` for images, the trailing axes of `x` for arrays).
    pub shape: Vec<usize>,
    /// One integer label per row, not yet checked against the classes.
    pub labels: Vec<i64>,
    /// One client id per row, for a natural split.
    pub clients: Option<Vec<String>>,
    /// The class names of an image folder, in class-index order.
    pub class_names: Option<Vec<String>>,
}

/// A loaded file: its [`Dataset`], and for a natural split which client each row belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    pub data: Dataset,
    /// The shape of one row (its product is `data.dim`).
    pub shape: Vec<usize>,
    /// The natural split: each row's client index into `client_names`.
    pub clients: Option<Vec<usize>>,
    /// The client ids in client-index order: sorted as numbers when all are integers, else as
    /// text.
    pub client_names: Vec<String>,
    /// The class names of an image folder, in class-index order.
    pub class_names: Option<Vec<String>>,
    /// The file (or folder) read.
    pub path: PathBuf,
}

/// Reads `path` in `format`, with the client ids of each row when `natural_split`.
pub fn load(
    path: &Path,
    format: &Format,
    classes: &Classes,
    natural_split: bool,
) -> Result<Table, FileError> {
    let rows = match format {
        Format::Npz => arrays::load_npz(path, natural_split)?,
        Format::Npy => arrays::load_npy_folder(path, natural_split)?,
        Format::Csv(columns) => table::load_csv(path, columns, natural_split)?,
        Format::Images => images::load_folder(path, classes.names.as_deref(), natural_split)?,
    };
    finish(path, rows, classes)
}

/// Checks `rows`' labels against `classes` (non-negative, below the count, every class present
/// when asked) and numbers the clients, for every format alike.
pub fn finish(path: &Path, rows: Rows, classes: &Classes) -> Result<Table, FileError> {
    let label_error = |row: usize, value: i64, expected: String| FileError::Label {
        path: path.to_path_buf(),
        row,
        value: value.to_string(),
        expected,
    };
    if let Some((row, &value)) = rows.labels.iter().enumerate().find(|(_, v)| **v < 0) {
        return Err(label_error(row, value, "a class index ≥ 0".into()));
    }
    let largest = rows.labels.iter().copied().max().unwrap_or(-1);
    let count = match (classes.count, &rows.class_names) {
        (Some(count), _) => count,
        (None, Some(names)) => names.len(),
        (None, None) => usize::try_from(largest + 1).unwrap_or(usize::MAX),
    };
    if let Some((row, &value)) = (rows.labels.iter().enumerate())
        .find(|(_, v)| usize::try_from(**v).map_or(true, |v| v >= count))
    {
        let expected = match classes.count {
            Some(_) => format!("below classes = {count}"),
            None => format!("below {count}, the training data's number of classes"),
        };
        return Err(label_error(row, value, expected));
    }
    let labels: Vec<u32> = rows.labels.iter().map(|&l| l as u32).collect();
    if classes.every_class {
        let counts = super::class_counts(&labels, count);
        if let Some(class) = counts.iter().position(|&c| c == 0) {
            return Err(FileError::EmptyClass {
                path: path.to_path_buf(),
                class,
                classes: count,
            });
        }
    }
    let dim = rows.shape.iter().product();
    let data =
        Dataset::new(rows.features, labels, dim, count).map_err(|cause| FileError::Data {
            path: path.to_path_buf(),
            cause,
        })?;
    let (clients, client_names) = match rows.clients {
        Some(ids) => {
            let (of_row, names) = number_clients(&ids);
            (Some(of_row), names)
        }
        None => (None, Vec::new()),
    };
    Ok(Table {
        data,
        shape: rows.shape,
        clients,
        client_names,
        class_names: rows.class_names,
        path: path.to_path_buf(),
    })
}

/// Each row's client index and the distinct ids in index order: as numbers when every id is an
/// integer (so `10` follows `9`), else as text.
fn number_clients(ids: &[String]) -> (Vec<usize>, Vec<String>) {
    let numeric = ids.iter().all(|id| id.parse::<i64>().is_ok());
    let key = |id: &str| -> (i64, String) {
        match numeric {
            true => (id.parse().unwrap_or(0), String::new()),
            false => (0, id.to_owned()),
        }
    };
    let mut order: BTreeMap<(i64, String), usize> = BTreeMap::new();
    for id in ids {
        order.entry(key(id)).or_insert(0);
    }
    let mut names = Vec::with_capacity(order.len());
    for (index, ((number, text), slot)) in order.iter_mut().enumerate() {
        *slot = index;
        names.push(if numeric {
            number.to_string()
        } else {
            text.clone()
        });
    }
    let of_row = ids.iter().map(|id| order[&key(id)]).collect();
    (of_row, names)
}

/// Each client's row indices for a natural split of `of_row` (a row's client index) over
/// `clients` clients.
pub fn natural_parts(of_row: &[usize], rows: &[usize], clients: usize) -> Vec<Vec<usize>> {
    let mut parts = vec![Vec::new(); clients];
    for (at, &row) in rows.iter().enumerate() {
        if let Some(part) = parts.get_mut(of_row[row]) {
            part.push(at);
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(labels: Vec<i64>) -> Rows {
        Rows {
            features: vec![0.5; labels.len()],
            shape: vec![1],
            labels,
            clients: None,
            class_names: None,
        }
    }

    #[test]
    fn labels_are_checked_once_for_every_format() {
        let path = Path::new("t.npz");
        let t = finish(path, rows(vec![0, 2, 1]), &Classes::default()).unwrap();
        assert_eq!((t.data.classes, t.data.labels.clone()), (3, vec![0, 2, 1]));
        let e = finish(path, rows(vec![0, -1]), &Classes::default()).unwrap_err();
        assert!(
            e.to_string()
                .contains("row 1 (from 0): label -1 is not a class index ≥ 0"),
            "{e}"
        );
        let given = Classes {
            count: Some(2),
            every_class: true,
            ..Classes::default()
        };
        let e = finish(path, rows(vec![0, 2]), &given).unwrap_err();
        assert!(
            e.to_string().contains("label 2 is not below classes = 2"),
            "{e}"
        );
        let e = finish(path, rows(vec![0, 0]), &given).unwrap_err();
        assert!(matches!(e, FileError::EmptyClass { class: 1, .. }), "{e}");
    }

    #[test]
    fn client_ids_are_numbered_as_numbers_when_they_are() {
        let ids: Vec<String> = ["10", "9", "10", "2"].map(String::from).to_vec();
        let (of_row, names) = number_clients(&ids);
        assert_eq!(names, ["2", "9", "10"]);
        assert_eq!(of_row, [2, 1, 2, 0]);
        let ids: Vec<String> = ["bob", "al"].map(String::from).to_vec();
        assert_eq!(
            number_clients(&ids),
            (vec![1, 0], vec!["al".into(), "bob".into()])
        );
    }
}
