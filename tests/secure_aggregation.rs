//! Secure aggregation end to end (docs/secagg.md): a secure round folds what a plain round
//! folds, up to the fixed-point rounding, with sharded layers summed over the union of their
//! factor columns; its record tells the session; what a sum cannot serve is refused with its
//! reason.

mod common;

use fedshard::config::{Config, KeepRatioShare};
use fedshard_protocol::model::ModelState;
use std::path::Path;

const SHIPPED: &str = "config/digits-cnn-secagg.toml";

/// The shipped secure config (or, without its section, the plain main job) for `rounds` rounds,
/// with `extra` tables.
fn config_with(secure: bool, rounds: u64, extra: &str) -> Config {
    let mut text = std::fs::read_to_string(SHIPPED)
        .unwrap()
        .replace("rounds = 40", &format!("rounds = {rounds}"));
    if !secure {
        let section = text.find("[secure_aggregation]").unwrap();
        text.truncate(section);
    }
    text.push_str(extra);
    Config::parse(&text, Path::new("digits-cnn-secagg.toml")).expect("the config is valid")
}

fn config(secure: bool, rounds: u64) -> Config {
    config_with(secure, rounds, "")
}

/// The largest difference between two models' values.
fn largest_difference(a: &ModelState, b: &ModelState) -> f32 {
    let mut largest = 0f32;
    for (a, b) in a.tensors.iter().zip(&b.tensors) {
        assert_eq!(a.name, b.name);
        for (x, y) in a.data.iter().zip(&b.data) {
            largest = largest.max((x - y).abs());
        }
    }
    largest
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
    let largest = largest_difference(&plain, &secure);
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
        // t = ⌈0.6 × 10⌉ over the complete graph of ten clients.
        assert_eq!(session.threshold, 6);
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

/// Width slicing (FedRolex at r = 0.25 and 0.5, docs/algorithms.md §8.3): the secure sum runs
/// over the union of the round's kept units (the r = 0.5 window, half of every width), each
/// value over the survivors whose slice kept it, so the leading quarter is averaged over every
/// client and the next over the r = 0.5 clients alone. After one round the model is the plain
/// width fold's to within the fixed-point steps, the units outside the union untouched in both;
/// an input carries only the union, half the model's hidden units.
#[test]
fn a_secure_width_round_folds_what_the_plain_width_round_folds() {
    let width = |secure| {
        let mut config = config(secure, 1);
        config.federation.strategy = "fedrolex".parse().unwrap();
        config.federation.keep_ratios = vec![
            KeepRatioShare {
                ratio: 0.25,
                share: 0.4,
            },
            KeepRatioShare {
                ratio: 0.5,
                share: 0.6,
            },
        ];
        config
            .validate()
            .expect("secure aggregation of width slices is accepted");
        config
    };
    let (plain_dir, secure_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_, plain, plain_summary) = common::run_in(plain_dir.path(), &width(false));
    let (_, secure, summary) = common::run_in(secure_dir.path(), &width(true));
    let (p, s) = (&plain_summary.per_round[0], &summary.per_round[0]);
    assert!(p.model_updated && s.model_updated, "{s:?}");
    let session = s.secure.expect("a finished session");
    assert_eq!(session.survivors, p.successes);
    let largest = largest_difference(&plain, &secure);
    assert!(largest < 1e-4, "largest difference {largest}");
    assert!(largest > 0.0, "the fixed point rounds");
    // The union is half of every width, so an input is about a third of the model (a
    // convolution's weights fall to a quarter, the inputs and classes stay whole): a client's
    // messages carry that many of the session's values, and a little for the key exchange.
    let values = s.bits_per_parameter / f64::from(session.bits);
    eprintln!("{values} values per parameter in a client's messages, largest difference {largest}");
    assert!(
        values > 0.2 && values < 0.6,
        "{values} values per parameter"
    );
}

/// Clients that leave a secure session after sharing their keys (fault injection's `dropout`,
/// drawn from the seed: three of the ten here): the server rebuilds their pair masks from the
/// others' shares and removes them, so the sum is the survivors' alone, and the model is the
/// plain run's in which the same clients fail before uploading. SecAgg's complete graph
/// (t = 6 of 10) survives three dropouts; a SecAgg+ graph of degree 6 does not when two of
/// them neighbour a third (see the next test).
#[test]
fn clients_that_leave_mid_session_are_unmasked_out_of_the_sum() {
    let faults = "\n[faults]\nrate = 0.3\nkinds = [\"dropout\"]\n";
    let (plain_dir, secure_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_, plain, plain_summary) =
        common::run_in(plain_dir.path(), &config_with(false, 1, faults));
    let (_, secure, summary) = common::run_in(secure_dir.path(), &config_with(true, 1, faults));
    let (p, s) = (&plain_summary.per_round[0], &summary.per_round[0]);
    let session = s.secure.expect("a finished session");
    assert!(session.dropped > 0, "{session:?}");
    assert_eq!(session.dropped, p.failures_total(), "the same clients left");
    assert_eq!(session.survivors, p.successes);
    assert!(session.survivors >= session.threshold);
    assert_eq!(s.failures_total(), session.dropped);
    let largest = largest_difference(&plain, &secure);
    assert!(largest < 1e-4, "largest difference {largest}");
}

/// Too many dropouts around one client for SecAgg+'s sparse graph (degree 6, t = 5): its
/// neighbours see fewer than t live clients and stop, the server cannot rebuild a dropped
/// client's masks, and the round leaves the model unchanged (never a sum with masks left in
/// it), counting who failed.
#[test]
fn a_session_that_cannot_finish_leaves_the_model_unchanged() {
    let faults = "\n[faults]\nrate = 0.3\nkinds = [\"dropout\"]\n";
    let dir = tempfile::tempdir().unwrap();
    let initial = fedshard::federation::in_process(&config(true, 1))
        .expect("federation")
        .0
        .model;
    let mut config = config_with(true, 1, faults);
    if let Some(s) = config.secure_aggregation.as_mut() {
        s.degree = Some(6);
    }
    let (_, model, summary) = common::run_in(dir.path(), &config);
    let r = &summary.per_round[0];
    assert!(!r.model_updated && r.secure.is_none(), "{r:?}");
    assert_eq!(model, initial);
    assert!(
        r.failures_total() > 3,
        "the dropouts and the clients that stopped: {r:?}"
    );
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
    // With [privacy] the clip is DP's, and DP's weight-space clip cannot cover factor columns.
    let private = |secure: &str| {
        let text = base
            .replace("aggregator = \"fedavg\"", "aggregator = \"uniform\"")
            .replace(
                "[secure_aggregation]\nclip_norm = 10.0\n",
                &format!(
                    "[privacy]\nnoise_multiplier = 1.0\nclip_norm = 0.5\ndelta = 1e-4\n\n\
                     [secure_aggregation]\n{secure}"
                ),
            );
        let error = Config::parse(&text, Path::new("secure.toml")).expect_err("refused");
        format!("{error:#}")
    };
    let two_clips = private("clip_norm = 10.0\n");
    assert!(
        two_clips.contains("secure_aggregation.clip_norm"),
        "{two_clips}"
    );
    let sharded = private("");
    assert!(sharded.contains("model.sharded_layers"), "{sharded}");
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
    let degree = with("threshold = 0.6", "threshold = 0.6\ndegree = 5");
    assert!(degree.contains("secure_aggregation.degree"), "{degree}");
}

/// DP-FedAvg with secure aggregation: the clients clip their own changes to DP's clip norm,
/// the session sums them and counts the unclipped ones, and the server adds the same seeded
/// noise to the decoded sum. One round of the shipped DP config, reduced, releases what the
/// private round in the clear releases: the same ε, the same clip and count, and the model to
/// within the fixed-point step over the expected number of updates.
#[test]
fn a_private_secure_round_releases_what_a_private_round_releases() {
    let text = std::fs::read_to_string("config/digits-cnn-dp.toml")
        .unwrap()
        .replace("clients = 1000", "clients = 200")
        .replace("clients_per_round = 200", "clients_per_round = 60")
        .replace("rounds = 40", "rounds = 1");
    let plain = Config::parse(&text, Path::new("dp.toml")).expect("the DP config");
    let secure = Config::parse(
        &format!("{text}\n[secure_aggregation]\n"),
        Path::new("dp.toml"),
    )
    .expect("DP with secure aggregation");
    let (plain_dir, secure_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_, plain_model, plain_summary) = common::run_in(plain_dir.path(), &plain);
    let (_, secure_model, summary) = common::run_in(secure_dir.path(), &secure);
    let (p, s) = (&plain_summary.per_round[0], &summary.per_round[0]);
    assert!(s.model_updated && s.secure.is_some(), "{s:?}");
    let (dp, sp) = (p.privacy.unwrap(), s.privacy.unwrap());
    assert_eq!(sp.epsilon, dp.epsilon);
    assert_eq!(
        sp.clipped, dp.clipped,
        "the secure count of unclipped changes"
    );
    assert_eq!(sp.next_clip_norm, dp.next_clip_norm);
    let largest = largest_difference(&plain_model, &secure_model);
    assert!(largest < 1e-4, "largest difference {largest}");
}

/// Under simulated time a secure round costs what its session sends: every client downloads
/// its task and the server's four messages, and uploads its readiness and its four messages,
/// each one-way latency plus its bits over the client's links; the exchanges follow one
/// another, so the round ends after the last client's unmasking shares. (With 1 Mbit/s uplinks
/// the secure round still ends first here: a masked input of 24-bit values is shorter than a
/// full-model client's 32-bit update.)
#[test]
fn a_secure_round_under_simulated_time_pays_for_its_messages() {
    let network = "\n[network]\nuplink_mbit = 1.0\ndownlink_mbit = 10.0\nlatency_ms = 20\n";
    let simulated = |secure: bool| {
        let mut text = std::fs::read_to_string(SHIPPED)
            .unwrap()
            .replace("rounds = 40", "rounds = 1\nclock = \"virtual\"");
        if !secure {
            text.truncate(text.find("[secure_aggregation]").unwrap());
        }
        text.push_str(network);
        Config::parse(&text, Path::new("simulated.toml")).expect("the config is valid")
    };
    let (plain_dir, secure_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_, _, plain) = common::run_in(plain_dir.path(), &simulated(false));
    let (_, _, secure) = common::run_in(secure_dir.path(), &simulated(true));
    let p = plain.per_round[0].time.clone().expect("simulated time");
    let s = secure.per_round[0].time.clone().expect("simulated time");
    assert_eq!(p.clients.len(), s.clients.len());
    for (client, t) in &s.clients {
        let alone = &p.clients[client];
        // Four more downloads of 20 ms latency each, at least; five uploads.
        assert!(
            t.download >= alone.download + 0.08 - 1e-9,
            "{client}: {t:?} vs {alone:?}"
        );
        assert!(t.upload >= 0.1 - 1e-9, "{client}: {t:?}");
        assert_eq!(t.compute, alone.compute);
    }
    // The round ends when the slowest client's time is spent, the exchanges one after another.
    let slowest = s.clients.values().map(|t| t.total()).fold(0.0, f64::max);
    assert!(s.end - s.start >= slowest - 1e-9, "{s:?}");
}
