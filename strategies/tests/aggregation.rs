//! Aggregation weights and the block fold (docs/algorithms.md §1.1 step 5, §2.4, §3.2).

use fedshard_strategies::aggregation::{
    Aggregator, AggregatorName, BlockUpdate, Contribution, Failure, FedAvg, Fesc, Fit, FitRound,
    InverseProbability, RoundOutcome, Scale, Weighting, fold_weighted,
};

/// The weights an aggregator of the registry applies, seen through `aggregate_fit` alone: one
/// global block of `m` zeros, result `i` trains it to the unit vector `e_i`, so the block ends
/// at `(w_i / Σw)` for a mean and `w_i` for a sum: the weights either way for the normalised
/// aggregators, whose weights sum to 1.
fn applied_weights(name: &str, round: &RoundOutcome) -> Result<Vec<f64>, String> {
    let m = round.results.len();
    let units: Vec<Vec<f32>> = (0..m)
        .map(|i| (0..m).map(|k| if k == i { 1.0 } else { 0.0 }).collect())
        .collect();
    let updates: Vec<Vec<BlockUpdate>> = units.iter().map(|u| vec![(0, u.as_slice())]).collect();
    let mut block = vec![0.0f32; m.max(1)];
    let aggregator = name.parse::<AggregatorName>().unwrap().build().unwrap();
    let fit = aggregator
        .aggregate_fit(
            &mut [block.as_mut_slice()],
            &FitRound {
                outcome: *round,
                updates: &updates,
            },
        )
        .map_err(|e| e.to_string())?;
    match fit {
        Fit::Updated => Ok(block.iter().map(|&x| f64::from(x)).collect()),
        Fit::NoUpdate(why) => Err(why),
    }
}

fn contributions(samples: &[f64], p: &[f64]) -> Vec<Contribution> {
    samples
        .iter()
        .zip(p)
        .enumerate()
        .map(|(i, (&n, &p))| Contribution {
            client: i as u64,
            samples: n,
            inclusion_probability: p,
        })
        .collect()
}

