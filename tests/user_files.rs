//! `dataset = "files"`: the user's own NPZ/NPY arrays, CSV tables and image folders.
//!
//! The oracle for the formats is the embedded digits: `fedshard data export-digits` writes them
//! out, and reading the files back must give the same rows and labels (exactly for NPZ and CSV,
//! within half an 8-bit level for PNG), the same federation as `dataset = "digits"`, and a run
//! that learns. Every bad input gets its own test, with its fixture written here in a tempdir,
//! and must give an error that names the file, the part and the expected form.

mod common;

use std::path::{Path, PathBuf};

use fedshard::config::Config;
use fedshard_training::data::digits;
use fedshard_training::data::files::FileError;
use fedshard_training::data::user::arrays::{NamedArray, write_npz};
use fedshard_training::data::user::export::export_digits;
use fedshard_training::data::user::{self, Classes, CsvColumns, Format};

fn csv_format(label: &str) -> Format {
    Format::Csv(CsvColumns {
        label: label.into(),
        features: None,
        client: "client".into(),
    })
}

/// An NPY file written by hand (format 1.0): the header dict padded to 64 bytes, then `data`.
fn npy(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.bytes());
    out.extend(data);
    out
}

fn load(path: &Path, format: &Format, classes: &Classes) -> Result<user::Table, FileError> {
    user::load(path, format, classes, false)
}

/// A config for `dataset = "files"` on `data` (the `[data]` lines after `dataset`), with the
/// shipped files config's model and federation.
fn files_config(data: &str) -> String {
    let shipped = std::fs::read_to_string("config/files-digits-npz.toml").expect("shipped");
    let (head, rest) = shipped.split_once("[data]").expect("[data]");
    let (_, tail) = rest.split_once("[model]").expect("[model]");
    // Few clients in the small fixtures: ask two a round.
    format!("{head}[data]\ndataset = \"files\"\n{data}\n\n[model]{tail}")
        .replace("clients_per_round = 10", "clients_per_round = 2")
}

fn parse(text: &str) -> Config {
    Config::parse(text, Path::new("files.toml")).expect("a valid config")
}

// ---------------------------------------------------------------------------------------------
// The digits, round trip.

#[test]
fn npz_and_csv_give_back_the_embedded_digits_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let exported = export_digits(dir.path()).unwrap();
    let expected = digits::load().unwrap();
    assert_eq!(exported.rows, 1797);
    let npz = load(&exported.npz, &Format::Npz, &Classes::default()).unwrap();
    assert_eq!(npz.data, expected);
    assert_eq!(npz.shape, vec![8, 8]);
    let csv = load(&exported.csv, &csv_format("label"), &Classes::default()).unwrap();
    assert_eq!(csv.data, expected);
    assert_eq!(csv.shape, vec![64]);
}

#[test]
fn the_png_folder_gives_the_digits_in_class_order_within_half_a_level() {
    let dir = tempfile::tempdir().unwrap();
    let exported = export_digits(dir.path()).unwrap();
    let expected = digits::load().unwrap();
    let png = load(&exported.png, &Format::Images, &Classes::default()).unwrap();
    // Class folders 0…9, each image named by its embedded row: class order, then row order.
    let mut order: Vec<usize> = (0..expected.len()).collect();
    order.sort_by_key(|&i| (expected.labels[i], i));
    let expected = expected.subset(&order).unwrap();
    assert_eq!(png.data.labels, expected.labels);
    assert_eq!(
        (png.data.dim, png.data.classes, png.shape.clone()),
        (64, 10, vec![1, 8, 8])
    );
    let worst = (png.data.features.iter().zip(&expected.features))
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst <= 0.5 / 255.0 + 1e-6, "worst pixel error {worst}");
    let names: Vec<String> = (0..10).map(|c| c.to_string()).collect();
    assert_eq!(png.class_names, Some(names));
}

