//! End-to-end federations in one process: learning, determinism, faults and malformed updates.

use fedshard::config::Config;
use fedshard::federation;
use fedshard_actors::record::Summary;
use fedshard_protocol::model::ModelState;
use fedshard_protocol::payload::RejectionKind;
use std::path::Path;

const DIGITS: &str = r#"
[run]
name = "test-digits"
seed = 7
rounds = 15

[data]
dataset = "digits"
clients = 12
alpha = 1.0
size_sigma = 0.3
min_samples = 20

[model]
kind = "softmax"
sharded_layers = ["fc0.weight"]

[training]
learning_rate = 0.1
epochs = 2

[federation]
clients_per_round = 6
strategy = "unbiased"
keep_ratios = [{ ratio = 1.0, share = 0.5 }, { ratio = 0.4, share = 0.5 }]
deadline_ms = 20000
"#;

fn config(text: &str) -> Config {
    Config::parse(text, Path::new("test.toml")).expect("valid test config")
}

fn run(config: &Config) -> (ModelState, Summary) {
    federation::run_to_end(config).expect("run completes")
}

#[test]
fn a_sharded_digits_federation_learns() {
    let (_, summary) = run(&config(DIGITS));
    assert_eq!(summary.rounds_completed, 15);
    // Chance is 0.1 on ten balanced classes.
    assert!(
        summary.final_accuracy > 0.6,
        "final accuracy {}",
        summary.final_accuracy
    );
    let first = summary.per_round[0].accuracy;
    assert!(
        summary.final_accuracy > first,
        "accuracy fell: {first} -> {}",
        summary.final_accuracy
    );
    assert!(
        summary
            .per_round
            .iter()
            .all(|r| r.model_updated && r.uplink_bits > 0)
    );
    // Half the clients hold 40% of the weight: the round reports a positive ANME.
    assert!(summary.per_round.iter().any(|r| r.anme > 0.0));
    // Every round moved the model, so every round has the cosine between the applied update and
    // the clients' mean update.
    for r in &summary.per_round {
        let cosine = r.update_cosine.expect("an updated round has a cosine");
        assert!(
            (-1.0..=1.0).contains(&cosine),
            "round {}: {cosine}",
            r.round
        );
    }
}

#[test]
fn same_config_and_seed_give_the_same_model_bytes() {
    let mut c = config(DIGITS);
    c.run.rounds = 3;
    let (a, _) = run(&c);
    let (b, _) = run(&c);
    assert_eq!(a.to_bytes(), b.to_bytes());
    c.run.seed += 1;
    let (other, _) = run(&c);
    assert_ne!(a.to_bytes(), other.to_bytes());
}

#[test]
fn cohorts_on_and_off_give_the_same_model_bytes() {
    // The main job's CNN: a round's ten clients hold different sample counts and two sub-model
    // shapes (keep ratios 1 and 0.5), so each process trains two kinds of cohort.
    let mut c = Config::load(Path::new("config/digits-cnn.toml")).expect("the shipped config");
    c.run.rounds = 3;
    c.training.cohorts = false;
    let (alone, _) = run(&c);
    c.training.cohorts = true;
    let (together, summary) = run(&c);
    assert_eq!(summary.rounds_completed, 3);
    assert_eq!(alone.to_bytes(), together.to_bytes());
}

#[test]
fn the_partition_names_the_rows_each_client_trains_on() {
    let c = Config::load(Path::new("config/digits-cnn-dense.toml")).expect("the shipped config");
    let p = federation::partition(&c).expect("digits are a labelled table");
    assert_eq!(p.seed, c.run.seed);
    let test = p
        .test
        .as_ref()
        .expect("the digits' test set is drawn from them");
    // 20% of each class of the 1 797 digits.
    assert_eq!(test.len(), 359);
    let ids: Vec<u64> = (0..p.clients.len() as u64).collect();
    let trainers = federation::clients(&c, &ids).expect("the clients");
    let mut seen = std::collections::BTreeSet::new();
    for (id, rows) in p.clients.iter().enumerate() {
        assert_eq!(
            rows.len() as u64,
            trainers[&(id as u64)].samples(),
            "client {id}"
        );
        for &row in rows {
            assert!(row < 1797 && !test.contains(&row), "client {id}: row {row}");
            assert!(seen.insert(row), "row {row} twice");
        }
    }
    let mut other = c.clone();
    other.run.seed += 1;
    assert_ne!(
        federation::partition(&other).expect("another seed").clients,
        p.clients
    );
}

fn with_faults(kinds: &str, rate: f64) -> Config {
    let text = format!("{DIGITS}\n[faults]\nrate = {rate}\nkinds = [{kinds}]\ndelay_ms = 1500\n")
        .replace("deadline_ms = 20000", "deadline_ms = 700")
        .replace("rounds = 15", "rounds = 8");
    config(&text)
}

