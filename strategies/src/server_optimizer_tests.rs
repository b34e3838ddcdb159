//! The server optimizers against Flower's strategies on the same inputs
//! (`scripts/flower_optimizers.py`, flwr 1.42, its output committed as
//! `tests/fixtures/flower/optimizers.json`), and the table's rules.

use super::*;
use crate::aggregation::{Scale, fold_weighted};
use serde_json::Value;

const FIXTURE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/flower/optimizers.json"
));

fn tensors(v: &Value) -> Vec<Vec<f32>> {
    v.as_array()
        .expect("tensors")
        .iter()
        .map(|t| {
            t.as_array()
                .expect("values")
                .iter()
                .map(|x| x.as_f64().expect("number") as f32)
                .collect()
        })
        .collect()
}

/// Three rounds of each of Flower's `FedAvgM`, `FedAdagrad`, `FedAdam` and `FedYogi`: the
/// round's FedAvg mean through fedshard's own fold, then the optimizer's step, equal Flower's
/// global models within 1e-6.
#[test]
fn every_optimizer_equals_flowers_strategy() {
    let fixture: Value = serde_json::from_str(FIXTURE).expect("fixture");
    let samples: Vec<f64> = fixture["samples"]
        .as_array()
        .expect("samples")
        .iter()
        .map(|n| n.as_f64().expect("n"))
        .collect();
    let total: f64 = samples.iter().sum();
    let weights: Vec<f64> = samples.iter().map(|n| n / total).collect();
    let rounds: Vec<Vec<Vec<Vec<f32>>>> = fixture["rounds"]
        .as_array()
        .expect("rounds")
        .iter()
        .map(|r| r.as_array().expect("clients").iter().map(tensors).collect())
        .collect();
    let optimizers = fixture["optimizers"].as_array().expect("optimizers");
    assert_eq!(optimizers.len(), 4);
    for case in optimizers {
        let optimizer: ServerOptimizer =
            serde_json::from_value(case["table"].clone()).expect("a valid table");
        let mut model = tensors(&fixture["initial"]);
        let mut state = OptimizerState::default();
        for (r, (clients, expected)) in rounds
            .iter()
            .zip(case["models"].as_array().expect("models"))
            .enumerate()
        {
            let before = model.clone();
            let updates: Vec<Vec<(usize, &[f32])>> = clients
                .iter()
                .map(|c| {
                    c.iter()
                        .enumerate()
                        .map(|(b, t)| (b, t.as_slice()))
                        .collect()
                })
                .collect();
            let mut blocks: Vec<&mut [f32]> = model.iter_mut().map(Vec::as_mut_slice).collect();
            fold_weighted(&mut blocks, &updates, &weights, Scale::Mean).expect("folds");
            let before_blocks: Vec<&[f32]> = before.iter().map(Vec::as_slice).collect();
            optimizer
                .step(&mut state, r as u64 + 1, &before_blocks, &mut blocks)
                .expect("steps");
            for (ours, theirs) in model.iter().zip(tensors(expected)) {
                for (a, b) in ours.iter().zip(&theirs) {
                    assert!(
                        (a - b).abs() <= 1e-6,
                        "{}: round {}: {a} vs Flower's {b}",
                        optimizer.name(),
                        r + 1
                    );
                }
            }
        }
    }
}

/// `sgd` at η = 1 is plain averaging: the aggregate keeps its exact bits.
#[test]
fn sgd_at_unit_rate_leaves_the_aggregate_as_it_is() {
    let sgd = ServerOptimizer::try_from(Table::Sgd { lr: 1.0 }).unwrap();
    let before = [0.25f32, -1.5, 3.0];
    let mut after = [0.75f32, -1.25, 3.0];
    let expected = after;
    sgd.step(
        &mut OptimizerState::default(),
        1,
        &[&before],
        &mut [&mut after],
    )
    .unwrap();
    assert_eq!(after, expected);
}

/// Momentum by hand: Δ = 1 twice with μ = 0.5 and η = 2 moves by 2 · 1 and then 2 · 1.5.
#[test]
fn momentum_accumulates_the_aggregate_changes() {
    let m = ServerOptimizer::try_from(Table::Momentum {
        lr: 2.0,
        momentum: 0.5,
    })
    .unwrap();
    let mut state = OptimizerState::default();
    let mut x = [1.0f32];
    m.step(&mut state, 1, &[&[0.0]], &mut [&mut x]).unwrap();
    assert_eq!(x, [2.0]);
    let mut y = [3.0f32];
    m.step(&mut state, 2, &[&[2.0]], &mut [&mut y]).unwrap();
    assert_eq!(y, [5.0]);
    assert_eq!(state.first, vec![vec![1.5]]);
}

fn table(json: &str) -> std::result::Result<ServerOptimizer, String> {
    serde_json::from_str(json).map_err(|e| e.to_string())
}

/// Defaults are Flower's; every out-of-range number is refused naming its field.
#[test]
fn the_table_checks_its_numbers_and_defaults_to_flowers() {
    assert_eq!(
        table(r#"{"kind": "adam"}"#).unwrap().table(),
        Table::Adam {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.99,
            tau: 1e-9
        }
    );
    assert_eq!(
        table(r#"{"kind": "yogi"}"#).unwrap().table(),
        Table::Yogi {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.99,
            tau: 1e-3
        }
    );
    for (json, field) in [
        (r#"{"kind": "sgd", "lr": 0}"#, "server_optimizer.lr"),
        (
            r#"{"kind": "momentum", "momentum": 1.0}"#,
            "server_optimizer.momentum",
        ),
        (
            r#"{"kind": "adam", "beta2": -0.1}"#,
            "server_optimizer.beta2",
        ),
        (r#"{"kind": "yogi", "tau": 0}"#, "server_optimizer.tau"),
    ] {
        let err = table(json).unwrap_err();
        assert!(err.contains(field), "{json}: {err}");
    }
    let err = table(r#"{"kind": "adam", "beta3": 0.5}"#).unwrap_err();
    assert!(err.contains("beta3"), "{err}");
    let err = table(r#"{"kind": "lamb"}"#).unwrap_err();
    assert!(err.contains("yogi"), "{err}");
    let adam = table(r#"{"kind": "adam", "lr": 0.5}"#).unwrap();
    let back = serde_json::to_string(&adam).unwrap();
    assert_eq!(table(&back).unwrap(), adam, "{back}");
}

/// A state that does not fit the model (another model's checkpoint) is refused and nothing
/// moves.
#[test]
fn a_state_of_another_model_is_refused() {
    let adam = table(r#"{"kind": "adam"}"#).unwrap();
    let mut state = OptimizerState {
        first: vec![vec![0.0; 2]],
        second: vec![vec![0.0; 2]],
    };
    let mut x = [1.0f32, 2.0, 3.0];
    let err = adam
        .step(&mut state, 1, &[&[0.0, 0.0, 0.0]], &mut [&mut x])
        .unwrap_err();
    assert!(err.to_string().contains("checkpoint"), "{err}");
    assert_eq!(x, [1.0, 2.0, 3.0]);
}
