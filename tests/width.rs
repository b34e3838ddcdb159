//! Width slicing end to end (docs/algorithms.md §8): HeteroFL, FedRolex and FjORD train the shipped
//! digits CNN and an MLP with a hidden layer in a whole federation, with the clients at the
//! mixed keep ratios (60% r = 0.5, 40% r = 1), and learn: the final test accuracy is far above
//! chance (10%). A refused combination names its field. The CIFAR models' widths are described
//! by `fedshard widths` here; their learning is checked on a synthetic task in
//! `training/src/train/width_cifar_tests.rs` (CIFAR is not available offline).

use fedshard::config::{Config, KeepRatioShare, ModelSection};
use fedshard::federation;
use fedshard_actors::clock::ClockKind;
use fedshard_strategies::sharding::strategy::Strategy;
use fedshard_training::models::net::Architecture;
use std::path::Path;

/// `config/digits-cnn.toml` for `rounds` rounds under `strategy`, 60% of the clients at r = 0.5.
fn config(strategy: &str, rounds: u64) -> Config {
    let mut config = Config::load(Path::new("config/digits-cnn.toml")).expect("config loads");
    config.run.rounds = rounds;
    config.federation.strategy = strategy.parse::<Strategy>().expect("a strategy");
    config.federation.keep_ratios = vec![
        KeepRatioShare {
            ratio: 0.5,
            share: 0.6,
        },
        KeepRatioShare {
            ratio: 1.0,
            share: 0.4,
        },
    ];
    config
}

fn final_accuracy(config: &Config) -> f64 {
    config.validate().expect("valid");
    let (fed, trainers) = federation::in_process(config).expect("federation builds");
    let (_, summary) = federation::run(fed, trainers).expect("the run completes");
    assert_eq!(summary.rounds_completed, config.run.rounds);
    summary.final_accuracy
}

#[test]
fn each_width_strategy_learns_the_digits_cnn() {
    for strategy in ["heterofl", "fedrolex", "fjord"] {
        let accuracy = final_accuracy(&config(strategy, 8));
        eprintln!("digits CNN, {strategy}: {accuracy}");
        // FjORD trains a narrower prefix than the client's slice in most batches, so after 8
        // rounds it is behind the others (0.45 against 0.58 and 0.64), still 4× chance.
        let floor = if strategy == "fjord" { 0.4 } else { 0.5 };
        assert!(accuracy > floor, "{strategy}: final accuracy {accuracy}");
    }
}

#[test]
fn each_width_strategy_learns_an_mlp() {
    for strategy in ["heterofl", "fedrolex", "fjord"] {
        let mut config = config(strategy, 8);
        config.model = ModelSection::Neural {
            sharded_layers: vec!["all".into()],
            network: Architecture::Mlp {
                inputs: 64,
                hidden: vec![64],
                classes: 10,
            },
        };
        let accuracy = final_accuracy(&config);
        eprintln!("digits MLP 64 → 64 → 10, {strategy}: {accuracy}");
        assert!(accuracy > 0.5, "{strategy}: final accuracy {accuracy}");
    }
}

/// `config/digits-cnn.toml` as TOML text with `edit` applied, loaded and validated.
fn edited(edit: impl Fn(String) -> String) -> anyhow::Result<Config> {
    let text = std::fs::read_to_string("config/digits-cnn.toml").expect("config");
    let dir = tempfile::TempDir::new().expect("temp dir");
    let path = dir.path().join("c.toml");
    std::fs::write(&path, edit(text)).expect("write");
    let config = Config::load(&path)?;
    config.validate()?;
    Ok(config)
}

/// FedBuff folds width-sliced updates as changes at their slices' coordinates: an async
/// FedRolex run learns.
#[test]
fn width_slicing_runs_buffered_asynchronous_aggregation() {
    let mut config = edited(|t| {
        t.replace(
            "strategy = \"unbiased\"",
            "strategy = \"fedrolex\"\nmode = \"async\"\nconcurrency = 6\nbuffer = 3",
        )
    })
    .expect("async width slicing is accepted");
    config.run.rounds = 30;
    // Simulated time: the arrivals, hence the buffers, depend on the seed alone.
    config.run.clock = ClockKind::Virtual;
    let accuracy = final_accuracy(&config);
    eprintln!("digits CNN, fedrolex, async: {accuracy}");
    assert!(accuracy > 0.4, "final accuracy {accuracy}");
}

