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
