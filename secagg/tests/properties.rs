//! The protocol's guarantees as properties: masks cancel exactly with and without dropouts,
//! too many dropouts give a typed error, a masked vector looks uniform, fixed point decodes
//! within its bound, the same seeds give the same transcript, and frames are bounded.

// Only the clients and their inboxes are used here; the protocol tests use the server too.
#[allow(dead_code)]
mod common;

use std::collections::BTreeSet;

use fedshard_secagg::message::{ClientBody, Header, ServerBody};
use fedshard_secagg::packing;
use fedshard_secagg::{
    ClientId, ClientMessage, Dropouts, Error, FixedPoint, Graph, Params, Round, SessionId,
    simulate, wire,
};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

fn params(n: u32, threshold: usize, graph: Graph, bits: u32, vector_len: usize) -> Params {
    Params {
        session: SessionId([0x5A; 16]),
        clients: (0..n).map(|i| 3 * i + 1).collect(),
        threshold,
        graph,
        bits,
        vector_len,
    }
}

/// A threshold more than half of `holders` (what [`Params::validate`] asks), spread over the
/// range by `fraction` in `[0, 1)`.
fn majority(fraction: f64, holders: usize) -> usize {
    let least = holders / 2 + 1;
    least + (fraction * (holders + 1 - least) as f64) as usize
}

fn random_inputs(p: &Params, rng: &mut ChaCha20Rng) -> Vec<Vec<u64>> {
    let mask = p.modulus_mask();
    p.clients
        .iter()
        .map(|_| (0..p.vector_len).map(|_| rng.next_u64() & mask).collect())
        .collect()
}

/// The oracle: `Σ_{u ∈ survivors} x_u mod 2^bits`, computed in the clear.
fn plain_sum(p: &Params, inputs: &[Vec<u64>], survivors: &BTreeSet<ClientId>) -> Vec<u64> {
    let mut sum = vec![0u64; p.vector_len];
    for (id, x) in p.clients.iter().zip(inputs) {
        if survivors.contains(id) {
            sum.iter_mut()
                .zip(x)
                .for_each(|(s, v)| *s = s.wrapping_add(*v));
        }
    }
    sum.iter().map(|s| s & p.modulus_mask()).collect()
}

