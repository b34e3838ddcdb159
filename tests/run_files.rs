//! The files of a run folder as a resumed run and `eval` read them back (real subprocesses of
//! the `fedshard` binary on a three-round run of the digits): a folder without a checkpoint, a
//! damaged checkpoint or model, or one that is a link to a device is refused naming the file,
//! and leaves every output as it was.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_fedshard");

/// The files a refused resume must leave as they were.
const OUTPUTS: [&str; 5] = [
    "config.toml",
    "metrics.jsonl",
    "metrics.csv",
    "model.bin",
    "summary.json",
];

/// `fedshard ARGS`, killed after 60 s: a read that never ends (a link to `/dev/zero`) fails the
/// test instead of hanging it.
fn fedshard(args: &[&str]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("fedshard {args:?} ran for a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// A finished three-round run of `config/digits-linear.toml` in `dir/run`.
fn finished_run(dir: &Path) -> PathBuf {
    let config = dir.join("digits.toml");
    let text = std::fs::read_to_string("config/digits-linear.toml")
        .unwrap()
        .replace("rounds = 30", "rounds = 3");
    std::fs::write(&config, text).unwrap();
    let run = dir.join("run");
    let out = fedshard(&[
        "run",
        "--quiet",
        "--metrics-addr",
        "off",
        "--out",
        run.to_str().unwrap(),
        config.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    run
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The bytes of each output present in `run` (of a link, where it points: the test's own links
/// lead to `/dev/zero`).
fn outputs(run: &Path) -> BTreeMap<&'static str, Vec<u8>> {
    OUTPUTS
        .iter()
        .filter_map(|name| {
            let path = run.join(name);
            let bytes = match std::fs::read_link(&path) {
                Ok(target) => target.to_str()?.as_bytes().to_vec(),
                Err(_) => std::fs::read(&path).ok()?,
            };
            Some((*name, bytes))
        })
        .collect()
}

/// `fedshard ARGS` fails, says `expected` naming `file`, and leaves `run`'s outputs alone.
fn refused(run: &Path, args: &[&str], file: &str, expected: &str) {
    let before = outputs(run);
    let out = fedshard(args);
    let err = stderr(&out);
    assert!(!out.status.success(), "{args:?} succeeded:\n{err}");
    assert!(
        err.contains(file) && err.contains(expected),
        "{args:?}: no `{file}` and `{expected}` in:\n{err}"
    );
    assert_eq!(outputs(run), before, "{args:?} changed the outputs");
}

fn resume(run: &Path) -> Vec<&str> {
    let run = run.to_str().unwrap();
    vec![
        "run",
        "--quiet",
        "--metrics-addr",
        "off",
        "--resume",
        run,
        "--rounds",
        "5",
    ]
}

#[test]
fn a_resume_without_a_checkpoint_fails_and_touches_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let run = finished_run(tmp.path());
    std::fs::remove_file(run.join("checkpoint.bin")).unwrap();
    refused(
        &run,
        &resume(&run),
        "checkpoint.bin",
        "no checkpoint.bin to resume",
    );
    let serve = [
        "serve",
        "--resume",
        run.to_str().unwrap(),
        "--listen",
        "127.0.0.1:1",
        "--metrics-addr",
        "off",
    ];
    let before = outputs(&run);
    let out = Command::new(BIN)
        .args(serve)
        .env(
            "FEDSHARD_SECRET",
            "2d1e2381f9d3c1d56fccc3b0b2da32b4c659fca9468823bac64879f1e5b69e50",
        )
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(
        !out.status.success() && err.contains("no checkpoint.bin"),
        "{err}"
    );
    assert_eq!(outputs(&run), before);
}

/// The damage: 8 bytes `ff ff ff ff ff ff ff 7f` at offset 16, one flipped byte in the
/// middle; each made a resume run on into a NaN model over the good outputs, and `eval` print
/// NaN.
#[test]
fn a_damaged_checkpoint_or_model_is_refused_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let run = finished_run(tmp.path());
    let eval = ["eval", run.to_str().unwrap()];
    let out = fedshard(&eval);
    assert!(out.status.success(), "{}", stderr(&out));
    for file in ["checkpoint.bin", "model.bin"] {
        let path = run.join(file);
        let good = std::fs::read(&path).unwrap();
        let mut over_header = good.clone();
        over_header[16..24].copy_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]);
        let mut flipped = good.clone();
        flipped[good.len() / 2] ^= 0x01;
        for bad in [over_header, flipped] {
            std::fs::write(&path, bad).unwrap();
            let args = if file == "model.bin" {
                eval.to_vec()
            } else {
                resume(&run)
            };
            refused(&run, &args, file, "not a fedshard");
        }
        std::fs::write(&path, good).unwrap();
    }
}

/// A checkpoint or model that is a link to `/dev/zero` made `run --resume` and `eval` grow by
/// gigabytes in seconds; now neither is read.
#[cfg(unix)]
#[test]
fn a_checkpoint_or_model_that_is_not_a_regular_file_is_not_read() {
    let tmp = tempfile::tempdir().unwrap();
    let run = finished_run(tmp.path());
    for file in ["checkpoint.bin", "model.bin"] {
        let path = run.join(file);
        let kept = tmp.path().join(file);
        std::fs::rename(&path, &kept).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        let args = if file == "model.bin" {
            vec!["eval", run.to_str().unwrap()]
        } else {
            resume(&run)
        };
        refused(&run, &args, file, "not a regular file");
        std::fs::remove_file(&path).unwrap();
        std::fs::rename(&kept, &path).unwrap();
    }
}

/// A model that does not fit the run's config is refused with its cause said once (it was
/// said twice, by the evaluation error and again as its source).
#[test]
fn eval_names_a_missing_tensor_once() {
    use fedshard_protocol::model::{ModelState, NamedTensor};
    let tmp = tempfile::tempdir().unwrap();
    let run = finished_run(tmp.path());
    let model = ModelState::read_file(&run.join("model.bin")).unwrap();
    let without_bias = ModelState::new(
        model
            .tensors
            .iter()
            .filter(|t| t.name != "fc0.bias")
            .cloned()
            .collect::<Vec<NamedTensor>>(),
    )
    .unwrap();
    std::fs::write(run.join("model.bin"), without_bias.to_file_bytes()).unwrap();
    let out = fedshard(&["eval", run.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert_eq!(err.matches("`fc0.bias`").count(), 1, "{err}");
}
