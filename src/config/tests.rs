use super::*;

/// Every shipped config, the straggler and simulated-time ones included.
fn shipped() -> Vec<(std::path::PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut files = Vec::new();
    for dir in [
        root.clone(),
        root.join("stragglers"),
        root.join("simulated"),
    ] {
        for entry in std::fs::read_dir(&dir).expect("config folder") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "toml") {
                let text = std::fs::read_to_string(&path).expect("readable");
                files.push((path, text));
            }
        }
    }
    assert!(files.len() >= 20, "{files:?}");
    files
}

/// The typed schedule reads the flat TOML of every shipped config and writes it back the same
/// way: `mode` with its own fields beside it, parsed again to the same config.
#[test]
fn every_shipped_config_round_trips_through_the_typed_schedule() {
    for (path, text) in shipped() {
        let config: Config = toml::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        let written = toml::to_string(&config).expect("serialises");
        let again: Config = toml::from_str(&written).unwrap_or_else(|e| panic!("{written}: {e}"));
        assert_eq!(again, config, "{path:?}");
        let json = serde_json::to_value(&config.federation).expect("json");
        assert!(
            json.get("mode").is_some() && json.get("over_commit").is_some(),
            "{json}"
        );
    }
}

#[test]
fn an_async_schedule_carries_its_own_fields() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("config/stragglers/digits-cnn-async.toml"),
    )
    .expect("shipped");
    let config: Config = toml::from_str(&text).expect("parses");
    assert!(matches!(
        config.federation.schedule,
        Schedule::Async {
            concurrency: 1..,
            buffer: 1..,
            ..
        }
    ));
    assert_eq!(config.federation.schedule.step(), "version");
    let sync = text.replace("mode = \"async\"", "mode = \"sync\"");
    let err = Config::parse(&sync, Path::new("sync.toml")).expect_err("async fields in sync");
    let err = format!("{err:#}");
    assert!(
        err.contains("sync.toml") && err.contains("federation.concurrency"),
        "{err}"
    );
}

/// `all` expands to the architecture's shardable weights without building it, and a layer the
/// model cannot shard is named.
#[test]
fn sharded_layers_are_checked_against_the_described_architecture() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/digits-cnn.toml");
    let text = std::fs::read_to_string(&path).expect("shipped");
    let config = Config::parse(&text, &path).expect("valid");
    let Some(net) = config.model.architecture() else {
        panic!("a network")
    };
    let layers = config.model.resolved_sharded_layers();
    assert!(
        layers.iter().all(|l| net.shardable_layers().contains(l)),
        "{layers:?}"
    );
    let mut bad = config.clone();
    if let ModelSection::Neural { sharded_layers, .. } = &mut bad.model {
        *sharded_layers = vec!["conv0.weight".into()];
    }
    let err = format!("{:#}", bad.validate().expect_err("first layer"));
    assert!(
        err.contains("model.sharded_layers") && err.contains("conv0.weight"),
        "{err}"
    );
}

/// The shipped config `name` with `from` replaced by `to`, parsed: the error's text.
fn refusal(name: &str, from: &str, to: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("shipped");
    assert!(text.contains(from), "{from}");
    let err = Config::parse(&text.replace(from, to), &path).expect_err("refused");
    format!("{err:#}")
}

/// Values no run means, each refused naming the field and its range: a run folder outside
/// `runs/`, a budget above the clients (silently cut before), a federation of one, local
/// training that would run for ever.
#[test]
fn absurd_values_are_refused_naming_the_field_and_its_range() {
    let linear = "digits-linear.toml";
    for name in [
        "../../../escape",
        "/etc",
        "..",
        ".hidden",
        "a/b",
        "",
        "tab\there",
    ] {
        let e = refusal(
            linear,
            "name = \"digits-linear\"",
            &format!("name = {name:?}"),
        );
        assert!(
            e.contains("field `run.name`") && e.contains("folder name"),
            "{e}"
        );
    }
    let e = refusal(
        linear,
        "clients_per_round = 10",
        "clients_per_round = 100000",
    );
    assert!(
        e.contains("field `federation.clients_per_round`") && e.contains("at most the 20"),
        "{e}"
    );
    let e = refusal(linear, "clients = 20", "clients = 1");
    assert!(
        e.contains("field `data.clients`") && e.contains("at least 2"),
        "{e}"
    );
    let e = refusal(linear, "epochs = 2", "epochs = 100000000");
    assert!(
        e.contains("field `training.epochs`") && e.contains("1..=1000"),
        "{e}"
    );
}

/// A value of the wrong sign in the tagged `[data]` table names its key, not the value.
#[test]
fn a_bad_value_in_the_data_table_names_its_field() {
    let e = refusal("digits-linear.toml", "clients = 20", "clients = -5");
    assert!(
        e.contains("field `data.clients`") && !e.contains("data.-5"),
        "{e}"
    );
    let e = refusal("digits-linear.toml", "alpha = 0.5", "alpha = \"half\"");
    assert!(e.contains("field `data.alpha`"), "{e}");
    let e = refusal(
        "digits-linear.toml",
        "clients = 20",
        "clients = 20\nfine_alpha = 1",
    );
    assert!(e.contains("field `data.fine_alpha`"), "{e}");
}

/// The secure-aggregation settings' ranges are secagg's and the runtime's rules, and the
/// config names the field: a scale at which the model never moves, a degree of a million.
#[test]
fn absurd_secure_aggregation_settings_are_refused_naming_the_field() {
    let secagg = "digits-cnn-secagg.toml";
    let e = refusal(secagg, "threshold = 0.6", "threshold = 0.6\nscale = 1e-30");
    assert!(
        e.contains("field `secure_aggregation.scale`") && e.contains("at least 1024"),
        "{e}"
    );
    let e = refusal(
        secagg,
        "threshold = 0.6",
        "threshold = 0.6\ndegree = 1000000",
    );
    assert!(
        e.contains("field `secure_aggregation.degree`") && e.contains("2..=1024"),
        "{e}"
    );
    let e = refusal(secagg, "threshold = 0.6", "threshold = 0.5");
    assert!(
        e.contains("field `secure_aggregation.threshold`") && e.contains("(0.5, 1]"),
        "{e}"
    );
    let e = refusal(secagg, "threshold = 0.6", "threshold = 0.6\nscale = 1e300");
    assert!(
        e.contains("`secure_aggregation.scale`") && e.contains("2⁵²"),
        "{e}"
    );
    // Refused by the engine's rules, which used to ignore them while the config refused them.
    let e = refusal(
        secagg,
        "deadline_ms = 60000",
        "deadline_ms = 60000\nover_commit = 1.5",
    );
    assert!(
        e.contains("field `federation.over_commit`") && e.contains("unmasked"),
        "{e}"
    );
}

/// A config path that is a directory or a device says so, and is not read.
#[test]
fn a_config_path_that_is_no_regular_file_is_named_for_what_it_is() {
    let dir = tempfile::tempdir().expect("temp dir");
    let e = format!("{:#}", Config::load(dir.path()).expect_err("a directory"));
    assert!(e.contains("a folder, not a regular file"), "{e}");
    let e = format!(
        "{:#}",
        Config::load(Path::new("/dev/zero")).expect_err("a device")
    );
    assert!(e.contains("/dev/zero: a device, not a regular file"), "{e}");
    let big = dir.path().join("big.toml");
    std::fs::write(&big, vec![b'#'; 2 << 20]).expect("written");
    let e = format!("{:#}", Config::load(&big).expect_err("too big"));
    assert!(e.contains("expected a TOML config of at most"), "{e}");
}