#[test]
fn a_files_config_deals_the_same_rows_to_the_same_clients_as_digits() {
    let dir = tempfile::tempdir().unwrap();
    let exported = export_digits(dir.path()).unwrap();
    let split =
        "clients = 20\ntest_fraction = 0.2\nalpha = 1.0\nsize_sigma = 0.5\nmin_samples = 20";
    let files = parse(&files_config(&format!(
        "format = \"npz\"\npath = {:?}\nnormalize = \"none\"\n{split}",
        exported.npz
    )));
    let digits = parse(
        &files_config(&format!("{split}\n")).replace("dataset = \"files\"", "dataset = \"digits\""),
    );
    let from_files = fedshard::federation::partition(&files).unwrap();
    assert_eq!(
        from_files,
        fedshard::federation::partition(&digits).unwrap()
    );
    assert_eq!(from_files.clients.len(), 20);
    assert!(from_files.test.is_some());
}

/// Each shipped files config, pointed at a fresh export, runs a few rounds and learns (chance
/// is 0.1; the digits MLP passes 0.6 within four rounds).
#[test]
fn the_shipped_files_configs_run_and_learn() {
    let dir = tempfile::tempdir().unwrap();
    let exported = export_digits(dir.path()).unwrap();
    for (name, path) in [
        ("npz", &exported.npz),
        ("csv", &exported.csv),
        ("png", &exported.png),
    ] {
        let shipped = format!("config/files-digits-{name}.toml");
        let text = std::fs::read_to_string(&shipped).expect("shipped");
        let shipped_path = match name {
            "png" => "data/digits/digits-png".to_owned(),
            _ => format!("data/digits/digits.{name}"),
        };
        assert!(
            text.contains(&shipped_path),
            "{shipped} reads {shipped_path}"
        );
        let text = text
            .replace(&format!("{shipped_path:?}"), &format!("{path:?}"))
            .replace("rounds = 30", "rounds = 4");
        let config = parse(&text);
        let (_, summary) = fedshard::federation::run_to_end(&config).expect("runs");
        assert!(
            summary.final_accuracy > 0.6,
            "{name}: {}",
            summary.final_accuracy
        );
    }
}

#[test]
fn export_digits_is_a_command() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("digits");
    let out_arg = out.to_str().unwrap();
    common::stdout_of(&["data", "export-digits", "--out", out_arg]);
    for name in ["digits.npz", "digits.csv", "digits-png/9"] {
        assert!(out.join(name).exists(), "{name}");
    }
}

// ---------------------------------------------------------------------------------------------
// Natural splits and test files.

/// `x.npy` (uint8, [6, 2, 2]), `y.npy` (int32) and `client.npy` (int64 ids 7, 3, 7, 3, 7, 3)
/// in `dir`.
fn npy_folder(dir: &Path, labels: &[i32]) -> PathBuf {
    let n = labels.len();
    let x: Vec<u8> = (0..n * 4).map(|v| v as u8).collect();
    std::fs::write(dir.join("x.npy"), npy("|u1", &[n, 2, 2], &x)).unwrap();
    let y: Vec<u8> = labels.iter().flat_map(|l| l.to_le_bytes()).collect();
    std::fs::write(dir.join("y.npy"), npy("<i4", &[n], &y)).unwrap();
    let ids: Vec<u8> = (0..n)
        .flat_map(|i| (if i % 2 == 0 { 7i64 } else { 3 }).to_le_bytes())
        .collect();
    std::fs::write(dir.join("client.npy"), npy("<i8", &[n], &ids)).unwrap();
    dir.to_path_buf()
}

#[test]
fn npy_integers_become_f32_rows_and_client_ids_a_natural_split() {
    let dir = tempfile::tempdir().unwrap();
    let folder = npy_folder(dir.path(), &[0, 1, 1, 0, 0, 1]);
    let table = user::load(&folder, &Format::Npy, &Classes::default(), true).unwrap();
    assert_eq!(table.shape, vec![2, 2]);
    assert_eq!(table.data.row(1), &[4.0, 5.0, 6.0, 7.0]);
    // Ids 3 and 7, numbered in numeric order: rows of id 3 are client 0.
    assert_eq!(table.client_names, vec!["3", "7"]);
    assert_eq!(table.clients, Some(vec![1, 0, 1, 0, 1, 0]));
    let test = dir.path().join("test");
    std::fs::create_dir(&test).unwrap();
    npy_folder(&test, &[1, 0]);
    let config = parse(
        &files_config(&format!(
            "format = \"npy\"\npath = {folder:?}\ntest_path = {test:?}\nclients = 2\n\
         natural_split = true\nnormalize = \"standardize\""
        ))
        .replace("inputs = 64", "inputs = 4")
        .replace("classes = 10", "classes = 2")
        .replace("hidden = [128, 64]", "hidden = [4, 4]"),
    );
    let partition = fedshard::federation::partition(&config).unwrap();
    assert_eq!(partition.clients, vec![vec![1, 3, 5], vec![0, 2, 4]]);
    assert_eq!(partition.test, None);
}

