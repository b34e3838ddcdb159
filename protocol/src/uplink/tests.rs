use super::codec::{Frame, HostCodec, Layout, Symbols, Update};
use super::klms::KlmsFrame;
use super::qsgd::{Qsgd, Trits};
use super::signsgd::Signsgd;
use super::state::UplinkState;
use super::wire::{BitReader, BitWriter};
use super::*;
use crate::error::Error;
use crate::model::NamedTensor;
use crate::payload::{Rejection, decode_and_validate, encode as encode_payload};
use crate::task::Recipe;
use crate::task::TrainOutput;
use fedshard_strategies::compression::{Categorical, Selection, kl_bits_per_coordinate};
use fedshard_strategies::rng::{Purpose, stream, uniform};

/// The cohort of the tasks below: SGLD's `κ = N / C = 4`.
const COHORT: Cohort = Cohort {
    population: 20,
    participants: 5,
    round: 3,
};

/// The payload of the task's compressor for `output`, and the symbols the client chose.
fn encode_symbols(task: &TrainTask, output: &TrainOutput) -> Result<(Vec<u8>, Symbols), Error> {
    task.uplink.compressor.codec().encode(task, output)
}

/// The payload of the task's compressor for `output`.
fn encode(task: &TrainTask, output: &TrainOutput) -> Result<Vec<u8>, Error> {
    encode_symbols(task, output).map(|(bytes, _)| bytes)
}

/// What the server decodes from a compressed payload, and the symbols it read.
fn decode_symbols(
    task: &TrainTask,
    bytes: &[u8],
) -> Result<(Vec<f32>, UplinkSide, Symbols), Error> {
    match task.uplink.compressor.codec().decode(task, bytes)? {
        (Update::Message { values, side }, symbols) => Ok((values, side, symbols)),
        (Update::Tensors { .. }, _) => panic!("a compressed payload decoded as tensors"),
    }
}

/// The server's values and side information from a compressed payload.
fn decode(task: &TrainTask, bytes: &[u8]) -> Result<(Vec<f32>, UplinkSide), Error> {
    decode_symbols(task, bytes).map(|(values, side, _)| (values, side))
}

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
        width: None,
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
        variates: None,
    };
    t.uplink = state
        .uplink(compressor, config, Cohort { round, ..cohort }, &t)
        .unwrap();
    t
}

/// The task's values moved by a seeded step, kept in (0, 1).
fn trained(task: &TrainTask) -> TrainOutput {
    let mut rng = stream(6, 0, 0, Purpose::TestSample);
    let mut out = TrainOutput {
        dense: task.dense.clone(),
        shards: task.shards.clone(),
        loss: 0.5,
        control: None,
    };
    let mut nudge =
        |v: &mut f32| *v = (*v + 0.3 * (uniform(&mut rng) as f32 - 0.5)).clamp(0.0, 1.0);
    out.dense.tensors[0].data.iter_mut().for_each(&mut nudge);
    out.shards[0].left.iter_mut().for_each(&mut nudge);
    out.shards[0].right.iter_mut().for_each(&mut nudge);
    out
}

