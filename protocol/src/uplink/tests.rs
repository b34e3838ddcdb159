use super::state::UplinkState;
use super::*;
use crate::model::NamedTensor;
use crate::payload::{Rejection, decode_and_validate, encode as encode_payload};
use crate::task::Recipe;
use fedshard_strategies::rng::{Purpose, stream};

/// The cohort of the tasks below: SGLD's `κ = N / C = 4`.
const COHORT: Cohort = Cohort {
    population: 20,
    participants: 5,
};

/// A task with a dense tensor and a sharded 4×6 layer holding terms {0, 2, 3}; values in (0, 1)
/// so that FedPM can use the same task.
fn task(compressor: Compressor, config: &CompressionConfig, state: &UplinkState) -> TrainTask {
    task_in(compressor, config, state, COHORT, 3, 11)
}

/// [`task`] for `client` in `round` of `cohort` (same values).
fn task_in(
    compressor: Compressor,
    config: &CompressionConfig,
    state: &UplinkState,
    cohort: Cohort,
    round: u64,
    client: u64,
) -> TrainTask {
    let mut rng = stream(5, 0, 0, Purpose::TestSample);
    let mut values = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| 0.1 + 0.8 * uniform(&mut rng) as f32)
            .collect()
    };
    let mut t = TrainTask {
        round,
        client,
        seed: 21,
        dense: ModelState::new(vec![NamedTensor::new("b", vec![40], values(40)).unwrap()]).unwrap(),
        shards: vec![LayerShard {
            name: "w".into(),
            shape: vec![4, 6],
            indices: vec![0, 2, 3],
            left: values(12),
            right: values(18),
            multipliers: vec![1.0; 3],
        }],
        recipe: Recipe::default(),
        uplink: Uplink::default(),
    };
    t.uplink = state.uplink(compressor, config, cohort, &t).unwrap();
    t
}

/// The task's values moved by a seeded step, kept in (0, 1).
fn trained(task: &TrainTask) -> TrainOutput {
    let mut rng = stream(6, 0, 0, Purpose::TestSample);
    let mut out = TrainOutput {
        dense: task.dense.clone(),
        shards: task.shards.clone(),
        loss: 0.5,
    };
    let mut nudge =
        |v: &mut f32| *v = (*v + 0.3 * (uniform(&mut rng) as f32 - 0.5)).clamp(0.0, 1.0);
    out.dense.tensors[0].data.iter_mut().for_each(&mut nudge);
    out.shards[0].left.iter_mut().for_each(&mut nudge);
    out.shards[0].right.iter_mut().for_each(&mut nudge);
    out
}

fn configs() -> Vec<CompressionConfig> {
    vec![
        CompressionConfig::default(),
        CompressionConfig {
            blocks: BlockMode::Fixed,
            candidates: Some(3),
            block_size: 5,
            ..CompressionConfig::default()
        },
    ]
}

/// The symbols as bit patterns: SGLD's reals compare by their f64 bits, not by `==`.
fn bit_patterns(symbols: &Symbols) -> Vec<u64> {
    match symbols {
        Symbols::Discrete(s) => s.iter().map(|&x| x as u64).collect(),
        Symbols::Real(y) => y.iter().map(|x| x.to_bits()).collect(),
    }
}

#[test]
fn the_server_decodes_the_clients_symbols_bit_for_bit() {
    for config in configs() {
        for compressor in Compressor::ALL.into_iter().filter(|c| c.host().is_some()) {
            let t = task(compressor, &config, &UplinkState::default());
            let (bytes, chosen) = encode_symbols(&t, &trained(&t)).unwrap();
            let sent = flatten(&t.dense, &t.shards);
            let (decoded, _, side) = decode_symbols(&t, &sent, &bytes).unwrap();
            assert_eq!(
                bit_patterns(&decoded),
                bit_patterns(&chosen),
                "{compressor} {:?}",
                config.blocks
            );
            assert_eq!(side.len, 70);
            // Adaptive KLMS starts in UPDATE: the client's own ends come back to the server.
            let update = compressor.klms() && config.blocks == BlockMode::Adaptive;
            assert_eq!(side.ends.is_some(), update, "{compressor}");
        }
    }
}

