//! CSV tables through the `csv` crate: a header row, a label column named in the config,
//! feature columns (a list, or every other column) and, for a natural split, a client column.
//!
//! Records stream from the file; memory is the `Vec<f32>` of features (4 bytes per value), the
//! labels and, for a natural split, one client id string per row.

use std::path::Path;

use super::{CsvColumns, Rows};
use crate::data::files::FileError;

/// Reads the CSV file at `path`.
pub fn load_csv(path: &Path, columns: &CsvColumns, natural_split: bool) -> Result<Rows, FileError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .trim(csv::Trim::All)
        .from_path(path)
        .map_err(|e| csv_error(path, e))?;
    let header: Vec<String> = reader
        .headers()
        .map_err(|e| csv_error(path, e))?
        .iter()
        .map(String::from)
        .collect();
    let find = |name: &str, expected: &'static str| {
        header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| FileError::MissingPart {
                path: path.to_path_buf(),
                what: "column",
                name: name.to_owned(),
                expected,
                found: header.clone(),
            })
    };
    let label = find(&columns.label, "the label column, `label_column`")?;
    let client = match natural_split {
        true => Some(find(
            &columns.client,
            "the client column of natural_split, `client_column`",
        )?),
        false => None,
    };
    let features: Vec<usize> = match &columns.features {
        Some(names) => names
            .iter()
            .map(|name| find(name, "a column of `feature_columns`"))
            .collect::<Result<_, _>>()?,
        None => (0..header.len())
            .filter(|&c| c != label && Some(c) != client)
            .collect(),
    };
    if features.is_empty() {
        return Err(FileError::Shape {
            path: path.to_path_buf(),
            part: "header".into(),
            expected: "at least one feature column besides the label".into(),
            found: format!("columns {header:?}"),
        });
    }
    let mut rows = Rows {
        features: Vec::new(),
        shape: vec![features.len()],
        labels: Vec::new(),
        clients: client.map(|_| Vec::new()),
        class_names: None,
    };
    let mut record = csv::StringRecord::new();
    while reader
        .read_record(&mut record)
        .map_err(|e| csv_error(path, e))?
    {
        let line = record.position().map_or(0, |p| p.line());
        let cell = |column: usize| record.get(column).unwrap_or("");
        let bad = |column: usize, expected: &str| FileError::Shape {
            path: path.to_path_buf(),
            part: format!("line {line}, column `{}`", header[column]),
            expected: expected.to_owned(),
            found: format!("{:?}", cell(column)),
        };
        for &column in &features {
            let value: f32 = cell(column).parse().map_err(|_| bad(column, "a number"))?;
            rows.features.push(value);
        }
        let text = cell(label);
        let value = match text.parse::<i64>() {
            Ok(v) => v,
            Err(_) => match text.parse::<f64>() {
                Ok(v) if v.fract() == 0.0 && v.abs() < 9.0e15 => v as i64,
                _ => return Err(bad(label, "an integer class index")),
            },
        };
        rows.labels.push(value);
        if let (Some(column), Some(ids)) = (client, rows.clients.as_mut()) {
            ids.push(cell(column).to_owned());
        }
    }
    Ok(rows)
}

fn csv_error(path: &Path, e: csv::Error) -> FileError {
    match e.kind() {
        csv::ErrorKind::Io(_) => FileError::Io {
            path: path.to_path_buf(),
            cause: std::io::Error::other(e.to_string()),
        },
        _ => FileError::Format {
            path: path.to_path_buf(),
            expected: "a CSV table with a header row and the same number of fields on every line",
            cause: e.to_string(),
        },
    }
}

/// Writes `features` (rows of `dim`) and `labels` as a CSV table with the header
/// `label,f0,f1,…`; values in Rust's shortest form, which parses back to the same `f32`.
pub fn write_csv(
    path: &Path,
    features: &[f32],
    labels: &[u32],
    dim: usize,
) -> Result<(), FileError> {
    let io = |e: csv::Error| FileError::Io {
        path: path.to_path_buf(),
        cause: std::io::Error::other(e.to_string()),
    };
    let mut writer = csv::Writer::from_path(path).map_err(io)?;
    let mut header = vec!["label".to_owned()];
    header.extend((0..dim).map(|j| format!("f{j}")));
    writer.write_record(&header).map_err(io)?;
    for (row, label) in features.chunks_exact(dim.max(1)).zip(labels) {
        let mut record = vec![label.to_string()];
        record.extend(row.iter().map(f32::to_string));
        writer.write_record(&record).map_err(io)?;
    }
    writer.flush().map_err(|cause| FileError::Io {
        path: path.to_path_buf(),
        cause,
    })
}
