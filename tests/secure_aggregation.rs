//! Secure aggregation end to end (docs/secagg.md): a secure round folds what a plain round
//! folds, up to the fixed-point rounding, with sharded layers summed over the union of their
//! factor columns; its record tells the session; what a sum cannot serve is refused with its
//! reason.

mod common;

use fedshard::config::Config;
use std::path::Path;

const SHIPPED: &str = "config/digits-cnn-secagg.toml";

/// The shipped secure config (or, without its section, the plain main job) for `rounds` rounds.
fn config(secure: bool, rounds: u64) -> Config {
    let mut text = std::fs::read_to_string(SHIPPED)
        .unwrap()
        .replace("rounds = 40", &format!("rounds = {rounds}"));
    if !secure {
        let section = text.find("[secure_aggregation]").unwrap();
        text.truncate(section);
    }
    Config::parse(&text, Path::new("digits-cnn-secagg.toml")).expect("the config is valid")
}

/// The same seed trains the same updates, so after one round the two runs differ only by how
/// the server folded them: in the clear through FedAvg, or from the decoded secure sum. On the
/// sharded digits CNN the models agree to within the fixed-point steps: each of the ten
/// clients' values moves by at most 2⁻¹⁷, and the sum is divided by a total weight of at
/// least one. Later rounds drift further apart (the next round's SVD and shard draws amplify
/// the rounding, as any perturbation); `docs/secagg.md` compares whole runs.
#[test]
fn a_secure_run_folds_what_the_plain_run_folds() {
    let (plain_dir, secure_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_, plain, plain_summary) = common::run_in(plain_dir.path(), &config(false, 1));
    let (_, secure, summary) = common::run_in(secure_dir.path(), &config(true, 1));
    let mut largest = 0f32;
    for (a, b) in plain.tensors.iter().zip(&secure.tensors) {
        assert_eq!(a.name, b.name);
        for (x, y) in a.data.iter().zip(&b.data) {
            largest = largest.max((x - y).abs());
        }
    }
    assert!(largest < 1e-4, "largest difference {largest}");
    assert!(
        largest > 0.0,
        "the fixed point rounds: the models cannot be bit-identical"
    );
    for (p, s) in plain_summary.per_round.iter().zip(&summary.per_round) {
        assert!(
            (p.accuracy - s.accuracy).abs() <= 0.01,
            "{} vs {}",
            p.accuracy,
            s.accuracy
        );
        // Every trained client is in the sum; the server saw no loss of any of them.
        let session = s.secure.expect("a finished session");
        assert_eq!(session.survivors, p.successes);
        assert_eq!(s.successes, p.successes);
        assert_eq!(session.dropped, 0);
        // t = ⌈0.6 × 7⌉ over a client and its 6 neighbours.
        assert_eq!(session.threshold, 5);
        assert!(s.train_loss.is_nan());
        assert!(p.secure.is_none());
        // A masked input costs `bits` per value, and the key exchange a little more.
        let per_parameter = s.bits_per_parameter;
        assert!(
            per_parameter > f64::from(session.bits) * 0.5 && per_parameter < 64.0,
            "{per_parameter} bits per parameter with {}-bit values",
            session.bits
        );
    }
}

fn refused(text: &str) -> String {
    let base = std::fs::read_to_string(SHIPPED).unwrap();
    let edited = base.replace("[federation]\n", &format!("[federation]\n{text}\n"));
    let error = Config::parse(&edited, Path::new("secure.toml")).expect_err("refused");
    format!("{error:#}")
}

/// KLMS's index coding and QSGD's Elias code do not sum; the other compressors would but are
/// not wired; weights known only after the sum, norm-picked selection, async buffers and
/// server-side norm checks cannot serve a sum. Each is refused naming its field.
#[test]
fn what_a_sum_cannot_serve_is_refused_with_its_reason() {
    let base = std::fs::read_to_string(SHIPPED).unwrap();
    let with = |from: &str, to: &str| {
        assert!(base.contains(from), "{from}");
        let error =
            Config::parse(&base.replace(from, to), Path::new("secure.toml")).expect_err("refused");
        format!("{error:#}")
    };
    let klms = refused("compressor = \"signsgd-klms\"");
    assert!(
        klms.contains("federation.compressor") && klms.contains("names no candidate"),
        "{klms}"
    );
    let elias = refused("compressor = \"qsgd-elias\"");
    assert!(elias.contains("variable-length"), "{elias}");
    let qsgd = refused("compressor = \"qsgd\"");
    assert!(qsgd.contains("only the identity uplink is wired"), "{qsgd}");
    let fesc = with("aggregator = \"fedavg\"", "aggregator = \"fesc\"");
    assert!(fesc.contains("federation.aggregator"), "{fesc}");
    let selector = with(
        "selector = \"uniform\"\naggregator = \"fedavg\"",
        "selector = \"optimal-partial\"\naggregator = \"inverse-probability\"",
    );
    assert!(selector.contains("never reveals"), "{selector}");
    let norm = refused("max_update_norm = 5.0");
    assert!(norm.contains("federation.max_update_norm"), "{norm}");
    let async_mode = with(
        "deadline_ms = 60000",
        "deadline_ms = 60000\nmode = \"async\"\nconcurrency = 4\nbuffer = 4",
    );
    assert!(async_mode.contains("federation.mode"), "{async_mode}");
    let threshold = with("threshold = 0.6", "threshold = 0.5");
    assert!(
        threshold.contains("secure_aggregation.threshold"),
        "{threshold}"
    );
    let degree = with("degree = 6", "degree = 5");
    assert!(degree.contains("secure_aggregation.degree"), "{degree}");
}