/// The clients picked by the bits of `pick`, at most `most` of them.
fn pick_clients(p: &Params, pick: u32, most: usize) -> BTreeSet<ClientId> {
    p.clients
        .iter()
        .enumerate()
        .filter(|(i, _)| pick >> i & 1 == 1)
        .map(|(_, &c)| c)
        .take(most)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// SecAgg (complete graph): with any n − t or fewer clients dropping before their masked
    /// input, the unmasked sum is the plain sum of the survivors' inputs, bit for bit.
    #[test]
    fn masks_cancel_exactly_with_up_to_n_minus_t_dropouts(
        n in 1u32..=7,
        t_frac in 0.0f64..1.0,
        pick in any::<u32>(),
        len in 1usize..=12,
        bits in prop::sample::select(vec![1u32, 7, 32, 61, 64]),
        seed in any::<u64>(),
    ) {
        let t = majority(t_frac, n as usize);
        let p = params(n, t, Graph::Complete, bits, len);
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let inputs = random_inputs(&p, &mut rng);
        let dropped = pick_clients(&p, pick, n as usize - t);
        let survivors: BTreeSet<ClientId> = p.clients.iter().copied().filter(|c| !dropped.contains(c)).collect();
        let run = simulate(&p, &inputs, &Dropouts::at_masked_input(dropped.clone()), &mut rng).unwrap();
        prop_assert_eq!(run.aggregate.sum, plain_sum(&p, &inputs, &survivors));
        prop_assert_eq!(run.aggregate.survivors, survivors.into_iter().collect::<Vec<_>>());
        prop_assert_eq!(run.aggregate.dropped, dropped.into_iter().collect::<Vec<_>>());
        prop_assert!(run.aborted.is_empty());
    }

    /// SecAgg (complete graph): more than n − t dropouts is a typed error, never a sum.
    #[test]
    fn too_many_dropouts_is_an_error(n in 2u32..=7, t_frac in 0.0f64..1.0, seed in any::<u64>()) {
        let t = majority(t_frac, n as usize);
        let p = params(n, t, Graph::Complete, 16, 3);
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let inputs = random_inputs(&p, &mut rng);
        let dropped = p.clients.iter().copied().take(n as usize - t + 1);
        let run = simulate(&p, &inputs, &Dropouts::at_masked_input(dropped), &mut rng);
        prop_assert_eq!(
            run.map(|r| r.aggregate),
            Err(Error::TooFewClients { round: Round::MaskedInput, needed: t, got: t - 1 })
        );
    }

    /// SecAgg+ (random k-regular graph): without dropouts the sum is exact; with dropouts it is
    /// exact or a typed error (a neighbourhood left with fewer than t holders), never wrong.
    #[test]
    fn sparse_graph_sums_are_exact_or_refused(
        n in 4u32..=12,
        half_degree in 1usize..=2,
        t_frac in 0.0f64..1.0,
        pick in any::<u32>(),
        drop_some in any::<bool>(),
        graph_seed in any::<u64>(),
        seed in any::<u64>(),
    ) {
        let degree = 2 * half_degree;
        let holders = (degree + 1).min(n as usize);
        let t = majority(t_frac, holders);
        let graph = Graph::RandomRegular { degree, seed: graph_seed };
        let p = params(n, t, graph, 20, 5);
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let inputs = random_inputs(&p, &mut rng);
        let dropped = if drop_some { pick_clients(&p, pick, n as usize - t) } else { BTreeSet::new() };
        let survivors: BTreeSet<ClientId> = p.clients.iter().copied().filter(|c| !dropped.contains(c)).collect();
        match simulate(&p, &inputs, &Dropouts::at_masked_input(dropped.clone()), &mut rng) {
            Ok(run) => prop_assert_eq!(run.aggregate.sum, plain_sum(&p, &inputs, &survivors)),
            Err(error) => {
                prop_assert!(!dropped.is_empty(), "no dropouts must finish: {error}");
                prop_assert!(
                    matches!(error, Error::TooFewShares { .. } | Error::TooFewClients { .. }),
                    "{error}"
                );
            }
        }
    }

    /// SecAgg with clients dropping in any round (before sharing keys, before the masked input,
    /// before unmasking): the sum over the survivors when every round kept t clients, else the
    /// typed error of the first round that fell short.
    #[test]
    fn dropouts_in_any_round_give_the_sum_or_a_typed_error(
        n in 2u32..=7,
        t_frac in 0.0f64..1.0,
        phase_of in prop::collection::vec(0u8..4, 7),
        seed in any::<u64>(),
    ) {
        let t = majority(t_frac, n as usize);
        let p = params(n, t, Graph::Complete, 12, 3);
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let inputs = random_inputs(&p, &mut rng);
        // phase 0: stays; 1, 2, 3: drops before rounds 1, 2, 3.
        let in_phase = |k: u8| -> BTreeSet<ClientId> {
            p.clients.iter().zip(&phase_of).filter(|(_, ph)| **ph == k).map(|(c, _)| *c).collect()
        };
        let dropouts = Dropouts::none()
            .before(Round::ShareKeys, in_phase(1))
            .before(Round::MaskedInput, in_phase(2))
            .before(Round::Unmask, in_phase(3));
        let shared = n as usize - in_phase(1).len();
        let survived = shared - in_phase(2).len();
        let answered = survived - in_phase(3).len();
        let survivors: BTreeSet<ClientId> = p
            .clients
            .iter()
            .copied()
            .filter(|c| !in_phase(1).contains(c) && !in_phase(2).contains(c))
            .collect();
        let expected = if shared < t {
            Err(Error::TooFewClients { round: Round::ShareKeys, needed: t, got: shared })
        } else if survived < t {
            Err(Error::TooFewClients { round: Round::MaskedInput, needed: t, got: survived })
        } else if answered < t {
            Err(Error::TooFewClients { round: Round::Unmask, needed: t, got: answered })
        } else {
            Ok(plain_sum(&p, &inputs, &survivors))
        };
        let run = simulate(&p, &inputs, &dropouts, &mut rng);
        prop_assert_eq!(run.map(|r| r.aggregate.sum), expected);
    }

    /// Fixed point: the decoded sum of n encodings is within `error_bound(n)` of the sum of the
    /// clipped values (deterministic rounding: at most half a step per client).
    #[test]
    fn fixed_point_round_trip_is_within_its_bound(
        values in prop::collection::vec(prop::collection::vec(-3.0f32..3.0, 6), 1..=6),
        range in 0.5f64..2.0,
        scale in prop::sample::select(vec![1.0f64, 10.0, 1000.0, 1_048_576.0]),
    ) {
        let code = FixedPoint::new(range, scale).unwrap();
        let n = values.len();
        let bits = code.bits_for(n).unwrap();
        let modulus = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
        let mut sum = vec![0u64; 6];
        for x in &values {
            for (s, e) in sum.iter_mut().zip(code.encode(x).unwrap()) {
                *s = s.wrapping_add(e) & modulus;
            }
        }
        let decoded = code.decode_sum(&sum, n);
        for (j, d) in decoded.iter().enumerate() {
            let exact: f64 = values.iter().map(|x| f64::from(x[j]).clamp(-range, range)).sum();
            prop_assert!((d - exact).abs() <= code.error_bound(n), "coordinate {j}: {d} vs {exact}");
        }
    }
}