#[test]
fn thirty_percent_failing_clients_are_counted_and_the_run_completes() {
    let (_, summary) = run(&with_faults(r#""error", "panic", "timeout""#, 0.3));
    assert_eq!(summary.rounds_completed, 8);
    let failures: usize = summary.per_round.iter().map(|r| r.failures_total()).sum();
    let participants: usize = summary.per_round.iter().map(|r| r.participants).sum();
    assert!(
        failures > 0 && failures < participants,
        "{failures} of {participants}"
    );
    for r in &summary.per_round {
        assert_eq!(
            r.successes + r.failures_total(),
            r.participants,
            "round {}",
            r.round
        );
    }
    let kinds: std::collections::BTreeSet<&str> = summary
        .per_round
        .iter()
        .flat_map(|r| r.failures.keys().map(|k| k.label()))
        .collect();
    assert!(
        kinds.contains("panic") || kinds.contains("error") || kinds.contains("timeout"),
        "{kinds:?}"
    );
    assert!(
        summary.final_accuracy > 0.3,
        "still learns: {}",
        summary.final_accuracy
    );
}

/// When every client fails, no round may touch the model: it stays bit for bit the initial one.
#[test]
fn failed_clients_never_update_the_model() {
    let c = with_faults(r#""error", "panic", "timeout""#, 1.0);
    let initial = fedshard::federation::initial_model(&c, c.run.seed);
    let (model, summary) = run(&c);
    assert_eq!(model.to_bytes(), initial.to_bytes());
    assert!(
        summary
            .per_round
            .iter()
            .all(|r| !r.model_updated && r.successes == 0)
    );
}

#[test]
fn malformed_updates_are_rejected_by_reason_and_never_applied() {
    for (kind, label) in [
        ("non-finite", "non_finite"),
        ("wrong-shape", "shape"),
        ("foreign-indices", "indices"),
    ] {
        let c = with_faults(&format!("\"{kind}\""), 1.0);
        let initial = fedshard::federation::initial_model(&c, c.run.seed);
        let (model, summary) = run(&c);
        assert_eq!(model.to_bytes(), initial.to_bytes(), "{kind}");
        for r in &summary.per_round {
            assert_eq!(
                r.rejected
                    .iter()
                    .find(|(k, _)| k.label() == label)
                    .map(|(_, n)| *n),
                Some(r.participants),
                "{kind}: {:?}",
                r.rejected
            );
        }
    }
}

#[test]
fn an_aggregate_that_overflows_never_replaces_the_model() {
    let c = with_faults(r#""overflow""#, 1.0);
    let initial = fedshard::federation::initial_model(&c, c.run.seed);
    let (model, summary) = run(&c);
    assert_eq!(model.to_bytes(), initial.to_bytes());
    for r in &summary.per_round {
        assert!(!r.model_updated, "round {}", r.round);
        assert_eq!(
            r.successes, r.participants,
            "the updates themselves pass the checks"
        );
        assert_eq!(
            r.rejected.get(&RejectionKind::NonFiniteAggregate).copied(),
            Some(1),
            "{:?}",
            r.rejected
        );
    }
}

/// The same exploding clients as above, under `max_update_norm`: each update is rejected on its
/// own, by the norm the server computes, before any aggregate is formed.
#[test]
fn updates_over_the_norm_bound_are_rejected_and_never_applied() {
    let mut c = with_faults(r#""overflow""#, 1.0);
    c.federation.max_update_norm = Some(1000.0);
    c.run.rounds = 2;
    let initial = fedshard::federation::initial_model(&c, c.run.seed);
    let (model, summary) = run(&c);
    assert_eq!(model.to_bytes(), initial.to_bytes());
    for r in &summary.per_round {
        assert!(!r.model_updated && r.successes == 0, "round {}", r.round);
        assert_eq!(
            r.rejected,
            std::collections::BTreeMap::from([(RejectionKind::NormBound, r.participants)]),
        );
        assert_eq!(r.update_cosine, None);
    }
}

#[test]
fn invalid_configs_name_the_field() {
    let cases = [
        (
            DIGITS.replace("clients_per_round = 6", "clients_per_round = -1"),
            "federation.clients_per_round",
        ),
        (
            DIGITS.replace("ratio = 0.4, share = 0.5", "ratio = 0.4, share = 0.7"),
            "federation.keep_ratios",
        ),
        (
            DIGITS.replace("epochs = 2", "epochs = 2\nepocs = 3"),
            "epocs",
        ),
        (
            DIGITS.replace("strategy = \"unbiased\"", "strategy = \"unbaised\""),
            "unbaised",
        ),
        (DIGITS.replace("alpha = 1.0", "alpha = 0.0"), "data.alpha"),
        (
            DIGITS.replace(
                "deadline_ms = 20000",
                "deadline_ms = 20000\nmax_update_norm = 0.0",
            ),
            "federation.max_update_norm",
        ),
        (
            DIGITS.replace(
                "deadline_ms = 20000",
                "deadline_ms = 20000\nmax_update_norm = -2.5",
            ),
            "federation.max_update_norm",
        ),
    ];
    for (text, field) in cases {
        let err = format!(
            "{:#}",
            Config::parse(&text, Path::new("bad.toml")).unwrap_err()
        );
        assert!(
            err.contains("bad.toml") && err.contains(field),
            "{field}: {err}"
        );
    }
}

#[test]
fn the_shipped_configs_are_valid() {
    let mut checked = 0;
    // `config/` and its folders (`config/stragglers/`).
    let mut paths = Vec::new();
    for entry in std::fs::read_dir("config").expect("config/") {
        let path = entry.expect("a config entry").path();
        if path.is_dir() {
            let folder = std::fs::read_dir(&path).expect("a config folder");
            paths.extend(folder.map(|e| e.expect("a config entry").path()));
        } else {
            paths.push(path);
        }
    }
    for path in paths {
        if path.extension().is_some_and(|e| e == "toml") {
            match Config::load(&path) {
                Ok(config) => {
                    // A shipped config is one we would run ourselves.
                    let warnings = config.warnings();
                    assert!(warnings.is_empty(), "{}: {warnings:?}", path.display());
                    checked += 1;
                }
                // CIFAR configs read the user's own download from `data.path`.
                Err(e)
                    if path
                        .file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("cifar"))
                        && format!("{e:#}").contains("field `data.path`") => {}
                Err(e) => panic!("{}: {e:#}", path.display()),
            }
        }
    }
    assert!(checked >= 20, "only {checked} configs in config/");
}

#[test]
fn one_shot_ridge_fesc_beats_fedavg() {
    let text = std::fs::read_to_string("config/oneshot-ridge.toml")
        .unwrap()
        .replace("clients = 500", "clients = 120")
        .replace("clients_per_round = 500", "clients_per_round = 120");
    let fesc = config(&text);
    let (_, s_fesc) = run(&fesc);
    let fedavg = config(&text.replace("aggregator = \"fesc\"", "aggregator = \"fedavg\""));
    let (_, s_fedavg) = run(&fedavg);
    // `accuracy` is R² for regression; the noise alone caps it near 1 − 1/Var(y) ≈ 0.94.
    assert!(
        s_fesc.final_accuracy > 0.8,
        "FESC R² {}",
        s_fesc.final_accuracy
    );
    assert!(
        s_fesc.final_loss < s_fedavg.final_loss,
        "FESC MSE {} vs fedavg {}",
        s_fesc.final_loss,
        s_fedavg.final_loss
    );
}

/// Optimal-partial selection runs the two-phase round of the sampling paper: every live client trains and
/// reports its update norm, the server samples who uploads with the variance-optimal p_k and
/// aggregates with n_k/p_k weights. The expected number of uploads is the budget m.
#[test]
fn optimal_partial_selection_runs_a_two_phase_round_and_learns() {
    let c = config(
        &DIGITS
            .replace("clients_per_round = 6", "clients_per_round = 4\nselector = \"optimal-partial\"\naggregator = \"inverse-probability\""),
    );
    let (_, summary) = run(&c);
    assert_eq!(summary.rounds_completed, 15);
    let uploads: usize = summary.per_round.iter().map(|r| r.successes).sum();
    let mean = uploads as f64 / 15.0;
    // Σ r_k p_k = 4 with r ∈ {0.4, 1}: between 4 and 10 uploads per round in expectation.
    assert!(
        (2.0..=12.0).contains(&mean),
        "mean uploads per round {mean}"
    );
    assert!(
        summary.per_round.iter().all(|r| r.participants == 12),
        "phase one asks every client"
    );
    assert!(
        summary.final_accuracy > 0.5,
        "final accuracy {}",
        summary.final_accuracy
    );
}

/// A short run of the digits federation, for comparing ways of building it.
fn short_digits() -> Config {
    config(&DIGITS.replace("rounds = 15", "rounds = 3"))
}

#[test]
fn a_client_built_alone_has_the_samples_the_server_registers() {
    let c = short_digits();
    let server = federation::server(&c).expect("server side builds");
    let clients = federation::clients(&c, &[1]).expect("client 1 builds");
    assert_eq!(clients.keys().copied().collect::<Vec<_>>(), [1]);
    assert_eq!(clients[&1].samples(), server.registry.clients[&1].samples);
    // D_c comes from the partition: every registered client holds data.
    assert_eq!(server.registry.clients.len(), 12);
    assert!(server.registry.clients.values().all(|r| r.samples >= 20));
}

#[test]
fn server_and_clients_built_apart_run_the_same_federation_bit_for_bit() {
    let c = short_digits();
    let (expected, _) = run(&c);
    let server = federation::server(&c).expect("server side builds");
    // Two "nodes" each build their own half of the clients from the config alone.
    let mut trainers = federation::clients(&c, &[0, 2, 4, 6, 8, 10]).unwrap();
    trainers.extend(federation::clients(&c, &[1, 3, 5, 7, 9, 11]).unwrap());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (model, _) = runtime
        .block_on(fedshard_actors::server::run(server, trainers))
        .expect("run completes");
    assert_eq!(model.to_bytes(), expected.to_bytes());
}

#[test]
fn a_client_id_outside_the_federation_is_an_error_naming_data_clients() {
    let c = short_digits();
    let err = federation::clients(&c, &[3, 12])
        .err()
        .expect("client 12 of 12 does not exist");
    let text = format!("{err:#}");
    assert!(text.contains("data.clients"), "{text}");
    assert!(text.contains("12"), "{text}");
}

#[test]
fn a_field_of_another_dataset_is_an_error_naming_it() {
    // `dim` belongs to synthetic-linear; digits takes only its own fields.
    let text = DIGITS.replace("min_samples = 20", "min_samples = 20\ndim = 8");
    let err = format!(
        "{:#}",
        Config::parse(&text, Path::new("bad.toml")).unwrap_err()
    );
    assert!(
        err.contains("bad.toml") && err.contains("data.dim") && err.contains("unknown field"),
        "{err}"
    );
    let err = format!(
        "{:#}",
        Config::parse(
            &DIGITS.replace("dataset = \"digits\"", "dataset = \"mnist\""),
            Path::new("bad.toml")
        )
        .unwrap_err()
    );
    // MNIST parses (without `path` it reads the cached npm digits), but the softmax model is
    // the 8×8 digits' alone.
    assert!(
        err.contains("data.dataset") && err.contains("softmax") && err.contains("mnist"),
        "{err}"
    );
}

#[test]
fn each_model_kind_takes_only_its_own_fields() {
    let parse = |text: &str| {
        format!(
            "{:#}",
            Config::parse(text, Path::new("bad.toml")).unwrap_err()
        )
    };
    // A network belongs to `kind = "neural"` alone.
    let err = parse(&DIGITS.replace(
        "sharded_layers = [\"fc0.weight\"]",
        "sharded_layers = [\"fc0.weight\"]\n\n[model.network]\narchitecture = \"digits-cnn\"\nclasses = 10",
    ));
    assert!(
        err.contains("bad.toml")
            && err.contains("[model]")
            && err.contains("unknown field `network`"),
        "{err}"
    );
    // And a neural model cannot go without one.
    let err = parse(&DIGITS.replace("kind = \"softmax\"", "kind = \"neural\""));
    assert!(
        err.contains("[model]") && err.contains("missing field `network`"),
        "{err}"
    );
}

#[test]
fn the_training_table_is_the_recipe_the_clients_get() {
    let parse = |text: &str| Config::parse(text, Path::new("bad.toml"));
    // Unbiased clips: an unset τ becomes the documented default, a set one travels as set.
    let fed = federation::server(&config(DIGITS)).expect("server");
    assert_eq!(
        fed.config.recipe.clip_lr,
        Some(fedshard_protocol::task::DEFAULT_CLIP_LR)
    );
    let with_tau = DIGITS.replace("epochs = 2", "epochs = 2\nclip_lr = 4.0");
    let fed = federation::server(&config(&with_tau)).expect("server");
    assert_eq!(fed.config.recipe.clip_lr, Some(4.0));
    assert_eq!(fed.config.recipe.epochs, 2);
    // A τ under a strategy that never clips is a mistake, not something to ignore.
    let err = format!(
        "{:#}",
        parse(&with_tau.replace("strategy = \"unbiased\"", "strategy = \"prism\"")).unwrap_err()
    );
    assert!(
        err.contains("bad.toml") && err.contains("training.clip_lr") && err.contains("prism"),
        "{err}"
    );
    // The old name is refused by name.
    let err = format!(
        "{:#}",
        parse(&DIGITS.replace("epochs = 2", "epochs = 2\nclip_tau = 4.0")).unwrap_err()
    );
    assert!(err.contains("clip_tau"), "{err}");
}