/// Adaptive and fixed blocks, each with the paper's importance sampling and with ordered
/// random coding.
fn configs() -> Vec<CompressionConfig> {
    let fixed = CompressionConfig {
        blocks: BlockMode::Fixed,
        candidates: Some(3),
        block_size: 5,
        ..CompressionConfig::default()
    };
    let ordered = |c: &CompressionConfig| CompressionConfig {
        selection: Selection::Ordered,
        ..c.clone()
    };
    vec![
        CompressionConfig::default(),
        ordered(&CompressionConfig::default()),
        ordered(&fixed),
        fixed,
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
            let (_, side, decoded) = decode_symbols(&t, &bytes).unwrap();
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
    // Elias-coded QSGD: the norm, then `2⌊log2 x⌋ + 1` bits for the count plus one and for each
    // gap, and a sign bit per non-zero symbol.
    let t = task(Compressor::QsgdElias, &config, &UplinkState::default());
    let (bytes, symbols) = encode_symbols(&t, &trained(&t)).unwrap();
    let Symbols::Discrete(symbols) = symbols else {
        panic!("QSGD is discrete")
    };
    let gamma = |x: usize| 2 * x.ilog2() as usize + 1;
    let nonzero: Vec<usize> = (0..70).filter(|&j| symbols[j] != 0).collect();
    let mut bits = 32 + gamma(nonzero.len() + 1);
    let mut previous = None;
    for &j in &nonzero {
        bits += gamma(previous.map_or(j + 1, |p| j - p)) + 1;
        previous = Some(j);
    }
    assert!(!nonzero.is_empty());
    assert_eq!(bytes.len(), bits.div_ceil(8), "{nonzero:?}");
}

/// Ordered random coding writes each index in the exp-Golomb code of order `⌊log2 K / 2⌋` for
/// fixed blocks (here K = 16: order 2, 3 bits for an index below 4, 5 below 12, 7 below 28),
/// and nothing else changes: the payload is exactly those codes, against importance sampling's
/// 4 bits an index; and the decoder reads back the indices the client chose.
#[test]
fn ordered_indices_cost_their_exp_golomb_codes() {
    let config = |selection| CompressionConfig {
        blocks: BlockMode::Fixed,
        candidates: Some(16),
        block_size: 5,
        selection,
        ..CompressionConfig::default()
    };
    for compressor in [Compressor::SignsgdKlms, Compressor::QsgdKlms] {
        let ordered = task(
            compressor,
            &config(Selection::Ordered),
            &UplinkState::default(),
        );
        let klms = ordered.uplink.klms.as_ref().unwrap();
        assert_eq!(index_code_order(klms).unwrap(), Some(2));
        let bytes = encode(&ordered, &trained(&ordered)).unwrap();
        let mut r = BitReader::new(&bytes);
        // QSGD's 32-bit norm comes first, then (before any counts) its tensor means.
        let skip = match compressor {
            Compressor::QsgdKlms => 32 + 64 * ordered.uplink.prior_tensors.len() as u32,
            _ => 0,
        };
        for _ in 0..skip / 32 {
            r.u32().unwrap();
        }
        let layout = Layout {
            uplink: &ordered.uplink,
            len: 70,
        };
        let indices = KlmsFrame::read(&mut r, &layout).unwrap().indices;
        assert_eq!(indices.len(), 14);
        let bits: u64 = indices.iter().map(|&k| wire::exp_golomb_bits(k, 2)).sum();
        assert_eq!(
            bytes.len() as u64,
            (u64::from(skip) + bits).div_ceil(8),
            "{indices:?}"
        );
        let importance = task(
            compressor,
            &config(Selection::Importance),
            &UplinkState::default(),
        );
        let plain = encode(&importance, &trained(&importance)).unwrap();
        assert_eq!(plain.len() as u64, (u64::from(skip) + 14 * 4).div_ceil(8));
    }
}

#[test]
fn decoded_values_follow_each_host() {
    let config = CompressionConfig {
        server_lr: 0.5,
        ..CompressionConfig::default()
    };
    let state = UplinkState::default();
    for compressor in [
        Compressor::Fedpm,
        Compressor::Signsgd,
        Compressor::Qsgd,
        Compressor::QsgdElias,
    ] {
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
    assert!(
        err.to_string().contains("index 3") && err.to_string().contains("K = 3"),
        "{err}"
    );

    // Adaptive UPDATE: the block count comes first; a count that overruns the message, or
    // sizes that do not add up, are refused.
    let adaptive = CompressionConfig::default();
    let t = task(Compressor::FedpmKlms, &adaptive, &UplinkState::default());
    let good = encode(&t, &trained(&t)).unwrap();
    let mut bad = good.clone();
    bad[..4].copy_from_slice(&1000u32.to_le_bytes());
    assert!(decode(&t, &bad).unwrap_err().to_string().contains("blocks"));
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

/// `block_scope = "client"`: each client gets back the ends it uploaded, not an aggregate; a
/// client whose KL report leaves the band, or whose drift ratio falls below
/// `recut_below_drift`, alone goes back to `UPDATE`.
#[test]
fn client_scoped_blocks_stay_with_their_client() {
    let config = CompressionConfig {
        block_scope: BlockScope::Client,
        rescale_drift: true,
        ..CompressionConfig::default()
    };
    let compressor = Compressor::SignsgdKlms;
    let mut state = UplinkState::default();
    let ends_of = |t: &TrainTask| match &t.uplink.klms.as_ref().unwrap().blocks {
        TaskBlocks::Adaptive { ends, .. } => ends.clone(),
        other => panic!("{other:?}"),
    };
    // Round 1: both clients cut their own blocks; client 2's update is scaled so that its
    // blocks differ from client 1's.
    let first: Vec<_> = [1u64, 2]
        .into_iter()
        .map(|c| {
            let t = task_in(compressor, &config, &state, COHORT, 1, c);
            assert_eq!(ends_of(&t), None);
            let mut out = trained(&t);
            if c == 2 {
                for x in out.dense.tensors[0].data.iter_mut().take(20) {
                    *x = 0.5 * *x + 0.5;
                }
            }
            let (_, side) = decode(&t, &encode(&t, &out).unwrap()).unwrap();
            (t, side)
        })
        .collect();
    let own: Vec<Vec<usize>> = first.iter().map(|(_, s)| s.ends.clone().unwrap()).collect();
    assert_ne!(own[0], own[1]);
    let pairs: Vec<_> = first.iter().map(|(t, s)| (t, s)).collect();
    state.observe(compressor, &config, &pairs).unwrap();
    assert!(state.ends.is_empty(), "no shared partition in client scope");
    // Round 2: each client's task carries its own ends; its payload reports KL against them.
    let second: Vec<_> = [1u64, 2]
        .into_iter()
        .map(|c| {
            let t = task_in(compressor, &config, &state, COHORT, 2, c);
            assert_eq!(ends_of(&t).as_ref(), Some(&own[c as usize - 1]));
            let (_, side) = decode(&t, &encode(&t, &trained(&t)).unwrap()).unwrap();
            assert!(side.ends.is_none() && side.mean_kl_bits.is_some());
            (t, side)
        })
        .collect();
    // Client 1 carried little of its drift, client 2 enough: only client 1 re-cuts.
    let low = UplinkSide {
        drift_ratio: Some(config.recut_below_drift - 0.01),
        mean_kl_bits: Some(f64::from(config.d_target)),
        ..second[0].1.clone()
    };
    let fine = UplinkSide {
        drift_ratio: Some(config.recut_below_drift + 0.01),
        mean_kl_bits: Some(f64::from(config.d_target)),
        ..second[1].1.clone()
    };
    state
        .observe(
            compressor,
            &config,
            &[(&second[0].0, &low), (&second[1].0, &fine)],
        )
        .unwrap();
    assert_eq!(
        ends_of(&task_in(compressor, &config, &state, COHORT, 3, 1)),
        None
    );
    assert_eq!(
        ends_of(&task_in(compressor, &config, &state, COHORT, 3, 2)).as_ref(),
        Some(&own[1])
    );
    // A KL report out of the band sends client 2 back too.
    let out_of_band = UplinkSide {
        mean_kl_bits: Some(0.01),
        ..fine
    };
    state
        .observe(compressor, &config, &[(&second[1].0, &out_of_band)])
        .unwrap();
    assert!(state.client_ends.is_empty());
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
    // The message's tensors: the dense one, then the U' and V' rows a holds.
    assert_eq!(next.prior_tensors, [40, 12, 18]);
    // Tensor frequencies over the global layout, `(N_t(s) + 1) / (N_t + 3)`: the dense tensor
    // has 40 (−1) and 40 (+1); U' (4 terms × 4 values) has 12 (+1) from a, 8 (−1) from b.
    let means = next.prior_means.expect("tensor frequencies");
    let expect = [
        [41.0 / 83.0, 1.0 / 83.0, 41.0 / 83.0],
        [9.0 / 23.0, 1.0 / 23.0, 13.0 / 23.0],
    ];
    for (got, want) in means.iter().zip(&expect) {
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{means:?}");
        }
    }
    // The counts, smoothed towards them, keep every symbol possible.
    let p =
        qsgd::global_distribution(&next.prior_tensors, &means, Some(&counts), 10.0, 70).unwrap();
    assert!(p.iter().flatten().all(|&x| x > 0.0));
    // U' value of term 0 (a's +1 only): (0 + 10·9/23, 0 + 10/23, 1 + 10·13/23) / 11.
    assert!((p[40][2] - (1.0 + 130.0 / 23.0) / 11.0).abs() < 1e-12);
}

/// docs/algorithms.md §4.7's update with one more value: `v = (.3, −.4, 0 | 1.2, 0)` in two tensors,
/// `‖v‖ = 1.3`.
fn qsgd_oracle_uplink(counts: Option<Vec<[u16; 3]>>, means: Option<Vec<[f64; 3]>>) -> Uplink {
    Uplink {
        compressor: Compressor::QsgdKlms,
        server_lr: 1.0,
        klms: Some(KlmsTask {
            candidates: 4,
            blocks: TaskBlocks::Fixed { size: 5 },
            selection: Selection::Importance,
        }),
        prior_counts: counts,
        prior_tensors: vec![3, 2],
        prior_means: means,
        prior_weight: 2.0,
        ..Uplink::default()
    }
}

const QSGD_ORACLE_V: [f32; 5] = [0.3, -0.4, 0.0, 1.2, 0.0];

fn assert_rows_close(got: &[[f64; 3]], want: &[[f64; 3]], tolerance: f64) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        for (a, b) in g.iter().zip(w) {
            assert!((a - b).abs() < tolerance, "{got:?} vs {want:?}");
        }
    }
}