#[test]
fn dropouts_in_every_round_leave_the_survivors_sum() {
    // 25 never advertises keys, 1 never shares keys (no masks with it at all), 7 shares then
    // drops (its pair masks are removed with its rebuilt key), 13 sends its input then never
    // unmasks (its input counts); t = 5 of 9, and 5 are left to unmask.
    let p = params(9, 5, Graph::Complete, 32, 8);
    let mut rng = ChaCha20Rng::seed_from_u64(11);
    let inputs = random_inputs(&p, &mut rng);
    let dropouts = Dropouts::none()
        .before(Round::AdvertiseKeys, [25])
        .before(Round::ShareKeys, [1])
        .before(Round::MaskedInput, [7])
        .before(Round::Unmask, [13]);
    let run = simulate(&p, &inputs, &dropouts, &mut rng).unwrap();
    let survivors = BTreeSet::from([4, 10, 13, 16, 19, 22]);
    assert_eq!(run.aggregate.sum, plain_sum(&p, &inputs, &survivors));
    assert_eq!(run.aggregate.dropped, vec![7]);
}

#[test]
fn fixed_point_through_secure_aggregation() {
    // Dense f32 updates: encode, aggregate securely, decode; within n / (2 · scale).
    let code = FixedPoint::new(1.0, 65_536.0).unwrap();
    let n = 5;
    let bits = code.bits_for(n).unwrap();
    let p = params(n as u32, 3, Graph::Complete, bits, 64);
    let mut rng = ChaCha20Rng::seed_from_u64(12);
    let updates: Vec<Vec<f32>> = (0..n)
        .map(|_| {
            (0..64)
                .map(|_| (rng.next_u32() as f32 / u32::MAX as f32) * 2.4 - 1.2)
                .collect()
        })
        .collect();
    let inputs: Vec<Vec<u64>> = updates.iter().map(|u| code.encode(u).unwrap()).collect();
    let run = simulate(&p, &inputs, &Dropouts::none(), &mut rng).unwrap();
    let decoded = code.decode_sum(&run.aggregate.sum, n);
    for (j, d) in decoded.iter().enumerate() {
        let exact: f64 = updates
            .iter()
            .map(|u| f64::from(u[j]).clamp(-1.0, 1.0))
            .sum();
        assert!(
            (d - exact).abs() <= code.error_bound(n),
            "coordinate {j}: {d} vs {exact}"
        );
    }
}