#[test]
fn a_natural_split_must_name_the_configured_number_of_clients() {
    let dir = tempfile::tempdir().unwrap();
    let folder = npy_folder(dir.path(), &[0, 1, 1, 0, 0, 1]);
    let config = parse(&files_config(&format!(
        "format = \"npy\"\npath = {folder:?}\nclients = 3\nnatural_split = true\nnormalize = \"none\""
    )));
    let e = format!(
        "{:#}",
        fedshard::federation::partition(&config).unwrap_err()
    );
    assert!(
        e.contains("field `data.clients`") && e.contains("name 2 clients, but data.clients = 3"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------------
// Bad input: one test per case, each error naming the file, the part and the expected form.

fn digits_npz(dir: &Path) -> PathBuf {
    export_digits(dir).unwrap().npz
}

#[test]
fn rows_that_do_not_fit_the_model_are_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let npz = digits_npz(dir.path());
    let config = parse(
        &files_config(&format!(
            "format = \"npz\"\npath = {npz:?}\nclients = 4\nnormalize = \"none\""
        ))
        .replace("inputs = 64", "inputs = 32"),
    );
    let e = format!(
        "{:#}",
        fedshard::federation::partition(&config).unwrap_err()
    );
    assert!(e.contains("field `model.network`"), "{e}");
    assert!(e.contains("digits.npz: the data has 64 features per row and 10 classes, but the model expects 32 features and 10 classes"), "{e}");
}

#[test]
fn a_negative_label_is_refused_with_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("neg.npz");
    write_npz(
        &path,
        &[
            NamedArray::F32("x", vec![3, 2], &[0.0; 6]),
            NamedArray::I64("y", vec![3], &[0, -1, 1]),
        ],
    )
    .unwrap();
    let e = load(&path, &Format::Npz, &Classes::default()).unwrap_err();
    assert!(matches!(e, FileError::Label { row: 1, .. }), "{e}");
    assert!(
        e.to_string()
            .contains("neg.npz: row 1 (from 0): label -1 is not a class index ≥ 0"),
        "{e}"
    );
}

#[test]
fn a_label_out_of_the_stated_classes_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.csv");
    std::fs::write(&path, "a,label,b\n0.5,0,1\n0.25,3,2\n").unwrap();
    let classes = Classes {
        count: Some(3),
        every_class: true,
        ..Classes::default()
    };
    let e = load(&path, &csv_format("label"), &classes).unwrap_err();
    assert!(
        e.to_string()
            .contains("t.csv: row 1 (from 0): label 3 is not below classes = 3"),
        "{e}"
    );
}

#[test]
fn a_stated_class_without_rows_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gap.npz");
    write_npz(
        &path,
        &[
            NamedArray::F32("x", vec![3, 1], &[0.0; 3]),
            NamedArray::I64("y", vec![3], &[0, 0, 2]),
        ],
    )
    .unwrap();
    let classes = Classes {
        count: Some(3),
        every_class: true,
        ..Classes::default()
    };
    let e = load(&path, &Format::Npz, &classes).unwrap_err();
    assert!(
        matches!(
            e,
            FileError::EmptyClass {
                class: 1,
                classes: 3,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("gap.npz: class 1 has no rows"),
        "{e}"
    );
}

#[test]
fn a_missing_csv_column_is_named_with_the_header() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.csv");
    std::fs::write(&path, "a,label\n0.5,0\n").unwrap();
    let e = load(&path, &csv_format("target"), &Classes::default()).unwrap_err();
    assert!(
        e.to_string().contains(
            "t.csv: no column `target` (the label column, `label_column`); the file holds a, label"
        ),
        "{e}"
    );
}