#[test]
fn qsgd_prior_smooths_counts_towards_the_tensor_frequency() {
    // Two clients' counts; tensor frequencies by hand: tensor 0 has N = (1, 4, 1) → (2, 5, 2)/9,
    // tensor 1 has N = (0, 2, 2) → (1, 3, 3)/7. With β = 2, value 0 is
    // ((0, 2, 0) + 2 (2, 5, 2)/9) / 4 = (1, 7, 1)/9, and so on.
    let counts = vec![[0, 2, 0], [1, 1, 0], [0, 1, 1], [0, 2, 0], [0, 0, 2]];
    let means = qsgd::tensor_frequencies(&counts, &[0..3, 3..5]);
    assert_rows_close(
        &means,
        &[
            [2.0 / 9.0, 5.0 / 9.0, 2.0 / 9.0],
            [1.0 / 7.0, 3.0 / 7.0, 3.0 / 7.0],
        ],
        1e-12,
    );
    let uplink = qsgd_oracle_uplink(Some(counts), Some(means));
    let qsgd = Qsgd::<Trits>::NEW;
    let (header, q) = qsgd.message(&uplink, &[0.0; 5], &QSGD_ORACLE_V).unwrap();
    assert!((header.norm - 1.3).abs() < 1e-6);
    assert!(
        header.tensor_means.is_none(),
        "the server's frequencies: nothing to send"
    );
    let p = qsgd.prior(&uplink, &[0.0; 5], &header).unwrap();
    assert_rows_close(
        &q,
        &[
            [0.0, 0.769231, 0.230769],
            [0.307692, 0.692308, 0.0],
            [0.0, 1.0, 0.0],
            [0.0, 0.076923, 0.923077],
            [0.0, 1.0, 0.0],
        ],
        1e-6,
    );
    assert_rows_close(
        &p,
        &[
            [1.0 / 9.0, 7.0 / 9.0, 1.0 / 9.0],
            [13.0 / 36.0, 19.0 / 36.0, 4.0 / 36.0],
            [4.0 / 36.0, 19.0 / 36.0, 13.0 / 36.0],
            [1.0 / 14.0, 5.0 / 7.0, 3.0 / 14.0],
            [1.0 / 14.0, 3.0 / 14.0, 5.0 / 7.0],
        ],
        1e-12,
    );
    let kl = kl_bits_per_coordinate(
        &Categorical::new(&q).unwrap(),
        &Categorical::new(&p).unwrap(),
    )
    .unwrap();
    // Σ_v q(v) log2(q(v)/p(v)), by hand (python3, math.log2).
    for (g, w) in kl
        .iter()
        .zip([0.231071, 0.199964, 0.921997, 1.697536, 2.222392])
    {
        assert!((g - w).abs() < 1e-5, "{kl:?}");
    }
}