#[test]
fn bits_reported_are_the_bytes_sent() {
    let config = CompressionConfig::default();
    for compressor in Compressor::ALL {
        let t = task(compressor, &config, &UplinkState::default());
        let payload = encode_payload(&t, &trained(&t)).unwrap();
        assert_eq!(payload.bits, 8 * payload.bytes.len() as u64, "{compressor}");
        decode_and_validate(&payload, &t).unwrap();
    }
    // Plain hosts: 1 bit per value for signs and masks, a 32-bit norm and 1.6 bits for QSGD.
    let size = |c| {
        let t = task(c, &config, &UplinkState::default());
        encode_payload(&t, &trained(&t)).unwrap().bytes.len()
    };
    assert_eq!(size(Compressor::Signsgd), 70usize.div_ceil(8));
    assert_eq!(size(Compressor::Fedpm), 70usize.div_ceil(8));
    assert_eq!(size(Compressor::Qsgd), 4 + 70usize.div_ceil(5));
}

#[test]
fn decoded_values_follow_each_host() {
    let config = CompressionConfig {
        server_lr: 0.5,
        ..CompressionConfig::default()
    };
    let state = UplinkState::default();
    for compressor in [Compressor::Fedpm, Compressor::Signsgd, Compressor::Qsgd] {
        let t = task(compressor, &config, &state);
        let out = trained(&t);
        let bytes = encode(&t, &out).unwrap();
        let (values, _) = decode(&t, &bytes).unwrap();
        let sent = flatten(&t.dense, &t.shards);
        for (v, s) in values.iter().zip(&sent) {
            match compressor {
                Compressor::Fedpm => assert!(*v == MASK_LOW || *v == MASK_HIGH),
                Compressor::Signsgd => assert!(((v - s).abs() - 0.5).abs() < 1e-6),
                _ => {
                    let norm = (flatten(&out.dense, &out.shards)
                        .iter()
                        .zip(&sent)
                        .map(|(o, s)| f64::from(o - s).powi(2))
                        .sum::<f64>())
                    .sqrt() as f32;
                    let step = (v - s).abs();
                    assert!(step < 1e-6 || (step - 0.5 * norm).abs() < 1e-5, "{step}");
                }
            }
        }
    }
}

#[test]
fn corrupted_indices_and_boundaries_are_rejected_not_panics() {
    // K = 3 sends 2 bits per index, so index 3 is representable and must be refused.
    let fixed = CompressionConfig {
        blocks: BlockMode::Fixed,
        candidates: Some(3),
        block_size: 5,
        ..CompressionConfig::default()
    };
    let t = task(Compressor::SignsgdKlms, &fixed, &UplinkState::default());
    let mut bytes = encode(&t, &trained(&t)).unwrap();
    bytes[0] |= 0b11;
    let err = decode(&t, &bytes).unwrap_err();
    assert!(err.contains("index 3") && err.contains("K = 3"), "{err}");

    // Adaptive UPDATE: the block count comes first; a count that overruns the message, or
    // sizes that do not add up, are refused.
    let adaptive = CompressionConfig::default();
    let t = task(Compressor::FedpmKlms, &adaptive, &UplinkState::default());
    let good = encode(&t, &trained(&t)).unwrap();
    let mut bad = good.clone();
    bad[..4].copy_from_slice(&1000u32.to_le_bytes());
    assert!(decode(&t, &bad).unwrap_err().contains("blocks"));
    let mut bad = good.clone();
    bad[..4].copy_from_slice(&1u32.to_le_bytes());
    assert!(decode(&t, &bad).is_err());

    // Any flipped bit or cut anywhere, in every compressor: an error or a valid decode, never a
    // panic; the payload check then counts it.
    for config in configs() {
        for compressor in Compressor::ALL {
            let t = task(compressor, &config, &UplinkState::default());
            let payload = encode_payload(&t, &trained(&t)).unwrap();
            for cut in 0..payload.bytes.len() {
                let mut p = payload.clone();
                p.bytes.truncate(cut);
                p.bits = 8 * cut as u64;
                assert!(matches!(
                    decode_and_validate(&p, &t),
                    Err(Rejection::Malformed(_)) | Err(Rejection::NonFinite(_)) | Ok(_)
                ));
            }
            for bit in 0..8 * payload.bytes.len() {
                let mut p = payload.clone();
                p.bytes[bit / 8] ^= 1 << (bit % 8);
                let _ = decode_and_validate(&p, &t);
            }
        }
    }
}