#[test]
fn a_cell_that_is_not_a_number_is_named_by_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.csv");
    std::fs::write(&path, "a,label\n0.5,0\nx,1\n0.1,1.5\n").unwrap();
    let e = load(&path, &csv_format("label"), &Classes::default()).unwrap_err();
    assert!(
        e.to_string()
            .contains("t.csv: line 3, column `a`: expected a number, found \"x\""),
        "{e}"
    );
    std::fs::write(&path, "a,label\n0.5,0\n0.1,1.5\n").unwrap();
    let e = load(&path, &csv_format("label"), &Classes::default()).unwrap_err();
    assert!(
        e.to_string()
            .contains("line 3, column `label`: expected an integer class index, found \"1.5\""),
        "{e}"
    );
}

#[test]
fn a_missing_x_or_y_array_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let only_x = dir.path().join("only_x.npz");
    write_npz(&only_x, &[NamedArray::F32("x", vec![2, 1], &[0.0; 2])]).unwrap();
    let e = load(&only_x, &Format::Npz, &Classes::default()).unwrap_err();
    assert!(
        e.to_string()
            .contains("only_x.npz: no array `y` (integer labels of shape [N]); the file holds x"),
        "{e}"
    );
    let only_y = dir.path().join("only_y.npz");
    write_npz(
        &only_y,
        &[
            NamedArray::I64("labels", vec![2], &[0, 1]),
            NamedArray::I64("y", vec![2], &[0, 1]),
        ],
    )
    .unwrap();
    let e = load(&only_y, &Format::Npz, &Classes::default()).unwrap_err();
    assert!(
        e.to_string()
            .contains("only_y.npz: no array `x` (features of shape [N, …]"),
        "{e}"
    );
    assert!(e.to_string().contains("the file holds labels, y"), "{e}");
    let e = load(dir.path(), &Format::Npy, &Classes::default()).unwrap_err();
    assert!(
        e.to_string().contains("no array `x`") && e.to_string().contains("the file holds none"),
        "{e}"
    );
}

#[test]
fn arrays_of_different_lengths_or_dtypes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.npz");
    write_npz(
        &path,
        &[
            NamedArray::F32("x", vec![3, 1], &[0.0; 3]),
            NamedArray::I64("y", vec![2], &[0, 1]),
        ],
    )
    .unwrap();
    let e = load(&path, &Format::Npz, &Classes::default()).unwrap_err();
    assert!(e.to_string().contains("t.npz: array `y`: expected integer labels of shape [N], N = 3 as the rows of `x`, found shape [2]"), "{e}");
    std::fs::write(dir.path().join("x.npy"), npy("<U1", &[2], &[0; 8])).unwrap();
    std::fs::write(dir.path().join("y.npy"), npy("<i8", &[2], &[0; 16])).unwrap();
    let e = load(dir.path(), &Format::Npy, &Classes::default()).unwrap_err();
    assert!(e.to_string().contains("x.npy: array `x`: expected features of shape [N, …], any integer, float or bool dtype, found dtype"), "{e}");
}

#[test]
fn a_truncated_array_or_archive_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    // The header promises 4 × 2 float32 values; 3 are there.
    std::fs::write(dir.path().join("x.npy"), npy("<f4", &[4, 2], &[0; 12])).unwrap();
    std::fs::write(dir.path().join("y.npy"), npy("<i8", &[4], &[0; 32])).unwrap();
    let e = load(dir.path(), &Format::Npy, &Classes::default()).unwrap_err();
    assert!(
        e.to_string().contains(
            "array `x`: expected 8 values as its header says, found a read error at value 3"
        ),
        "{e}"
    );
    let npz = digits_npz(&dir.path().join("d"));
    let bytes = std::fs::read(&npz).unwrap();
    std::fs::write(&npz, &bytes[..bytes.len() / 2]).unwrap();
    let e = load(&npz, &Format::Npz, &Classes::default()).unwrap_err();
    assert!(
        e.to_string()
            .contains("digits.npz: expected an NPZ archive"),
        "{e}"
    );
}