#[test]
fn qsgd_klms_sends_its_tensor_means_only_before_the_first_counts() {
    // Round 1: p is the client's own tensor means of q, (m₋, m₊) = (.4/3.9, .3/3.9) and
    // (0, 1.2/2.6), sent as 4 f32; the payload is the norm, the means and one 2-bit index
    // (one block of 5 values, K = 4): 32 + 128 + 2 = 162 bits, 21 bytes.
    let mut t = task(
        Compressor::QsgdKlms,
        &CompressionConfig::default(),
        &UplinkState::default(),
    );
    t.dense = ModelState::new(vec![
        NamedTensor::new("a", vec![3], vec![0.0; 3]).unwrap(),
        NamedTensor::new("b", vec![2], vec![0.0; 2]).unwrap(),
    ])
    .unwrap();
    t.shards.clear();
    t.uplink = qsgd_oracle_uplink(None, None);
    let qsgd = Qsgd::<Trits>::NEW;
    let (header, _) = qsgd.message(&t.uplink, &[0.0; 5], &QSGD_ORACLE_V).unwrap();
    let p = qsgd.prior(&t.uplink, &[0.0; 5], &header).unwrap();
    let own = header.tensor_means.expect("the client's own means");
    let want = [[0.4 / 3.9, 0.3 / 3.9], [0.0, 1.2 / 2.6]];
    for (g, w) in own.iter().flatten().zip(want.iter().flatten()) {
        assert!((f64::from(*g) - w).abs() < 1e-7, "{own:?}");
    }
    assert!((p[0][0] - 0.4 / 3.9).abs() < 1e-7 && (p[4][2] - 1.2 / 2.6).abs() < 1e-7);
    let mut out = TrainOutput {
        dense: t.dense.clone(),
        shards: Vec::new(),
        loss: 0.0,
        control: None,
    };
    out.dense.tensors[0].data = QSGD_ORACLE_V[..3].to_vec();
    out.dense.tensors[1].data = QSGD_ORACLE_V[3..].to_vec();
    let bytes = encode(&t, &out).unwrap();
    assert_eq!(bytes.len(), 162usize.div_ceil(8));
    decode(&t, &bytes).unwrap();
    // With the server's frequencies nothing is sent for p: 32 + 2 bits, 5 bytes.
    t.uplink = qsgd_oracle_uplink(
        Some(vec![[0, 2, 0]; 5]),
        Some(vec![[0.1, 0.8, 0.1], [0.1, 0.8, 0.1]]),
    );
    let bytes = encode(&t, &out).unwrap();
    assert_eq!(bytes.len(), 34usize.div_ceil(8));
    // With the drift ratio: 32 more bits.
    t.uplink.rescale_drift = true;
    let bytes = encode(&t, &out).unwrap();
    assert_eq!(bytes.len(), 66usize.div_ceil(8));
    let (_, side) = decode(&t, &bytes).unwrap();
    let rho = side.drift_ratio.expect("ρ");
    assert!(
        (DRIFT_RATIO_RANGE.0..=DRIFT_RATIO_RANGE.1).contains(&rho),
        "{rho}"
    );
}

