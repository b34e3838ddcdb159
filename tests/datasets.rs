//! The file-backed datasets and partitions, offline, on files written here with known contents.

use std::io::Write;
use std::path::{Path, PathBuf};

use fedshard::data::cifar::{self, Split};
use flate2::{Compression, write::GzEncoder};

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

// ---------------------------------------------------------------------------------------------
// CIFAR.

/// Pixel `j` of an image with label byte `label`: distinct across planes and images.
fn pixel(label: u8, j: usize) -> u8 {
    ((j * 7 + usize::from(label) * 13) % 256) as u8
}

fn cifar_records(labels: &[&[u8]]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for record in labels {
        bytes.extend_from_slice(record);
        let last = *record.last().unwrap();
        bytes.extend((0..cifar::IMAGE_DIM).map(|j| pixel(last, j)));
    }
    bytes
}

fn normalised(p: u8, mean: f32, std: f32) -> f32 {
    (f32::from(p) / 255.0 - mean) / std
}

/// `cifar-10-batches-bin/` with two images per training batch (labels 2b−2, 2b−1 for batch b)
/// and three test images (labels 9, 0, 5).
fn write_cifar10(root: &Path) -> PathBuf {
    let dir = root.join("cifar-10-batches-bin");
    std::fs::create_dir_all(&dir).unwrap();
    for b in 1..=5u8 {
        let records = cifar_records(&[&[2 * b - 2], &[2 * b - 1]]);
        std::fs::write(dir.join(format!("data_batch_{b}.bin")), records).unwrap();
    }
    std::fs::write(
        dir.join("test_batch.bin"),
        cifar_records(&[&[9], &[0], &[5]]),
    )
    .unwrap();
    dir
}

#[test]
fn cifar10_decodes_labels_and_normalised_chw_pixels() {
    let root = tempfile::tempdir().unwrap();
    write_cifar10(root.path());
    // The parent folder is accepted: the loader looks into cifar-10-batches-bin/.
    let train = cifar::load_cifar10(root.path(), Split::Train).unwrap();
    assert_eq!(train.labels, (0..10).collect::<Vec<u32>>());
    assert_eq!((train.dim, train.classes), (3072, 10));
    let test = cifar::load_cifar10(&root.path().join("cifar-10-batches-bin"), Split::Test).unwrap();
    assert_eq!(test.labels, vec![9, 0, 5]);

    // Image 7 (label 7): red (0, 0), green (0, 5) and blue (31, 31) pixels.
    let row = train.row(7);
    for (at, channel) in [(0, 0), (1024 + 5, 1), (2047 + 1024, 2)] {
        let expected = normalised(
            pixel(7, at),
            cifar::CIFAR10_MEAN[channel],
            cifar::CIFAR10_STD[channel],
        );
        assert!((row[at] - expected).abs() < 1e-6, "feature {at}");
    }
    // A white pixel in the red plane: (1 − 0.4914) / 0.2470.
    let white = (0..3072).find(|&j| pixel(9, j) == 255).unwrap();
    assert!(white < 1024);
    assert!((test.row(0)[white] - 2.0591).abs() < 1e-4);
}

#[test]
fn cifar10_errors_name_the_file() {
    let root = tempfile::tempdir().unwrap();
    let dir = write_cifar10(root.path());

    std::fs::remove_file(dir.join("data_batch_3.bin")).unwrap();
    let e = cifar::load_cifar10(&dir, Split::Train)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("data_batch_3.bin") && e.contains(&dir.display().to_string()),
        "{e}"
    );
    assert!(e.contains("test_batch.bin"), "expected names listed: {e}");

    let mut short = cifar_records(&[&[1]]);
    short.pop();
    std::fs::write(dir.join("test_batch.bin"), short).unwrap();
    let e = cifar::load_cifar10(&dir, Split::Test)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("test_batch.bin") && e.contains("3073-byte"),
        "{e}"
    );

    std::fs::write(dir.join("test_batch.bin"), cifar_records(&[&[1], &[10]])).unwrap();
    let e = cifar::load_cifar10(&dir, Split::Test)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("test_batch.bin") && e.contains("record 1") && e.contains("label 10"),
        "{e}"
    );
}

#[test]
fn cifar100_keeps_coarse_and_fine_labels() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("cifar-100-binary");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("train.bin"),
        cifar_records(&[&[4, 0], &[19, 58], &[0, 99]]),
    )
    .unwrap();
    // Gzipped files are read too.
    std::fs::write(dir.join("test.bin"), gzip(&cifar_records(&[&[7, 3]]))).unwrap();

    let train = cifar::load_cifar100(root.path(), Split::Train).unwrap();
    assert_eq!(train.data.labels, vec![0, 58, 99]);
    assert_eq!(train.coarse, vec![4, 19, 0]);
    assert_eq!(train.data.classes, 100);
    let row = train.data.row(1);
    let expected = normalised(
        pixel(58, 2048),
        cifar::CIFAR100_MEAN[2],
        cifar::CIFAR100_STD[2],
    );
    assert!((row[2048] - expected).abs() < 1e-6);
    let test = cifar::load_cifar100(&dir, Split::Test).unwrap();
    assert_eq!((test.coarse, test.data.labels), (vec![7], vec![3]));
}

#[test]
fn cifar100_errors_name_the_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let e = cifar::load_cifar100(dir.path(), Split::Train)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("train.bin") && e.contains("cifar-100-binary"),
        "{e}"
    );

    let train = dir.path().join("train.bin");
    for (records, needle) in [
        (vec![[20u8, 0]], "coarse label 20 is not below 20"),
        (vec![[0, 0], [3, 100]], "fine label 100 is not below 100"),
    ] {
        let refs: Vec<&[u8]> = records.iter().map(|r| r.as_slice()).collect();
        std::fs::write(&train, cifar_records(&refs)).unwrap();
        let e = cifar::load_cifar100(dir.path(), Split::Train)
            .unwrap_err()
            .to_string();
        assert!(e.contains("train.bin") && e.contains(needle), "{e}");
    }
    std::fs::write(&train, vec![0u8; 3073 * 2]).unwrap();
    let e = cifar::load_cifar100(dir.path(), Split::Train)
        .unwrap_err()
        .to_string();
    assert!(e.contains("train.bin") && e.contains("3074-byte"), "{e}");
}