#[test]
fn a_corrupt_image_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let exported = export_digits(dir.path()).unwrap();
    let bad = exported.png.join("3").join("0003.png");
    let bytes = std::fs::read(&bad).unwrap();
    std::fs::write(&bad, &bytes[..bytes.len() - 20]).unwrap();
    let e = load(&exported.png, &Format::Images, &Classes::default()).unwrap_err();
    assert!(matches!(e, FileError::Image { format: "PNG", .. }), "{e}");
    assert!(
        e.to_string().contains("0003.png: not a readable PNG image"),
        "{e}"
    );
    std::fs::write(&bad, b"\xff\xd8\xff\xe0 not really a jpeg").unwrap();
    std::fs::rename(&bad, bad.with_extension("jpg")).unwrap();
    let e = load(&exported.png, &Format::Images, &Classes::default()).unwrap_err();
    assert!(
        e.to_string()
            .contains("0003.jpg: not a readable JPEG image"),
        "{e}"
    );
}

#[test]
fn images_of_another_size_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let exported = export_digits(dir.path()).unwrap();
    let odd = exported.png.join("5").join("9999.png");
    fedshard_training::data::user::images::write_gray_png(&odd, 4, 4, &[0.5; 16]).unwrap();
    let e = load(&exported.png, &Format::Images, &Classes::default()).unwrap_err();
    assert!(e.to_string().contains("9999.png: image: expected channels × height × width [1, 8, 8], as the first image, found [1, 4, 4]"), "{e}");
}