#[test]
fn signsgd_distribution_matches_the_oracle() {
    // docs/algorithms.md §4.8: block v = (.01, −.02, .005, 0), M = .001.
    let sent = [0.0f32; 4];
    let out = [0.01f32, -0.02, 0.005, 0.0];
    let uplink = Uplink {
        compressor: Compressor::Signsgd,
        server_lr: 1.0,
        temperature_group: 4,
        temperature: Temperature::Group,
        ..Uplink::default()
    };
    let (_, q) = Signsgd.message(&uplink, &sent, &out).unwrap();
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
    assert!(
        err.to_string().contains("[0, 1]") && err.to_string().contains("1.5"),
        "{err}"
    );
}

/// `out = sent − μ`: the output of an SGLD client whose scaled gradient is `μ` at every value.
fn potential_step(task: &TrainTask, mu: f32) -> TrainOutput {
    let mut out = TrainOutput {
        dense: task.dense.clone(),
        shards: task.shards.clone(),
        loss: 0.0,
        control: None,
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
                let (_, _, decoded) = decode_symbols(&t, &bytes).unwrap();
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
    assert!(
        decode(&t, &longer)
            .unwrap_err()
            .to_string()
            .contains("trailing")
    );
    let mut nan = good.clone();
    nan[8..12].copy_from_slice(&f32::NAN.to_le_bytes());
    assert!(
        decode(&t, &nan)
            .unwrap_err()
            .to_string()
            .contains("SGLD value 2")
    );
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
            .to_string()
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
        round: 1,
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

/// The share of the expected drift that `n` clients' decoded values carry on average. Every
/// client holds the same 1 500 values and trains the same update `v` (a seeded ramp with random
/// signs, like a gradient), so the mean decoded move over clients estimates the expected one,
/// `η_S E_q[y]` (`η_S v` for QSGD). Also returns the mean reported `ρ`.
fn mean_drift_ratio(compressor: Compressor, config: &CompressionConfig, n: u64) -> (f64, f64) {
    const LEN: usize = 1500;
    let mut rng = stream(8, 0, 0, Purpose::TestSample);
    let v: Vec<f32> = (0..LEN)
        .map(|j| {
            let sign = if uniform(&mut rng) < 0.5 { -1.0 } else { 1.0 };
            sign * 0.01 * (1.0 + (j % 50) as f32) / 50.0
        })
        .collect();
    let state = UplinkState::default();
    let make = |client: u64| {
        let mut t = task_in(compressor, config, &state, COHORT, 1, client);
        t.dense = ModelState::new(vec![
            NamedTensor::new("w", vec![LEN], vec![0.5; LEN]).unwrap(),
        ])
        .unwrap();
        t.shards.clear();
        let cohort = Cohort { round: 1, ..COHORT };
        t.uplink = state.uplink(compressor, config, cohort, &t).unwrap();
        t
    };
    let v64: Vec<f64> = v.iter().map(|&x| f64::from(x)).collect();
    let target: Vec<f64> = match compressor.host() {
        Some(Host::Qsgd) => v64.clone(),
        _ => signsgd::sign_probabilities(&v64, config.temperature, 8, config.temperature_scale)
            .unwrap()
            .iter()
            .map(|r| r[2] - r[0])
            .collect(),
    };
    let mut moved = vec![0.0; LEN];
    let mut rho = 0.0;
    for client in 0..n {
        let t = make(client);
        let mut out = TrainOutput {
            dense: t.dense.clone(),
            shards: Vec::new(),
            loss: 0.0,
            control: None,
        };
        for (o, x) in out.dense.tensors[0].data.iter_mut().zip(&v) {
            *o += x;
        }
        let bytes = encode(&t, &out).unwrap();
        let (values, side) = decode(&t, &bytes).unwrap();
        rho += side.drift_ratio.unwrap_or(1.0) / n as f64;
        for (m, value) in moved.iter_mut().zip(&values) {
            *m += f64::from(value - 0.5) / config.server_lr / n as f64;
        }
    }
    let zero = vec![0.0; LEN];
    (
        fedshard_strategies::compression::drift_ratio(&moved, &target, &zero).unwrap(),
        rho,
    )
}

/// KLMS at K = 4 (`d_target = 2`) carries only part of the expected drift; with
/// `rescale_drift` the client's own ratio, sent as 32 bits, restores it. Monte Carlo over 1 000
/// clients of 1 500 values: the rescaled ratio must be within 0.04 of 1 (its standard error is
/// under 0.01 here), the plain one below 0.9 and within 0.04 of the mean reported `ρ` (the
/// encoder's own estimate of what it carries: exact given the candidates for importance
/// sampling, from 32 arrival sequences for ordered random coding, which must carry more).
#[test]
fn rescaling_restores_the_drift_klms_shrinks() {
    for compressor in [Compressor::SignsgdKlms, Compressor::QsgdKlms] {
        let mut carried = Vec::new();
        for selection in [Selection::Importance, Selection::Ordered] {
            let plain = CompressionConfig {
                selection,
                ..CompressionConfig::default()
            };
            let rescaled = CompressionConfig {
                rescale_drift: true,
                ..plain.clone()
            };
            let (without, _) = mean_drift_ratio(compressor, &plain, 1000);
            let (with, reported) = mean_drift_ratio(compressor, &rescaled, 1000);
            eprintln!(
                "{compressor} {selection:?}: drift ratio {without:.4}, mean reported ρ \
                 {reported:.4}, rescaled {with:.4}"
            );
            assert!(without < 0.9, "{compressor}: {without}");
            assert!(
                (without - reported).abs() < 0.04,
                "{compressor} {selection:?}: {reported}"
            );
            assert!(
                (with - 1.0).abs() < 0.04,
                "{compressor} {selection:?}: {with}"
            );
            carried.push(without);
        }
        assert!(carried[1] > carried[0] + 0.02, "{compressor}: {carried:?}");
    }
}

#[test]
fn a_drift_ratio_out_of_range_is_refused() {
    let config = CompressionConfig {
        rescale_drift: true,
        blocks: BlockMode::Fixed,
        candidates: Some(4),
        block_size: 70,
        ..CompressionConfig::default()
    };
    let t = task(Compressor::SignsgdKlms, &config, &UplinkState::default());
    let mut bytes = encode(&t, &trained(&t)).unwrap();
    // One 2-bit index, then ρ: bits 2..34.
    let mut w = BitWriter::new();
    w.bits(u32::from(bytes[0] & 0b11), 2);
    w.f32(0.01);
    bytes = w.finish();
    let err = decode(&t, &bytes).unwrap_err();
    assert!(err.to_string().contains("drift ratio 0.0099"), "{err}");
}

/// `report_drift` sends the same candidates plus the 32-bit ratio, which the server records and
/// does not apply: the decoded values are those of the plain payload, for every KLMS host
/// (FedPM included, which cannot rescale) and both selections.
#[test]
fn a_reported_drift_ratio_is_recorded_not_applied() {
    for selection in [Selection::Importance, Selection::Ordered] {
        let plain = CompressionConfig {
            selection,
            ..CompressionConfig::default()
        };
        let reporting = CompressionConfig {
            report_drift: true,
            ..plain.clone()
        };
        for compressor in Compressor::ALL.into_iter().filter(|c| c.klms()) {
            let t = task(compressor, &plain, &UplinkState::default());
            let r = task(compressor, &reporting, &UplinkState::default());
            assert!(r.uplink.report_drift && !r.uplink.rescale_drift);
            let out = trained(&t);
            let (plain_bytes, reported_bytes) =
                (encode(&t, &out).unwrap(), encode(&r, &out).unwrap());
            let (values, side) = decode(&t, &plain_bytes).unwrap();
            let (reported_values, reported_side) = decode(&r, &reported_bytes).unwrap();
            assert_eq!(values, reported_values, "{compressor} {selection:?}");
            assert_eq!(side.drift_ratio, None);
            let rho = reported_side.drift_ratio.expect("ρ");
            assert!(rho > 0.0 && rho <= 1.0, "{compressor} {selection:?}: {rho}");
            // The ratio is one f32 after the indices: the payload grows by 32 bits, 4 bytes.
            assert_eq!(reported_bytes.len(), plain_bytes.len() + 4, "{compressor}");
        }
    }
}

/// Fixed blocks without a `candidates` setting follow the reference's K schedule (8 in the first
/// rounds, then down to 2) over the cohort's round, not over the task's own `round`, which in
/// async mode counts every task handed out: task 50 building version 2 still gets the warm-up K.
#[test]
fn the_k_schedule_follows_the_cohorts_round_not_the_tasks_number() {
    let config = CompressionConfig {
        blocks: BlockMode::Fixed,
        ..CompressionConfig::default()
    };
    let state = UplinkState::default();
    let t = task_in(Compressor::SignsgdKlms, &config, &state, COHORT, 50, 11);
    let k = |round: u64| {
        state
            .uplink(
                Compressor::SignsgdKlms,
                &config,
                Cohort { round, ..COHORT },
                &t,
            )
            .unwrap()
            .klms
            .expect("KLMS settings")
            .candidates
    };
    assert_eq!((k(2), k(7), k(9), k(50)), (8, 5, 3, 2));
}