#[test]
fn a_payload_must_match_the_compressor_the_task_asked_for() {
    let config = CompressionConfig::default();
    let t = task(Compressor::Signsgd, &config, &UplinkState::default());
    let mut payload = encode_payload(&t, &trained(&t)).unwrap();
    payload.compressor = Compressor::Fedpm;
    assert!(matches!(
        decode_and_validate(&payload, &t),
        Err(Rejection::Malformed(_))
    ));
}

#[test]
fn the_location_protocol_broadcasts_aggregated_blocks_then_reports_kl() {
    let config = CompressionConfig::default();
    let mut state = UplinkState::default();
    let round = |state: &UplinkState, client| {
        let mut t = task(Compressor::FedpmKlms, &config, state);
        t.client = client;
        let bytes = encode(&t, &trained(&t)).unwrap();
        let (_, side) = decode(&t, &bytes).unwrap();
        (t, side)
    };
    // Round 1: UPDATE, every client uploads its own ends.
    let decoded: Vec<_> = (0..3).map(|c| round(&state, c)).collect();
    assert!(decoded.iter().all(|(_, s)| s.ends.is_some()));
    let pairs: Vec<_> = decoded.iter().map(|(t, s)| (t, s)).collect();
    state
        .observe(Compressor::FedpmKlms, &config, &pairs)
        .unwrap();
    let ends = state.ends.get(&70).expect("ends for length 70").clone();
    assert_eq!(ends.last(), Some(&70));
    // Round 2: the broadcast ends are used and each client reports its mean block KL.
    let (t, side) = round(&state, 4);
    match &t.uplink.klms.as_ref().unwrap().blocks {
        TaskBlocks::Adaptive { ends: Some(e), .. } => assert_eq!(e, &ends),
        other => panic!("{other:?}"),
    }
    assert!(side.ends.is_none());
    let kl = side.mean_kl_bits.expect("a mean-KL report");
    assert!(kl.is_finite() && kl > 0.0);
    // A report far outside [D/3, 1.5 D] re-opens UPDATE for that length.
    let low = UplinkSide {
        mean_kl_bits: Some(0.01),
        ..side.clone()
    };
    state
        .observe(Compressor::FedpmKlms, &config, &[(&t, &low)])
        .unwrap();
    assert!(!state.ends.contains_key(&70));
}

#[test]
fn qsgd_counts_follow_each_singular_vector_across_clients() {
    let config = CompressionConfig::default();
    let mut state = UplinkState::default();
    let a = task(Compressor::Qsgd, &config, &state);
    assert!(a.uplink.prior_counts.is_none());
    let mut b = a.clone();
    b.shards[0].indices = vec![1, 2];
    b.shards[0].left.truncate(8);
    b.shards[0].right.truncate(12);
    let side = |t: &TrainTask, y: i8| UplinkSide {
        len: state::message_len(t),
        symbols: Some(vec![y; state::message_len(t)]),
        ..UplinkSide::default()
    };
    let (sa, sb) = (side(&a, 1), side(&b, -1));
    state
        .observe(Compressor::Qsgd, &config, &[(&a, &sa), (&b, &sb)])
        .unwrap();
    // Global layout: 40 dense, then U' rows (4 terms × 4) and V' rows (4 × 6).
    assert_eq!(state.counts.len(), 40 + 4 * 10);
    assert_eq!(state.counts[0], [1, 0, 1]);
    assert_eq!(state.counts[40], [0, 0, 1]); // term 0, held by a only
    assert_eq!(state.counts[40 + 4], [1, 0, 0]); // term 1, held by b only
    assert_eq!(state.counts[40 + 8], [1, 0, 1]); // term 2, held by both
    let next = state.uplink(Compressor::Qsgd, &config, COHORT, &a).unwrap();
    let counts = next.prior_counts.expect("counts");
    assert_eq!(counts.len(), 70);
    assert_eq!(counts[40..44], [[0, 0, 1]; 4]);
    assert_eq!(counts[44..48], [[1, 0, 1]; 4]);
    // Laplace smoothing keeps every symbol possible.
    let p = smoothed_prior(Some(&counts), counts.len());
    assert!(p.iter().flatten().all(|&x| x > 0.0));
    assert!((p[40][2] - 2.0 / 4.0).abs() < 1e-12);
}