#[test]
fn fedavg_uniform_and_inverse_probability_weights() {
    let results = contributions(&[10.0, 30.0, 60.0], &[0.5, 1.0, 0.25]);
    let failures = [Failure {
        client: 9,
        reason: "timeout".into(),
    }];
    let round = RoundOutcome {
        results: &results,
        failures: &failures,
        population_samples: 200.0,
    };
    let get = |name: &str| applied_weights(name, &round).unwrap();
    // FedAvg: n_c / Σ n over the results (the failed client is simply absent); the fold runs in
    // f32, hence the tolerance.
    let close = |got: Vec<f64>, want: &[f64]| {
        assert!(
            got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-7),
            "{got:?} vs {want:?}"
        )
    };
    close(get("fedavg"), &[0.1, 0.3, 0.6]);
    close(get("uniform"), &[1.0 / 3.0; 3]);
    // Inverse probability: n / (p Σ_population n) = (10/(.5·200), 30/200, 60/(.25·200)); the sum
    // is 1.45, not 1, by design.
    let ip = InverseProbability.weights(&round).unwrap();
    let want = [0.1, 0.15, 1.2];
    for (g, w) in ip.iter().zip(want) {
        assert!((g - w).abs() < 1e-15, "{ip:?}");
    }
    assert_eq!(InverseProbability.scale(), Scale::Sum);
    close(get("inverse-probability"), &want);
    // FESC with sizes (10, 30, 60): weights increase with n and sum to 1.
    let f = Fesc.weights(&round).unwrap();
    close(get("fesc"), &f);
    assert!((f.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    assert!(f[0] <= f[1] && f[1] <= f[2]);
}

#[test]
fn bad_rounds_are_rejected() {
    let empty = RoundOutcome {
        results: &[],
        failures: &[Failure {
            client: 1,
            reason: "crashed".into(),
        }],
        population_samples: 10.0,
    };
    // Flower's aggregate_fit may return "no update": a round without results never moves
    // the model and is not an error.
    for name in ["fedavg", "uniform", "fesc", "inverse-probability"] {
        let why = applied_weights(name, &empty).unwrap_err();
        assert!(why.contains("no successful results"), "{name}: {why}");
    }
    let results = contributions(&[10.0, f64::NAN], &[1.0, 1.0]);
    let round = RoundOutcome {
        results: &results,
        failures: &[],
        population_samples: 10.0,
    };
    assert!(applied_weights("fedavg", &round).is_err());
    let results = contributions(&[10.0], &[0.0]);
    let round = RoundOutcome {
        results: &results,
        failures: &[],
        population_samples: 10.0,
    };
    assert!(InverseProbability.weights(&round).is_err());
}

/// Three blocks of length 2 (three singular vectors of a factor). Result A (D = 1) trains
/// blocks 2 and 0, result B (D = 3) block 2 only; block 1 is trained by nobody and must keep its
/// exact bits.
#[test]
fn fold_is_a_weighted_mean_per_block_and_leaves_untrained_blocks() {
    let untouched = [f32::from_bits(0x3f80_0001), -0.0];
    let mut blocks = [vec![9.0, 9.0], untouched.to_vec(), vec![9.0, 9.0]];
    let a: Vec<BlockUpdate> = vec![(2, &[1.0, 2.0]), (0, &[10.0, 20.0])];
    let b: Vec<BlockUpdate> = vec![(2, &[5.0, 6.0])];
    let mut global: Vec<&mut [f32]> = blocks.iter_mut().map(|b| b.as_mut_slice()).collect();
    fold_weighted(&mut global, &[a, b], &[1.0, 3.0], Scale::Mean).unwrap();
    assert_eq!(blocks[0], vec![10.0, 20.0]);
    assert_eq!(blocks[1][0].to_bits(), untouched[0].to_bits());
    assert_eq!(blocks[1][1].to_bits(), untouched[1].to_bits());
    // (1·1 + 3·5)/4 = 4, (1·2 + 3·6)/4 = 5.
    assert_eq!(blocks[2], vec![4.0, 5.0]);
    // The same through the registry's FedAvg with D = (1, 3).
    let results = contributions(&[1.0, 3.0], &[1.0, 1.0]);
    let mut again = [vec![9.0, 9.0], untouched.to_vec(), vec![9.0, 9.0]];
    let a: Vec<BlockUpdate> = vec![(2, &[1.0, 2.0]), (0, &[10.0, 20.0])];
    let b: Vec<BlockUpdate> = vec![(2, &[5.0, 6.0])];
    let mut global: Vec<&mut [f32]> = again.iter_mut().map(|b| b.as_mut_slice()).collect();
    let round = FitRound {
        outcome: RoundOutcome {
            results: &results,
            failures: &[],
            population_samples: 4.0,
        },
        updates: &[a, b],
    };
    assert_eq!(
        FedAvg.aggregate_fit(&mut global, &round).unwrap(),
        Fit::Updated
    );
    assert_eq!(again, blocks);
}

#[test]
fn fold_rejects_bad_input_atomically() {
    let original = [vec![1.0f32, 2.0], vec![3.0, 4.0]];
    let good: Vec<BlockUpdate> = vec![(0, &[7.0, 7.0])];
    let cases: Vec<(&str, Vec<BlockUpdate>, f64)> = vec![
        ("wrong length", vec![(1, &[1.0])], 1.0),
        ("block out of range", vec![(2, &[1.0, 1.0])], 1.0),
        (
            "same block twice",
            vec![(1, &[1.0, 1.0]), (1, &[1.0, 1.0])],
            1.0,
        ),
        ("NaN", vec![(1, &[f32::NAN, 1.0])], 1.0),
        ("negative weight", vec![(1, &[1.0, 1.0])], -1.0),
        ("infinite weight", vec![(1, &[1.0, 1.0])], f64::INFINITY),
    ];
    for (what, bad, weight) in cases {
        let mut blocks = original.clone();
        let mut global: Vec<&mut [f32]> = blocks.iter_mut().map(|b| b.as_mut_slice()).collect();
        // The good result comes first: nothing of it may be written either.
        assert!(
            fold_weighted(
                &mut global,
                &[good.clone(), bad],
                &[1.0, weight],
                Scale::Mean
            )
            .is_err(),
            "{what}"
        );
        assert_eq!(blocks, original, "{what}");
    }
    let mut blocks = original.clone();
    let mut global: Vec<&mut [f32]> = blocks.iter_mut().map(|b| b.as_mut_slice()).collect();
    assert!(fold_weighted(&mut global, &[good], &[], Scale::Mean).is_err());
}