/// SignSGD codes a sliced update's message (docs/algorithms.md §4.8, §8.3): each value a client
/// sends decodes to the value it was sent ± `server_lr`, so after one FedRolex round at r = 0.25
/// and 0.5 every value moved by at most `server_lr` (a weighted mean of ±`server_lr` over the
/// clients that kept it), and the units no client kept did not move. With KLMS the same run
/// sends a fraction of a bit per value. QSGD, whose priors sit in the whole model's layout, is
/// refused naming the field.
#[test]
fn signsgd_codes_sliced_updates_and_qsgd_is_refused_by_name() {
    const LR: f32 = 0.002;
    for compressor in ["signsgd", "signsgd-klms"] {
        let mut config = edited(|t| {
            t.replace("strategy = \"unbiased\"", "strategy = \"fedrolex\"")
                .replace(
                    "[federation]\n",
                    &format!("[federation]\ncompressor = \"{compressor}\"\n"),
                )
                + &format!("\n[compression]\nserver_lr = {LR}\n")
        })
        .expect("SignSGD of sliced updates is accepted");
        config.run.rounds = 1;
        config.federation.keep_ratios = vec![
            KeepRatioShare {
                ratio: 0.25,
                share: 0.5,
            },
            KeepRatioShare {
                ratio: 0.5,
                share: 0.5,
            },
        ];
        let (fed, trainers) = federation::in_process(&config).expect("federation builds");
        let before = fed.model.clone();
        let (after, summary) = federation::run(fed, trainers).expect("the run completes");
        let round = &summary.per_round[0];
        assert!(round.model_updated && round.successes > 0, "{compressor}");
        let (mut moved, mut still) = (0usize, 0usize);
        for (b, a) in before.tensors.iter().zip(&after.tensors) {
            for (x, y) in b.data.iter().zip(&a.data) {
                let step = (y - x).abs();
                assert!(
                    step <= LR * 1.0001,
                    "{compressor}: `{}` moved by {step}",
                    a.name
                );
                if step == 0.0 {
                    still += 1;
                } else {
                    moved += 1;
                }
            }
        }
        // Half of every width is outside the r = 0.5 window (a convolution keeps at most a
        // quarter of its weights), so most values stay: 42 933 of 57 962 here.
        assert!(
            moved > 0 && still > moved,
            "{compressor}: {moved} moved, {still} still"
        );
        let bits = round.bits_per_parameter;
        eprintln!("{compressor}: {moved} values moved, {still} still, {bits} bits per parameter");
        let ceiling = if compressor == "signsgd" { 1.1 } else { 0.5 };
        assert!(
            bits < ceiling,
            "{compressor}: {bits} uplink bits per parameter"
        );
    }
    let err = edited(|t| {
        t.replace("strategy = \"unbiased\"", "strategy = \"heterofl\"")
            .replace("[federation]\n", "[federation]\ncompressor = \"qsgd\"\n")
    })
    .map(drop)
    .unwrap_err();
    let err = format!("{err:#}");
    assert!(
        err.contains("federation.compressor") && err.contains("layout"),
        "{err}"
    );
}

/// A private secure round releases a weight-space sum, which a width round's sum over the
/// union of the kept units is not: refused before anything runs, naming the field. (Secure
/// aggregation alone is tested in tests/secure_aggregation.rs.)
#[test]
fn width_slicing_with_private_secure_aggregation_is_refused_by_name() {
    let text = std::fs::read_to_string("config/digits-cnn-dp-secagg.toml").expect("config");
    let dir = tempfile::TempDir::new().expect("temp dir");
    let path = dir.path().join("c.toml");
    let edited = text
        .replacen(
            "kind = \"neural\"\n",
            "kind = \"neural\"\nsharded_layers = [\"all\"]\n",
            1,
        )
        .replacen(
            "[federation]\n",
            "[federation]\nstrategy = \"fedrolex\"\n",
            1,
        );
    assert_ne!(edited, text);
    std::fs::write(&path, edited).expect("write");
    let err = format!("{:#}", Config::load(&path).unwrap_err());
    assert!(
        err.contains("federation.strategy") && err.contains("fedrolex"),
        "{err}"
    );
}