#[test]
fn qsgd_distribution_matches_the_oracle() {
    // ALGORITHMS.md §4.7: v = (.3, −.4, 0, 1.2), ‖v‖ = 1.3.
    let sent = [0.0f32; 4];
    let out = [0.3f32, -0.4, 0.0, 1.2];
    let uplink = Uplink {
        compressor: Compressor::Qsgd,
        server_lr: 1.0,
        temperature_group: 8,
        klms: None,
        prior_counts: Some(vec![[2, 7, 1], [5, 5, 0], [0, 10, 0], [1, 3, 6]]),
        langevin: None,
    };
    let (m, norm) = message(&uplink, &sent, &out).unwrap();
    assert!((norm.unwrap() - 1.3).abs() < 1e-6);
    let Message::Ternary { q, p } = m else {
        panic!("QSGD is ternary")
    };
    let expect_q = [
        [0.0, 0.769231, 0.230769],
        [0.307692, 0.692308, 0.0],
        [0.0, 1.0, 0.0],
        [0.0, 0.076923, 0.923077],
    ];
    let expect_p = [
        [0.230769, 0.615385, 0.153846],
        [0.461538, 0.461538, 0.076923],
        [0.076923, 0.846154, 0.076923],
        [0.153846, 0.307692, 0.538462],
    ];
    for (got, want) in q.iter().zip(&expect_q).chain(p.iter().zip(&expect_p)) {
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }
    }
    let kl = kl_bits_per_coordinate(
        &Categorical::new(&q).unwrap(),
        &Categorical::new(&p).unwrap(),
    )
    .unwrap();
    for (g, w) in kl.iter().zip([0.382628, 0.224986, 0.241008, 0.563945]) {
        assert!((g - w).abs() < 1e-5, "{kl:?}");
    }
}

#[test]
fn signsgd_distribution_matches_the_oracle() {
    // ALGORITHMS.md §4.8: block v = (.01, −.02, .005, 0), M = .001.
    let sent = [0.0f32; 4];
    let out = [0.01f32, -0.02, 0.005, 0.0];
    let uplink = Uplink {
        compressor: Compressor::Signsgd,
        server_lr: 1.0,
        temperature_group: 4,
        klms: None,
        prior_counts: None,
        langevin: None,
    };
    let (m, _) = message(&uplink, &sent, &out).unwrap();
    let Message::Ternary { q, .. } = m else {
        panic!("SignSGD is ternary")
    };
    for (row, want) in q.iter().zip([0.999955, 2.1e-9, 0.993307, 0.5]) {
        assert!((row[2] - want).abs() < 1e-5, "{row:?} vs {want}");
        assert_eq!(row[1], 0.0);
    }
}

#[test]
fn fedpm_refuses_values_that_are_not_probabilities() {
    let config = CompressionConfig::default();
    let t = task(Compressor::Fedpm, &config, &UplinkState::default());
    let mut out = trained(&t);
    out.dense.tensors[0].data[3] = 1.5;
    let err = encode(&t, &out).unwrap_err();
    assert!(err.contains("[0, 1]") && err.contains("1.5"), "{err}");
}

/// `out = sent − μ`: the output of an SGLD client whose scaled gradient is `μ` at every value.
fn potential_step(task: &TrainTask, mu: f32) -> TrainOutput {
    let mut out = TrainOutput {
        dense: task.dense.clone(),
        shards: task.shards.clone(),
        loss: 0.0,
    };
    let step = |v: &mut f32| *v -= mu;
    out.dense.tensors[0].data.iter_mut().for_each(step);
    out.shards[0].left.iter_mut().for_each(step);
    out.shards[0].right.iter_mut().for_each(step);
    out
}

