//! Aggregation weights and per-singular-vector averaging (ALGORITHMS.md §1.1 step 5, §2.4,
//! §3.2).

use fedshard_strategies::aggregation::{
    AggregatorName, ColumnUpdate, Contribution, Failure, InverseProbability, RoundOutcome,
    average_columns,
};

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
    let get = |name: &str| {
        name.parse::<AggregatorName>()
            .unwrap()
            .build()
            .unwrap()
            .weights(&round)
            .unwrap()
    };
    // FedAvg: n_c / Σ n over the results (the failed client is simply absent).
    assert_eq!(get("fedavg"), vec![0.1, 0.3, 0.6]);
    assert_eq!(get("spectral"), vec![0.1, 0.3, 0.6]);
    let u = get("uniform");
    assert!(u.iter().all(|w| (w - 1.0 / 3.0).abs() < 1e-15));
    // Inverse probability: n / (p Σ_population n) = (10/(.5·200), 30/200, 60/(.25·200)); the sum
    // is 1.45, not 1, by design.
    let ip = get("inverse-probability");
    let want = [0.1, 0.15, 1.2];
    for (g, w) in ip.iter().zip(want) {
        assert!((g - w).abs() < 1e-15, "{ip:?}");
    }
    // FESC with sizes (10, 30, 60): weights increase with n and sum to 1.
    let f = get("fesc");
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
    for name in [
        "fedavg",
        "uniform",
        "fesc",
        "inverse-probability",
        "spectral",
    ] {
        let agg = name.parse::<AggregatorName>().unwrap().build().unwrap();
        assert!(agg.weights(&empty).is_err(), "{name}");
    }
    let results = contributions(&[10.0, f64::NAN], &[1.0, 1.0]);
    let round = RoundOutcome {
        results: &results,
        failures: &[],
        population_samples: 10.0,
    };
    assert!(
        AggregatorName::Fedavg
            .build()
            .unwrap()
            .weights(&round)
            .is_err()
    );
    let results = contributions(&[10.0], &[0.0]);
    let round = RoundOutcome {
        results: &results,
        failures: &[],
        population_samples: 10.0,
    };
    assert!(
        fedshard_strategies::aggregation::Aggregator::weights(&InverseProbability, &round).is_err()
    );
}

/// Three vectors of length 2. Client A (D = 1) holds vectors 0 and 2, client B (D = 3) holds
/// vector 2 only; vector 1 is held by nobody and must keep its exact bits.
#[test]
fn average_columns_weighted_mean_and_untouched_vectors() {
    let untouched = [f32::from_bits(0x3f80_0001), -0.0];
    let mut global = vec![9.0, 9.0, untouched[0], untouched[1], 9.0, 9.0];
    let a = ColumnUpdate {
        samples: 1.0,
        indices: &[2, 0],
        vectors: &[1.0, 2.0, 10.0, 20.0],
    };
    let b = ColumnUpdate {
        samples: 3.0,
        indices: &[2],
        vectors: &[5.0, 6.0],
    };
    let holders = average_columns(&mut global, 2, &[a, b]).unwrap();
    assert_eq!(holders, vec![1, 0, 2]);
    assert_eq!(&global[0..2], &[10.0, 20.0]);
    assert_eq!(global[2].to_bits(), untouched[0].to_bits());
    assert_eq!(global[3].to_bits(), untouched[1].to_bits());
    // (1·1 + 3·5)/4 = 4, (1·2 + 3·6)/4 = 5.
    assert_eq!(&global[4..6], &[4.0, 5.0]);
}

#[test]
fn average_columns_rejects_bad_input_atomically() {
    let original = vec![1.0f32, 2.0, 3.0, 4.0];
    let good = ColumnUpdate {
        samples: 1.0,
        indices: &[0],
        vectors: &[7.0, 7.0],
    };
    let cases: Vec<(&str, usize, ColumnUpdate)> = vec![
        (
            "wrong length",
            2,
            ColumnUpdate {
                samples: 1.0,
                indices: &[1],
                vectors: &[1.0],
            },
        ),
        (
            "index out of range",
            2,
            ColumnUpdate {
                samples: 1.0,
                indices: &[2],
                vectors: &[1.0, 1.0],
            },
        ),
        (
            "duplicate index",
            2,
            ColumnUpdate {
                samples: 1.0,
                indices: &[1, 1],
                vectors: &[1.0, 1.0, 1.0, 1.0],
            },
        ),
        (
            "NaN",
            2,
            ColumnUpdate {
                samples: 1.0,
                indices: &[1],
                vectors: &[f32::NAN, 1.0],
            },
        ),
        (
            "zero weight",
            2,
            ColumnUpdate {
                samples: 0.0,
                indices: &[1],
                vectors: &[1.0, 1.0],
            },
        ),
        (
            "vector length does not divide",
            3,
            ColumnUpdate {
                samples: 1.0,
                indices: &[0],
                vectors: &[1.0, 1.0, 1.0],
            },
        ),
    ];
    for (what, len, bad) in cases {
        let mut global = original.clone();
        // The good contribution comes first: nothing of it may be written either.
        assert!(
            average_columns(&mut global, len, &[good, bad]).is_err(),
            "{what}"
        );
        assert_eq!(
            global.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            original.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{what}"
        );
    }
}