/// Damaged copies of a valid NPZ, CSV, PNG and JPEG (bits flipped, cut short) give errors or
/// rows, never a panic.
#[test]
fn damaged_files_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    // Small files of the first 50 digits, so that many damaged copies are read quickly.
    let digits = digits::load()
        .unwrap()
        .subset(&(0..50).collect::<Vec<_>>())
        .unwrap();
    let labels: Vec<i64> = digits.labels.iter().map(|&l| i64::from(l)).collect();
    let npz = dir.path().join("small.npz");
    write_npz(
        &npz,
        &[
            NamedArray::F32("x", vec![50, 8, 8], &digits.features),
            NamedArray::I64("y", vec![50], &labels),
        ],
    )
    .unwrap();
    let csv = dir.path().join("small.csv");
    user::table::write_csv(&csv, &digits.features, &digits.labels, 64).unwrap();
    // A small image folder of its own: one digit PNG and the JPEG fixture.
    let images = dir.path().join("images");
    for class in ["a", "b"] {
        std::fs::create_dir_all(images.join(class)).unwrap();
    }
    let png = images.join("a").join("0001.png");
    user::images::write_gray_png(&png, 8, 8, digits.row(1)).unwrap();
    let jpeg = images.join("b").join("python.jpg");
    std::fs::copy("tests/fixtures/images/python.jpg", &jpeg).unwrap();
    let originals: Vec<(PathBuf, Vec<u8>, Format, PathBuf)> = vec![
        (npz.clone(), Format::Npz, npz),
        (csv.clone(), csv_format("label"), csv),
        (png, Format::Images, images.clone()),
        (jpeg, Format::Images, images.clone()),
    ]
    .into_iter()
    .map(|(path, format, root)| {
        let bytes = std::fs::read(&path).unwrap();
        (path, bytes, format, root)
    })
    .collect();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for round in 0..200 {
        for (path, bytes, format, root) in &originals {
            let mut damaged = bytes.clone();
            for _ in 0..1 + round % 4 {
                let at = (next() as usize) % damaged.len();
                damaged[at] ^= 1 << (next() % 8);
            }
            if round % 5 == 0 {
                damaged.truncate((next() as usize) % bytes.len());
            }
            std::fs::write(path, &damaged).unwrap();
            let _ = load(root, format, &Classes::default());
            std::fs::write(path, bytes).unwrap();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// JPEG and palette PNG, against raw pixels.

/// The fixture's raw pixels (binary PPM, `P6\n16 16\n255\n`), channels-first in `[0, 1]`.
fn ppm_pixels() -> Vec<f32> {
    let bytes = std::fs::read("tests/fixtures/images/python.ppm").unwrap();
    let header = b"P6\n16 16\n255\n";
    assert!(bytes.starts_with(header));
    let rgb = &bytes[header.len()..];
    assert_eq!(rgb.len(), 16 * 16 * 3);
    (0..3)
        .flat_map(|c| rgb.iter().skip(c).step_by(3).map(|&v| f32::from(v) / 255.0))
        .collect()
}

#[test]
fn a_palette_png_and_a_jpeg_decode_to_channels_first_rgb() {
    let dir = tempfile::tempdir().unwrap();
    for (class, file) in [("a-png", "python.png"), ("b-jpeg", "python.jpg")] {
        std::fs::create_dir(dir.path().join(class)).unwrap();
        std::fs::copy(
            Path::new("tests/fixtures/images").join(file),
            dir.path().join(class).join(file),
        )
        .unwrap();
    }
    let t = load(dir.path(), &Format::Images, &Classes::default()).unwrap();
    assert_eq!(
        (t.shape.clone(), t.data.labels.clone()),
        (vec![3, 16, 16], vec![0, 1])
    );
    let raw = ppm_pixels();
    // The PNG is lossless: its palette expands to the PPM's pixels exactly.
    assert_eq!(t.data.row(0), raw.as_slice());
    // The JPEG is lossy: close to the pixels on average, and never far off.
    let errors: Vec<f32> = (t.data.row(1).iter().zip(&raw))
        .map(|(a, b)| (a - b).abs())
        .collect();
    let mean = errors.iter().sum::<f32>() / errors.len() as f32;
    let worst = errors.iter().copied().fold(0.0, f32::max);
    assert!(
        mean < 0.05 && worst < 0.5,
        "JPEG error mean {mean}, worst {worst}"
    );
}

/// Reading the digits back from NPZ or CSV gives a federation that trains the very model of
/// `dataset = "digits"`: the same bytes after two rounds.
#[test]
fn npz_and_csv_runs_give_the_model_bytes_of_dataset_digits() {
    let dir = tempfile::tempdir().unwrap();
    let exported = export_digits(dir.path()).unwrap();
    let split =
        "clients = 20\ntest_fraction = 0.2\nalpha = 1.0\nsize_sigma = 0.5\nmin_samples = 20";
    let two_rounds = |text: String| parse(&text.replace("rounds = 30", "rounds = 2"));
    let model = |config: &Config| {
        fedshard::federation::run_to_end(config)
            .expect("runs")
            .0
            .to_bytes()
    };
    let digits = model(&two_rounds(
        files_config(&format!("{split}\n")).replace("dataset = \"files\"", "dataset = \"digits\""),
    ));
    for (format, path, extra) in [
        ("npz", &exported.npz, ""),
        ("csv", &exported.csv, "label_column = \"label\"\n"),
    ] {
        let files = two_rounds(files_config(&format!(
            "format = {format:?}\npath = {path:?}\n{extra}normalize = \"none\"\nclasses = 10\n{split}"
        )));
        assert!(
            model(&files) == digits,
            "{format}: another model than digits'"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The `[data]` fields: a field of another format or split is refused by name.

#[test]
fn files_fields_of_another_format_or_split_are_refused_by_name() {
    let base = "format = \"npz\"\npath = \"d.npz\"\nclients = 4\nnormalize = \"none\"";
    let refused = |extra: &str, base: &str| {
        let text = files_config(&format!("{base}\n{extra}"));
        format!(
            "{:#}",
            Config::parse(&text, Path::new("f.toml")).unwrap_err()
        )
    };
    for (extra, field, expected) in [
        (
            "label_column = \"y\"",
            "data.label_column",
            "it is a field of format = \"csv\"",
        ),
        (
            "test_path = \"t.npz\"\ntest_fraction = 0.1",
            "data.test_fraction",
            "no value with `data.test_path`",
        ),
        (
            "natural_split = true\nalpha = 0.5",
            "data.alpha",
            "no value with natural_split = true",
        ),
        (
            "test_fraction = 1.5",
            "data.test_fraction",
            "a fraction in (0, 1)",
        ),
        ("classes = 1", "data.classes", "at least 2"),
        ("shape = [8, 8]", "data.shape", "unknown field"),
    ] {
        let e = refused(extra, base);
        assert!(e.contains(field) && e.contains(expected), "{extra}: {e}");
    }
    let e = refused(
        "",
        &base.replace("normalize = \"none\"", "normalize = \"z-score\""),
    );
    assert!(
        e.contains("field `data.normalize`") && e.contains("expected \"none\", \"standardize\""),
        "{e}"
    );
    let e = refused("", &base.replace("normalize = \"none\"", ""));
    assert!(e.contains("normalize"), "{e}");
    let e = refused("", &base.replace("\"npz\"", "\"csv\""));
    assert!(e.contains("field `data.label_column`"), "{e}");
}

/// `root/CLIENT/CLASS/*.png`: clients from the first level, classes the sorted union of the
/// second; a test folder's classes are looked up by name, and one the training data lacks is
/// refused.
#[test]
fn an_image_folder_by_client_is_a_natural_split_and_its_test_folder_shares_its_classes() {
    use user::images::write_gray_png;
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train");
    for (client, class, name, value) in [
        ("alice", "cat", "1.png", 0.0),
        ("alice", "dog", "2.png", 1.0),
        ("bob", "dog", "3.png", 0.2), // 51 / 255 exactly
    ] {
        std::fs::create_dir_all(train.join(client).join(class)).unwrap();
        write_gray_png(
            &train.join(client).join(class).join(name),
            2,
            1,
            &[value; 2],
        )
        .unwrap();
    }
    let table = user::load(&train, &Format::Images, &Classes::default(), true).unwrap();
    assert_eq!(table.class_names, Some(vec!["cat".into(), "dog".into()]));
    assert_eq!(table.data.labels, vec![0, 1, 1]);
    assert_eq!(
        (table.client_names.clone(), table.clients.clone()),
        (vec!["alice".into(), "bob".into()], Some(vec![0, 0, 1]))
    );
    assert_eq!(table.data.features, vec![0.0, 0.0, 1.0, 1.0, 0.2, 0.2]);
    let known = Classes {
        count: Some(2),
        names: table.class_names.clone(),
        every_class: false,
    };
    let test = dir.path().join("test");
    std::fs::create_dir_all(test.join("dog")).unwrap();
    write_gray_png(&test.join("dog").join("4.png"), 2, 1, &[0.0; 2]).unwrap();
    let t = user::load(&test, &Format::Images, &known, false).unwrap();
    assert_eq!(t.data.labels, vec![1]);
    std::fs::create_dir_all(test.join("emu")).unwrap();
    let e = user::load(&test, &Format::Images, &known, false).unwrap_err();
    assert!(
        e.to_string()
            .contains("emu: class folder: expected one of the training classes [\"cat\", \"dog\"]"),
        "{e}"
    );
}

#[test]
fn a_csv_client_column_is_a_natural_split_and_listed_features_keep_their_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.csv");
    std::fs::write(&path, "user,b,label,a\nu2,1,0,10\nu1,2,1,20\nu2,3,1,30\n").unwrap();
    let format = Format::Csv(CsvColumns {
        label: "label".into(),
        features: Some(vec!["a".into(), "b".into()]),
        client: "user".into(),
    });
    let t = user::load(&path, &format, &Classes::default(), true).unwrap();
    assert_eq!(t.data.features, vec![10.0, 1.0, 20.0, 2.0, 30.0, 3.0]);
    assert_eq!(t.client_names, vec!["u1", "u2"]);
    assert_eq!(t.clients, Some(vec![1, 0, 1]));
    // Without a natural split the client column is not read, and with no list every other
    // column is a feature.
    let t = user::load(&path, &csv_format("label"), &Classes::default(), false);
    let e = t.unwrap_err();
    assert!(
        e.to_string()
            .contains("line 2, column `user`: expected a number, found \"u2\""),
        "{e}"
    );
}