#[test]
fn sgld_candidates_are_decoded_bit_for_bit_through_the_location_protocol() {
    // Adaptive blocks: round 1 uploads the client's own ends, round 2 uses the broadcast ends
    // and reports the KL; fixed blocks: K = 3 over blocks of 5. In every case the server's y is
    // the client's candidate, and the decoded value is `sent − η κ C y` (η κ C = η N = 20).
    let adaptive = CompressionConfig::default();
    let fixed = CompressionConfig {
        blocks: BlockMode::Fixed,
        candidates: Some(3),
        block_size: 5,
        ..CompressionConfig::default()
    };
    for config in [&adaptive, &fixed] {
        let mut state = UplinkState::default();
        for round in 1..=2 {
            let mut sides = Vec::new();
            for client in 0..5 {
                let t = task_in(Compressor::SgldKlms, config, &state, COHORT, round, client);
                let (bytes, chosen) = encode_symbols(&t, &trained(&t)).unwrap();
                let sent = flatten(&t.dense, &t.shards);
                let (decoded, _, _) = decode_symbols(&t, &sent, &bytes).unwrap();
                assert_eq!(bit_patterns(&decoded), bit_patterns(&chosen));
                let (values, side) = decode(&t, &bytes).unwrap();
                let Symbols::Real(y) = chosen else {
                    panic!("SGLD sends reals")
                };
                for ((v, s), y) in values.iter().zip(&sent).zip(&y) {
                    assert_eq!(*v, (f64::from(*s) - 20.0 * y) as f32);
                }
                let update = config.blocks == BlockMode::Adaptive && round == 1;
                assert_eq!(side.ends.is_some(), update, "round {round}");
                assert_eq!(
                    side.mean_kl_bits.is_some(),
                    config.blocks == BlockMode::Adaptive && round == 2
                );
                sides.push((t, side));
            }
            let pairs: Vec<_> = sides.iter().map(|(t, s)| (t, s)).collect();
            state.observe(Compressor::SgldKlms, config, &pairs).unwrap();
        }
    }
}

#[test]
fn sgld_bits_are_the_bytes_sent() {
    // Without KLMS: an f32 per value, nothing else. With adaptive KLMS in an UPDATE round: the
    // block count (32 bits), M sizes of ⌈log2 256⌉ = 8 bits and M indices of D_target = 2 bits.
    let config = CompressionConfig::default();
    let state = UplinkState::default();
    let t = task(Compressor::Sgld, &config, &state);
    let payload = encode_payload(&t, &trained(&t)).unwrap();
    assert_eq!(payload.bytes.len(), 4 * 70);
    assert_eq!(payload.bits, 32 * 70);
    let t = task(Compressor::SgldKlms, &config, &state);
    let payload = encode_payload(&t, &trained(&t)).unwrap();
    let (_, side) = decode(&t, &payload.bytes).unwrap();
    let blocks = side.ends.expect("an UPDATE round uploads its ends").len() as u64;
    assert_eq!(
        payload.bytes.len() as u64,
        (32 + blocks * (8 + 2)).div_ceil(8)
    );
    assert_eq!(payload.bits, 8 * payload.bytes.len() as u64);
}

#[test]
fn sgld_payloads_that_are_cut_or_not_finite_are_refused() {
    let config = CompressionConfig::default();
    let t = task(Compressor::Sgld, &config, &UplinkState::default());
    let good = encode(&t, &trained(&t)).unwrap();
    assert!(decode(&t, &good[..good.len() - 1]).is_err());
    let mut longer = good.clone();
    longer.push(0);
    assert!(decode(&t, &longer).unwrap_err().contains("trailing"));
    let mut nan = good.clone();
    nan[8..12].copy_from_slice(&f32::NAN.to_le_bytes());
    assert!(decode(&t, &nan).unwrap_err().contains("SGLD value 2"));
    // A finite value whose step overflows f32 decodes, and the payload check counts it.
    let mut huge = good;
    huge[..4].copy_from_slice(&f32::MAX.to_le_bytes());
    let mut payload = encode_payload(&t, &trained(&t)).unwrap();
    payload.bytes = huge;
    assert!(matches!(
        decode_and_validate(&payload, &t),
        Err(Rejection::NonFinite(_))
    ));
    // A task without its cohort cannot be coded or decoded.
    let mut bare = t.clone();
    bare.uplink.langevin = None;
    assert!(
        encode(&bare, &trained(&bare))
            .unwrap_err()
            .contains("cohort")
    );
    assert!(decode(&bare, &encode(&t, &trained(&t)).unwrap()).is_err());
}