/// A model with no hidden width a cut can narrow (softmax regression: one layer; an ONNX
/// BatchNorm CNN whose one convolution feeds a depthwise one) is refused with a width strategy
/// when the config is validated, naming the field and the model.
#[test]
fn a_model_without_widths_is_refused_by_name() {
    for (file, kind) in [
        ("config/digits-linear.toml", "softmax"),
        ("config/onnx-digits-cnn.toml", "onnx"),
    ] {
        let text = std::fs::read_to_string(file).expect("config");
        let dir = tempfile::TempDir::new().expect("temp dir");
        let path = dir.path().join("c.toml");
        let text = text
            .replace("strategy = \"unbiased\"", "strategy = \"heterofl\"")
            .replace("digits_cnn.onnx\"", "bn_cnn.onnx\"")
            .replace(
                "sharded_layers = [\"conv1.weight\", \"conv2.weight\", \"fc0.weight\"]",
                "sharded_layers = [\"all\"]",
            );
        assert!(text.contains("heterofl"), "{file}");
        std::fs::write(&path, text).expect("write");
        let err = format!("{:#}", Config::load(&path).unwrap_err());
        assert!(
            err.contains("federation.strategy") && err.contains(&format!("{kind} model")),
            "{file}: {err}"
        );
    }
}

/// The digits CNN's ONNX export under FedRolex, its widths traced through the graph, runs
/// the shipped CNN's FedRolex federation to the bit (the export trains as the shipped model,
/// docs/onnx.md), and learns.
#[test]
fn fedrolex_trains_the_onnx_digits_cnn_as_the_shipped_cnn() {
    let shipped = config("fedrolex", 8);
    let mut onnx = Config::load(Path::new("config/onnx-digits-cnn.toml")).expect("config loads");
    onnx.run.rounds = shipped.run.rounds;
    onnx.federation.strategy = shipped.federation.strategy;
    onnx.federation.keep_ratios = shipped.federation.keep_ratios.clone();
    let (ours, theirs) = (final_accuracy(&onnx), final_accuracy(&shipped));
    eprintln!("digits CNN under FedRolex, 8 rounds: ONNX {ours}, shipped {theirs}");
    assert_eq!(ours.to_bits(), theirs.to_bits());
    assert!(ours > 0.5, "final accuracy {ours}");
}

/// `fedshard widths` describes the GPU-scale configs without their CIFAR files or a CUDA
/// build. ResNet-18 at r = 0.5: stage 0's stream (64 channels, 2 GroupNorm groups of 32) keeps
/// ⌈0.5 · 32⌉ = 16 of each group, channels 0–15 and 32–47 under HeteroFL; FedRolex in round 3
/// starts its window at unit 2 of each group (2–17, 34–49); 4 streams and 8 blocks' inner
/// widths. CCT at r = 0.5 under FjORD: 32 of the tokenizer's 64 channels, 2 of 4 heads of each
/// of the 6 blocks, 256 of 512 MLP units, levels {0.2, 0.4, 0.5}.
#[test]
fn widths_describes_resnet18_and_cct() {
    use fedshard::cli::widths::{WidthsArgs, WidthsReport, widths};
    let report = |config: &str, strategy: &str, round: u64| {
        widths(&WidthsArgs {
            config: config.into(),
            strategy: strategy.into(),
            keep_ratio: 0.5,
            round,
        })
        .unwrap_or_else(|e| panic!("{config}: {e:#}"))
    };
    let kept = |r: &WidthsReport, name: &str| -> (usize, usize, Vec<usize>) {
        let w = r.widths.iter().find(|w| w.width == name).expect(name);
        (w.units, w.norm_groups, w.kept.clone())
    };
    let resnet = report("config/cifar10-resnet18.toml", "heterofl", 3);
    assert_eq!(resnet.widths.len(), 12);
    let leading: Vec<usize> = (0..16).chain(32..48).collect();
    assert_eq!(kept(&resnet, "stage0.residual"), (64, 2, leading));
    assert_eq!(kept(&resnet, "stage3.block1.conv1").2.len(), 256);
    let rolled = report("config/cifar10-resnet18.toml", "fedrolex", 3);
    let window: Vec<usize> = (2..18).chain(34..50).collect();
    assert_eq!(kept(&rolled, "stage0.residual").2, window);
    let cct = report("config/cifar100-cct.toml", "fjord", 1);
    assert_eq!(cct.widths.len(), 13);
    assert_eq!(kept(&cct, "tokenizer0"), (64, 1, (0..32).collect()));
    assert_eq!(kept(&cct, "block5.heads"), (4, 1, vec![0, 1]));
    assert_eq!(kept(&cct, "block0.mlp").2.len(), 256);
    assert_eq!(cct.levels, Some(vec![0.2, 0.4, 0.5]));
}