#[test]
fn same_seeds_give_the_same_transcript() {
    let p = params(5, 2, Graph::RandomRegular { degree: 2, seed: 9 }, 24, 16);
    let inputs = random_inputs(&p, &mut ChaCha20Rng::seed_from_u64(1));
    let dropouts = Dropouts::at_masked_input([4]);
    let run = |seed| {
        simulate(
            &p,
            &inputs,
            &dropouts,
            &mut ChaCha20Rng::seed_from_u64(seed),
        )
        .unwrap()
    };
    let (a, b, c) = (run(2), run(2), run(3));
    assert_eq!(a.transcript, b.transcript);
    assert_eq!(a.aggregate, b.aggregate);
    assert_ne!(
        a.transcript, c.transcript,
        "other secrets, other transcript"
    );
    assert_eq!(a.aggregate, c.aggregate, "but the same sum");
}

/// Client 0's masked input of an all-zero vector, with its secrets drawn from `seed`.
fn masked_zero_vector(p: &Params, seed: u8) -> Vec<u64> {
    let mut s = common::up_to_round_2(p, |id| [seed ^ id as u8; 32]);
    let zero = vec![0u64; p.vector_len];
    match s.clients[0]
        .masked_input(&s.inboxes[0].1, &zero)
        .unwrap()
        .body
    {
        ClientBody::MaskedInput(y) => packing::unpack(&y, p.bits, p.vector_len).unwrap(),
        other => panic!("expected a masked input, got {other:?}"),
    }
}

#[test]
fn a_masked_vector_is_indistinguishable_from_uniform() {
    // y_0 for x_0 = 0 in Z_256, 25 600 coordinates, 256 buckets of expected count 100:
    // Pearson's χ² with 255 degrees of freedom stays below 330.5, its 0.999 quantile, so a
    // uniform vector fails this test with probability 0.001 (fixed seeds: it either always
    // passes or always fails).
    let p = params(3, 2, Graph::Complete, 8, 25_600);
    let y = masked_zero_vector(&p, 1);
    let mut counts = [0u64; 256];
    y.iter().for_each(|&v| counts[v as usize] += 1);
    let expected = y.len() as f64 / 256.0;
    let chi2: f64 = counts
        .iter()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum();
    println!("χ² = {chi2:.1} over 255 degrees of freedom");
    assert!(chi2 < 330.5, "χ² = {chi2}");
    // Another run (other secrets) masks the same input differently: equal coordinates occur
    // at the rate 1/256 of two independent uniform vectors, about 100 of them, far from all.
    let other = masked_zero_vector(&p, 2);
    let equal = y.iter().zip(&other).filter(|(a, b)| a == b).count();
    assert!(equal < 200, "{equal} equal coordinates");
}

#[test]
fn frames_beyond_the_session_limit_or_with_huge_claims_are_refused() {
    let p = params(3, 2, Graph::Complete, 16, 4);
    let limit = p.max_frame_bytes();
    assert!(matches!(
        wire::decode_client_message(&vec![0u8; limit + 1], &p),
        Err(Error::FrameTooLarge { .. })
    ));
    // A masked-input frame whose vector claims 2⁴⁰ values in a few bytes: refused when the
    // bytes run out, without allocating the claim.
    let honest = ClientMessage {
        header: Header {
            session: p.session,
            round: Round::MaskedInput,
            sender: 1,
        },
        body: ClientBody::MaskedInput(vec![]),
    };
    let mut bytes = wire::encode(&honest);
    bytes.pop(); // the empty vector's length, 0
    bytes.push(253);
    bytes.extend_from_slice(&(1u64 << 40).to_le_bytes());
    bytes.extend_from_slice(&[1, 2, 3]);
    assert!(matches!(
        wire::decode_client_message(&bytes, &p),
        Err(Error::Decode(_))
    ));
    // Trailing bytes after an honest message are refused too.
    let mut trailing = wire::encode(&honest);
    trailing.push(0);
    assert!(matches!(
        wire::decode_client_message(&trailing, &p),
        Err(Error::Decode(_))
    ));
    // And a server frame decodes back to itself.
    let request = fedshard_secagg::ServerMessage {
        session: p.session,
        round: Round::Unmask,
        body: ServerBody::UnmaskRequest {
            survivors: vec![1, 4],
            dropped: vec![7],
        },
    };
    assert_eq!(
        wire::decode_server_message(&wire::encode(&request), &p),
        Ok(request)
    );
}