#[test]
fn many_sgld_clients_step_by_the_mean_drift_with_exactly_the_langevin_noise() {
    // η = 0.01, N = 100, C = 40: κ = 2.5, σ² = 2/(η κ² C) = 0.8, and a decoded value moves by
    // η κ C y = y. The equal-weight mean of the 40 decoded values then steps by −η κ Σ_c μ_c
    // = −η N μ = −μ on average, with variance 2η = 0.02 per coordinate. 30 rounds × 70 values
    // give 2100 steps: the sample variance has a relative standard deviation of √(2/2099) ≈
    // 3.1%, so a 12% tolerance is about 4 of them; the mean's standard deviation is
    // √(0.02/2100) ≈ 0.0031, so its tolerance 0.0125 is 4 of them.
    //
    // Without KLMS the drift is exact. With KLMS the noise is (at μ = 0 the chosen candidate
    // is a draw of p = q), but the drift is not: choosing among K = 4 candidates of p by
    // self-normalised importance weights transmits only part of the mean, to first order in a
    // block's KL `(1 − 1/K) μ` (here the block holds 0.11 nats; measured 0.63 μ), the bias of
    // the Gaussian toy of §4.11 (0.516 of 0.8 at K = 4). The test pins it inside [0.5 μ, μ].
    let config = CompressionConfig {
        server_lr: 0.01,
        ..CompressionConfig::default()
    };
    let cohort = Cohort {
        population: 100,
        participants: 40,
    };
    for compressor in [Compressor::Sgld, Compressor::SgldKlms] {
        for mu in [0.0f32, 0.05] {
            let mut state = UplinkState::default();
            let mut steps = Vec::new();
            for round in 1..=30 {
                let mut mean = vec![0.0f64; 70];
                let mut sides = Vec::new();
                let mut sent = Vec::new();
                for client in 0..40 {
                    let t = task_in(compressor, &config, &state, cohort, round, client);
                    let bytes = encode(&t, &potential_step(&t, mu)).unwrap();
                    let (values, side) = decode(&t, &bytes).unwrap();
                    for (m, v) in mean.iter_mut().zip(&values) {
                        *m += f64::from(*v) / 40.0;
                    }
                    sent = flatten(&t.dense, &t.shards);
                    sides.push((t, side));
                }
                let pairs: Vec<_> = sides.iter().map(|(t, s)| (t, s)).collect();
                state.observe(compressor, &config, &pairs).unwrap();
                steps.extend(mean.iter().zip(&sent).map(|(m, s)| m - f64::from(*s)));
            }
            let n = steps.len() as f64;
            let average = steps.iter().sum::<f64>() / n;
            let variance = steps.iter().map(|x| (x - average).powi(2)).sum::<f64>() / (n - 1.0);
            let mu = f64::from(mu);
            eprintln!("{compressor} μ = {mu}: mean step {average:.5}, variance {variance:.5}");
            if compressor.klms() && mu > 0.0 {
                assert!(
                    (-mu - 0.0125..-0.5 * mu).contains(&average),
                    "{compressor} μ = {mu}: mean step {average}, expected in [−μ, −μ/2]"
                );
            } else {
                assert!(
                    (average + mu).abs() < 0.0125,
                    "{compressor} μ = {mu}: mean step {average}, expected {}",
                    -mu
                );
            }
            assert!(
                (variance / 0.02 - 1.0).abs() < 0.12,
                "{compressor} μ = {mu}: step variance {variance}, expected 2η = 0.02"
            );
        }
    }
}
