//! The robust aggregators against Flower 1.42 and against the properties they exist for.
//!
//! Oracle: the constants below are printed by `scripts/flower_robust.py`, which runs Flower's
//! own `aggregate_median`, `aggregate_trimmed_avg`, `aggregate_krum` and `aggregate_bulyan` on
//! the weights `W + ΔW_c` (each comment is the exact call); fedshard folds the changes `ΔW_c`
//! into `W` through [`Aggregator::aggregate_changes`] and must land within 1e-6 of Flower's
//! weights (the model is f32: half an ulp at |w| < 8 is 2.4e-7). The two tensors of the model
//! (3 values and 2×2) are flattened one after the other.

use super::super::{
    Aggregator, AggregatorName, ChangeRound, Contribution, Fit, FitRound, RoundOutcome, SumRound,
    SummedBlock, WeightChange,
};
use super::{AggregatorSpec, Bulyan, Krum, Median, TrimFraction, TrimmedMean};
use crate::{Result, StrategyError};
use std::num::NonZeroUsize;

#[rustfmt::skip]
mod flower {
    // flwr 1.42.0, numpy 2.4.6
    // case SEVEN: seed 59, 7 clients, outlier 4
    pub const SEVEN_GLOBAL: [f64; 7] = [1.75, -1.375, 1.5, -1.625, 0.25, -0.875, -1.0];
    pub const SEVEN_SAMPLES: [f64; 7] = [19.0, 8.0, 30.0, 20.0, 30.0, 39.0, 21.0];
    pub const SEVEN_CHANGES: [[f64; 7]; 7] = [
        [-0.7254826077304516, 0.1656693247366784, 0.6308519606346558, 0.7339027561419005, -0.8520579254164493, -0.7783457089740166, -0.7699235330943098],
        [-0.1442113052625182, -0.5046677369111556, -0.03529942490146884, 0.398752589616036, -0.25225124077951355, -0.25521622220404083, -0.11201327068217144],
        [-0.3794966826790477, 0.42245444746711147, -0.05526482490185266, -1.0517744543473946, -0.1730234829302756, -0.7296147520293225, 0.17312503094538934],
        [0.05413599686111588, -0.941508931058809, -0.9358386738242119, 0.349710602586756, 0.11871044973427308, 0.7596271047551113, 1.2012278245466685],
        [39.446550692563456, 39.91297972096929, 40.0908623655109, 40.287020376948355, 39.96726935242237, 40.314651765654204, 40.76920286602968],
        [-0.7417871454367948, 0.5700589017944382, 0.3718900244896905, -0.5602006228103502, -0.5160127322746054, -0.32172321475321497, -0.4477673151443436],
        [0.23402896968398812, 0.11040732923352808, 0.6413620640381079, -0.5088993169131896, -0.202034298178737, 0.06205855364351585, -0.29929799973382],
    ];
    // aggregate_median(results)
    pub const SEVEN_MEDIAN: [f64; 7] = [1.6057886947374818, -1.2093306752633217, 1.8718900244896906, -1.275289397413244, 0.047965701821263, -1.1302162222040408, -1.1120132706821715];
    // aggregate_trimmed_avg(results, proportiontocut=0.0)
    pub const SEVEN_TRIMMED_0: [f64; 7] = [7.1419625597142495, 4.301484722318726, 7.315509070149403, 4.039073133031731, 5.691514303225295, 4.703776789441748, 4.7877933718381565];
    // aggregate_trimmed_avg(results, proportiontocut=0.2)
    pub const SEVEN_TRIMMED_2: [f64; 7] = [1.5577948741746173, -1.22221554673588, 1.8107079598718265, -1.5423467982757695, 0.0450777391142283, -0.9719737061175902, -0.8969451460136554];
    // aggregate_trimmed_avg(results, proportiontocut=0.3)
    pub const SEVEN_TRIMMED_3: [f64; 7] = [1.5934760029731834, -1.142156299520894, 1.822480853407626, -1.5451453749034656, 0.04089699270382461, -1.04662696110458, -1.0793954131568675];
    // aggregate_krum(results, num_malicious=1, to_keep=0)
    pub const SEVEN_KRUM_F1_KEEP0: [f64; 7] = [1.0082128545632052, -0.8049410982055618, 1.8718900244896906, -2.18520062281035, -0.2660127322746054, -1.196723214753215, -1.4477673151443435];
    // aggregate_krum(results, num_malicious=1, to_keep=3)
    pub const SEVEN_KRUM_F1_KEEP3: [f64; 7] = [1.3798708713121854, -1.073330747226501, 1.9072046897159771, -2.0565395474684167, -0.13801804039263524, -1.0703780224484394, -1.362416021330838];
    // aggregate_krum(results, num_malicious=0, to_keep=2)
    pub const SEVEN_KRUM_F0_KEEP2: [f64; 7] = [1.8796868248711585, -1.4342685510822468, 1.954696825709949, -1.883512584077541, 0.03411275213829016, -0.9004655224523619, -1.2476332468919857];
    // aggregate_bulyan(results, num_malicious=1, aggregation_rule=aggregate_krum, to_keep=0)
    pub const SEVEN_BULYAN_F1: [f64; 7] = [1.3336031347759942, -1.142156299520894, 2.0480346830541514, -2.331958131356978, 0.04089699270382461, -1.04662696110458, -1.2863595285201117];
    // aggregate_bulyan(results, num_malicious=0, aggregation_rule=aggregate_krum, to_keep=0)
    pub const SEVEN_BULYAN_F0: [f64; 7] = [7.1419625597142495, 4.301484722318726, 7.315509070149403, 4.039073133031731, 5.691514303225295, 4.703776789441748, 4.7877933718381565];

    // case SIX: seed 60, 6 clients, outlier 1
    pub const SIX_GLOBAL: [f64; 7] = [-0.75, -1.25, -0.75, 0.625, 0.25, -0.375, -0.5];
    pub const SIX_SAMPLES: [f64; 6] = [16.0, 29.0, 14.0, 33.0, 13.0, 31.0];
    pub const SIX_CHANGES: [[f64; 7]; 6] = [
        [0.18617050716478595, -0.36441050960001115, -0.17937354280192144, 0.4130604595375845, -0.9227852563163695, 0.0014264178209386952, 0.005693445605138092],
        [39.23720961139539, 40.69051530687214, 40.69247778602963, 40.07547079749921, 39.61115570965116, 39.75030851862484, 40.409181336091244],
        [0.01353966287964149, 0.1399927698940224, -0.05822681967713772, 0.1861250851445942, 0.15366552001134473, 0.005424682137288299, 1.0049769390644678],
        [-0.3514062735694291, -0.4995995057210716, 0.430927345111287, -1.2204095591416553, 0.6135988872513694, 0.7940461752204067, -0.00031071077571311425],
        [-0.46559767473995434, -0.2431787061398617, 0.7648535541414568, 0.6473365610312388, -0.23150613519612476, 0.02600173187234532, -0.04537153054240087],
        [-0.5766421384250668, 0.5779551875571346, 0.5588247706282644, 0.15290831877129898, -1.2278888862129669, -0.09635637781920055, 0.3575324845492608],
    ];
    // aggregate_median(results)
    pub const SIX_MEDIAN: [f64; 7] = [-0.9189333053448938, -1.3015929681229195, -0.25512394213022427, 0.9245927723410894, 0.21107969240761, -0.3592867929951832, -0.31838703492280057];
    // aggregate_trimmed_avg(results, proportiontocut=0.0)
    pub const SIX_TRIMMED_0: [f64; 7] = [5.590545615784229, 5.46687909047706, 6.284913848905263, 7.334081943807045, 6.582706639864735, 6.37180852464277, 6.455283660665333];
    // aggregate_trimmed_avg(results, proportiontocut=0.2)
    pub const SIX_TRIMMED_2: [f64; 7] = [-0.904323444566239, -1.222410314572179, -0.32590528744903235, 0.9748576061211792, 0.15324325393755495, -0.16827524823725526, -0.1580269603892116];
    // aggregate_trimmed_avg(results, proportiontocut=0.3)
    pub const SIX_TRIMMED_3: [f64; 7] = [-0.904323444566239, -1.222410314572179, -0.32590528744903235, 0.9748576061211792, 0.15324325393755495, -0.16827524823725526, -0.1580269603892116];
    // aggregate_krum(results, num_malicious=1, to_keep=0)
    pub const SIX_KRUM_F1_KEEP0: [f64; 7] = [-1.2155976747399544, -1.4931787061398616, 0.014853554141456837, 1.272336561031239, 0.018493864803875243, -0.34899826812765466, -0.5453715305424008];
    // aggregate_krum(results, num_malicious=1, to_keep=3)
    pub const SIX_KRUM_F1_KEEP3: [f64; 7] = [-1.0991657991359984, -1.10125467531912, -0.3433885431919268, 0.9544083421319621, -0.6806449888535585, -0.4187700418819952, -0.3235871291056986];
    // aggregate_krum(results, num_malicious=0, to_keep=2)
    pub const SIX_KRUM_F0_KEEP2: [f64; 7] = [-0.9671560922705343, -1.294497200048218, -0.4119288619126292, 1.0331898698307564, 0.21821250083737792, -0.35966784947175834, -0.0007463981536541408];
    // aggregate_bulyan(results, num_malicious=0, aggregation_rule=aggregate_krum, to_keep=0)
    pub const SIX_BULYAN_F0: [f64; 7] = [5.590545615784229, 5.46687909047706, 6.284913848905263, 7.334081943807045, 6.582706639864735, 6.37180852464277, 6.455283660665333];
}
use flower::*;

/// A change that adds `scale` × fixed values, laid over the blocks in order.
struct Fixed(Vec<f64>);

impl WeightChange for Fixed {
    fn add_scaled(&self, change: &mut [Vec<f64>], scale: f64) -> Result<()> {
        let mut values = self.0.iter();
        for block in change.iter_mut() {
            for (c, v) in block.iter_mut().zip(values.by_ref()) {
                *c += scale * v;
            }
        }
        Ok(())
    }
}

/// One round: the changes of clients `clients[i]` with samples and staleness scales, folded by
/// `aggregator` into a model of blocks of `shape` values starting at `global`. Returns what
/// the aggregator said and the model after it, flattened.
struct Round<'a> {
    global: &'a [f64],
    shape: &'a [usize],
    clients: Vec<u64>,
    changes: Vec<Vec<f64>>,
    samples: Vec<f64>,
    scales: Vec<f64>,
}

impl<'a> Round<'a> {
    /// Clients 0, 1, …, n − 1 in that order, every scale 1 (a synchronous round).
    fn new(global: &'a [f64], shape: &'a [usize], changes: &[[f64; 7]], samples: &[f64]) -> Self {
        Self {
            global,
            shape,
            clients: (0..changes.len() as u64).collect(),
            changes: changes.iter().map(|c| c[..global.len()].to_vec()).collect(),
            samples: samples.to_vec(),
            scales: vec![1.0; changes.len()],
        }
    }

    /// The same round with its results listed in `order` (each client keeps its change).
    fn permuted(&self, order: &[usize]) -> Self {
        Self {
            global: self.global,
            shape: self.shape,
            clients: order.iter().map(|&i| self.clients[i]).collect(),
            changes: order.iter().map(|&i| self.changes[i].clone()).collect(),
            samples: order.iter().map(|&i| self.samples[i]).collect(),
            scales: order.iter().map(|&i| self.scales[i]).collect(),
        }
    }

    fn fold(&self, aggregator: &dyn Aggregator) -> (Result<Fit>, Vec<f32>) {
        let results: Vec<Contribution> = self
            .clients
            .iter()
            .zip(&self.samples)
            .map(|(&client, &samples)| Contribution {
                client,
                samples,
                inclusion_probability: 1.0,
            })
            .collect();
        let fixed: Vec<Fixed> = self.changes.iter().map(|c| Fixed(c.clone())).collect();
        let changes: Vec<&dyn WeightChange> =
            fixed.iter().map(|c| c as &dyn WeightChange).collect();
        let round = ChangeRound {
            outcome: RoundOutcome {
                results: &results,
                failures: &[],
                population_samples: self.samples.iter().sum(),
            },
            scales: &self.scales,
            changes: &changes,
        };
        let mut model: Vec<f32> = self.global.iter().map(|&w| w as f32).collect();
        let mut blocks: Vec<&mut [f32]> = Vec::new();
        let mut rest = &mut model[..];
        for &len in self.shape {
            let (block, tail) = rest.split_at_mut(len);
            blocks.push(block);
            rest = tail;
        }
        let fit = aggregator.aggregate_changes(&mut blocks, &round);
        (fit, model)
    }

    /// The model after a fold that must move it.
    fn folded(&self, aggregator: &dyn Aggregator) -> Vec<f32> {
        let (fit, model) = self.fold(aggregator);
        assert_eq!(fit.unwrap(), Fit::Updated, "{aggregator:?}");
        model
    }
}

const SHAPE: [usize; 2] = [3, 4];

fn trimmed(beta: f64) -> TrimmedMean {
    TrimmedMean {
        beta: TrimFraction::new(beta).unwrap(),
    }
}

fn krum(f: usize, m: usize) -> Krum {
    Krum {
        f,
        m: NonZeroUsize::new(m).unwrap(),
    }
}

fn assert_close(got: &[f32], flower: &[f64], what: &str) {
    assert_eq!(got.len(), flower.len());
    for (k, (&g, &want)) in got.iter().zip(flower).enumerate() {
        let error = (f64::from(g) - want).abs();
        assert!(
            error <= 1e-6,
            "{what}[{k}]: fedshard {g}, Flower {want}, error {error:e}"
        );
    }
}

/// Each aggregator on seven clients (client 4 the +40 outlier) and on six (client 1), against
/// Flower's output on the same weights. Flower's `to_keep = 0` (Krum) is m = 1 here; its
/// Bulyan takes `aggregate_krum` with `to_keep = 0` as its first rule.
#[test]
fn every_robust_aggregator_matches_flower() {
    let seven = Round::new(&SEVEN_GLOBAL, &SHAPE, &SEVEN_CHANGES, &SEVEN_SAMPLES);
    let six = Round::new(&SIX_GLOBAL, &SHAPE, &SIX_CHANGES, &SIX_SAMPLES);
    let cases: [(&Round, &dyn Aggregator, &[f64; 7], &str); 17] = [
        (&seven, &Median, &SEVEN_MEDIAN, "seven median"),
        (&seven, &trimmed(0.0), &SEVEN_TRIMMED_0, "seven trimmed 0"),
        (&seven, &trimmed(0.2), &SEVEN_TRIMMED_2, "seven trimmed 0.2"),
        (&seven, &trimmed(0.3), &SEVEN_TRIMMED_3, "seven trimmed 0.3"),
        (&seven, &krum(1, 1), &SEVEN_KRUM_F1_KEEP0, "seven krum f1"),
        (
            &seven,
            &krum(1, 3),
            &SEVEN_KRUM_F1_KEEP3,
            "seven multi-krum f1 m3",
        ),
        (
            &seven,
            &krum(0, 2),
            &SEVEN_KRUM_F0_KEEP2,
            "seven multi-krum f0 m2",
        ),
        (
            &seven,
            &Bulyan { f: 1 },
            &SEVEN_BULYAN_F1,
            "seven bulyan f1",
        ),
        (
            &seven,
            &Bulyan { f: 0 },
            &SEVEN_BULYAN_F0,
            "seven bulyan f0",
        ),
        (&six, &Median, &SIX_MEDIAN, "six median"),
        (&six, &trimmed(0.0), &SIX_TRIMMED_0, "six trimmed 0"),
        (&six, &trimmed(0.2), &SIX_TRIMMED_2, "six trimmed 0.2"),
        (&six, &trimmed(0.3), &SIX_TRIMMED_3, "six trimmed 0.3"),
        (&six, &krum(1, 1), &SIX_KRUM_F1_KEEP0, "six krum f1"),
        (
            &six,
            &krum(1, 3),
            &SIX_KRUM_F1_KEEP3,
            "six multi-krum f1 m3",
        ),
        (
            &six,
            &krum(0, 2),
            &SIX_KRUM_F0_KEEP2,
            "six multi-krum f0 m2",
        ),
        (&six, &Bulyan { f: 0 }, &SIX_BULYAN_F0, "six bulyan f0"),
    ];
    for (round, aggregator, flower, what) in cases {
        assert_close(&round.folded(aggregator), flower, what);
    }
}

/// Krum's scores tie: 1-value changes −2, −1, 1, 2, 10 with f = 1 (two nearest): −1 and 1
/// both score 1 + 4 = 5. Flower's `np.argmin` keeps the first in its list
/// (`aggregate_krum([-2, -1, 1, 2, 10], 1, 0)` = −1, `aggregate_krum([-2, 1, -1, 2, 10], 1, 0)`
/// = 1, printed by the script); fedshard's list is in client-id order whatever the arrival
/// order, so client 1's −1 wins in every permutation, as Flower picks on the sorted list.
#[test]
fn krum_ties_go_to_the_lower_client_id() {
    let changes = [-2.0, -1.0, 1.0, 2.0, 10.0].map(|v| [v, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    let round = Round::new(&[0.0], &[1], &changes, &[1.0; 5]);
    for order in [[0, 1, 2, 3, 4], [0, 2, 1, 3, 4], [4, 3, 2, 1, 0]] {
        assert_eq!(
            round.permuted(&order).folded(&krum(1, 1)),
            [-1.0],
            "{order:?}"
        );
    }
    // Tied clients swap ids: now 1 is the lower id's.
    let swapped = Round {
        clients: vec![0, 2, 1, 3, 4],
        ..Round::new(&[0.0], &[1], &changes, &[1.0; 5])
    };
    assert_eq!(swapped.folded(&krum(1, 1)), [1.0]);
}

/// The outlier's size does not matter: with the +40 client of the seven moved to 100, 1e6 or
/// 1e30 on every value, the median, the trimmed mean (β = 0.2 cuts one at each end), Krum
/// (which must pick an honest update) and Bulyan give bit for bit what they give with +40, and
/// at −100, −1e6, −1e30 what they give with −40; Multi-Krum with m = n − f = 6 keeps exactly the six honest updates, so it lands on
/// their sample-weighted mean.
#[test]
fn one_outlier_of_any_size_moves_nothing() {
    let honest: Vec<usize> = (0..7).filter(|&c| c != 4).collect();
    let with = |outlier: f64| {
        let mut changes = SEVEN_CHANGES;
        changes[4] = [outlier; 7];
        Round::new(&SEVEN_GLOBAL, &SHAPE, &changes, &SEVEN_SAMPLES)
    };
    let aggregators: [&dyn Aggregator; 4] = [&Median, &trimmed(0.2), &krum(1, 1), &Bulyan { f: 1 }];
    for aggregator in aggregators {
        for side in [1.0, -1.0] {
            let reference = with(40.0 * side).folded(aggregator);
            for outlier in [100.0, 1e6, 1e30] {
                let folded = with(outlier * side).folded(aggregator);
                assert_eq!(folded, reference, "{aggregator:?} {}", outlier * side);
            }
        }
    }
    let picked = with(1e30).folded(&krum(1, 1));
    assert!(
        honest.iter().any(|&c| {
            let update: Vec<f32> = (0..7)
                .map(|k| (SEVEN_GLOBAL[k] + SEVEN_CHANGES[c][k]) as f32)
                .collect();
            update == picked
        }),
        "Krum picked no honest update: {picked:?}"
    );
    let total: f64 = honest.iter().map(|&c| SEVEN_SAMPLES[c]).sum();
    let mean: Vec<f64> = (0..7)
        .map(|k| {
            let sum: f64 = honest
                .iter()
                .map(|&c| SEVEN_SAMPLES[c] * SEVEN_CHANGES[c][k])
                .sum();
            SEVEN_GLOBAL[k] + sum / total
        })
        .collect();
    for outlier in [100.0, 1e30, -1e30] {
        assert_close(
            &with(outlier).folded(&krum(1, 6)),
            &mean,
            "multi-krum m = 6",
        );
    }
}

/// The order results arrive in changes nothing, bit for bit: every aggregator sorts them by
/// client id first (so Krum's ties, Multi-Krum's sum and Bulyan's choices are the same).
#[test]
fn results_order_does_not_matter() {
    let seven = Round::new(&SEVEN_GLOBAL, &SHAPE, &SEVEN_CHANGES, &SEVEN_SAMPLES);
    let aggregators: [&dyn Aggregator; 6] = [
        &Median,
        &trimmed(0.3),
        &krum(1, 1),
        &krum(1, 3),
        &Bulyan { f: 1 },
        &Bulyan { f: 0 },
    ];
    for aggregator in aggregators {
        let reference = seven.folded(aggregator);
        for order in [
            [6, 5, 4, 3, 2, 1, 0],
            [3, 0, 6, 2, 5, 1, 4],
            [1, 2, 3, 4, 5, 6, 0],
        ] {
            assert_eq!(
                seven.permuted(&order).folded(aggregator),
                reference,
                "{aggregator:?}"
            );
        }
    }
}

/// Below its paper's assumption on n a robust rule guarantees nothing: Krum declines n ≤ 2f + 2
/// and fewer than m results, Bulyan fewer than 4f + 3, every one an empty round, and the model
/// keeps its bits.
#[test]
fn too_few_results_are_declined() {
    let seven = Round::new(&SEVEN_GLOBAL, &SHAPE, &SEVEN_CHANGES, &SEVEN_SAMPLES);
    let first = |n: usize| seven.permuted(&(0..n).collect::<Vec<_>>());
    let before: Vec<f32> = SEVEN_GLOBAL.iter().map(|&w| w as f32).collect();
    let cases: [(&dyn Aggregator, usize, usize); 6] = [
        (&krum(1, 1), 4, 5),
        (&krum(0, 5), 4, 5),
        (&Bulyan { f: 1 }, 6, 7),
        (&Bulyan { f: 0 }, 2, 3),
        (&Median, 0, 1),
        (&trimmed(0.2), 0, 1),
    ];
    for (aggregator, declined, folded) in cases {
        assert_eq!(aggregator.min_results(), folded, "{aggregator:?}");
        let (fit, model) = first(declined).fold(aggregator);
        match fit {
            Ok(Fit::NoUpdate(why)) => assert!(!why.is_empty()),
            other => panic!("{aggregator:?} with {declined}: {other:?}"),
        }
        assert_eq!(model, before);
        assert_eq!(first(folded).fold(aggregator).0.unwrap(), Fit::Updated);
    }
}

/// A buffer's staleness weight scales each change before the statistic: changes 4, 8 and 2 at
/// s = ½, 1, 1 are 2, 8, 2, whose median is 2 (unscaled it would be 4). A value whose change is
/// 0 keeps its bits (0.1 is not an f64 sum away from itself).
#[test]
fn staleness_scales_each_change_before_the_statistic() {
    let changes = [4.0, 8.0, 2.0].map(|v| [v, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    let round = Round {
        scales: vec![0.5, 1.0, 1.0],
        ..Round::new(&[1.0, 0.1], &[2], &changes, &[1.0; 3])
    };
    assert_eq!(round.folded(&Median), [3.0, 0.1]);
}

/// A robust aggregator takes changes only, and says why it cannot serve a secure sum: the
/// server would see only the sum of the updates.
#[test]
fn robust_aggregators_fold_changes_and_refuse_sums_and_blocks() {
    let aggregators: [&dyn Aggregator; 4] = [&Median, &trimmed(0.1), &krum(0, 1), &Bulyan { f: 0 }];
    for aggregator in aggregators {
        assert!(aggregator.robust() && aggregator.folds_changes() && !aggregator.folds_blocks());
        let why = aggregator.sum_weight().unwrap_err();
        assert!(why.contains("only their sum"), "{why}");
        let mut block = [1.0f32];
        let summed = [SummedBlock {
            block: 0,
            sum: &[2.0],
            weight: 1.0,
        }];
        let sum = SumRound {
            blocks: &summed,
            count: 1,
            unclipped: None,
            weight_space: true,
        };
        assert!(
            aggregator
                .aggregate_sum(&mut [&mut block[..]], &sum)
                .is_err()
        );
        let fit = FitRound {
            outcome: RoundOutcome {
                results: &[],
                failures: &[],
                population_samples: 0.0,
            },
            updates: &[],
        };
        assert!(
            aggregator
                .aggregate_fit(&mut [&mut block[..]], &fit)
                .is_err()
        );
        assert_eq!(block, [1.0]);
    }
}

/// The config's form: a name, or a table with every parameter of its kind and no other; each
/// refusal names the parameter (`aggregator.f`, …) and what was expected. A table written back
/// from an aggregator reads as the same aggregator.
#[test]
fn specs_are_checked_where_the_parameters_live() {
    let table = |kind: &str, beta, f, m| AggregatorSpec::Table {
        kind: kind.into(),
        beta,
        f,
        m,
    };
    let parse = |spec: AggregatorSpec| AggregatorName::try_from(spec);
    assert_eq!(
        parse(AggregatorSpec::Name("median".into())),
        Ok(AggregatorName::Median)
    );
    let accepted = [
        (
            table("krum", None, Some(1), Some(3)),
            AggregatorName::Krum(krum(1, 3)),
        ),
        (
            table("bulyan", None, Some(0), None),
            AggregatorName::Bulyan(Bulyan { f: 0 }),
        ),
        (
            table("trimmed-mean", Some(0.2), None, None),
            AggregatorName::TrimmedMean(trimmed(0.2)),
        ),
    ];
    for (spec, name) in accepted {
        assert_eq!(parse(spec.clone()), Ok(name));
        assert_eq!(AggregatorSpec::from(name), spec);
        assert_eq!(name.build().unwrap().name(), name.as_str());
    }
    assert_eq!(
        AggregatorName::Krum(krum(1, 3)).to_string(),
        "{ kind = \"krum\", f = 1, m = 3 }"
    );
    let refused = [
        (
            AggregatorSpec::Name("krum".into()),
            "aggregator",
            "{ kind = \"krum\"",
        ),
        (
            AggregatorSpec::Name("trimmed-mean".into()),
            "aggregator",
            "beta = <fraction",
        ),
        (
            table("median", None, None, None),
            "aggregator",
            "takes no parameters",
        ),
        (
            table("fedavg", Some(0.1), None, None),
            "aggregator",
            "takes no parameters",
        ),
        (
            table("krum", None, Some(1), None),
            "aggregator.m",
            "found none",
        ),
        (
            table("krum", None, Some(-1), Some(1)),
            "aggregator.f",
            "≥ 0, found -1",
        ),
        (
            table("krum", None, Some(1), Some(0)),
            "aggregator.m",
            "≥ 1, found 0",
        ),
        (
            table("krum", Some(0.1), Some(1), Some(1)),
            "aggregator",
            "takes no `beta`",
        ),
        (
            table("bulyan", None, Some(1), Some(2)),
            "aggregator",
            "takes no `m`",
        ),
        (
            table("bulyan", None, None, None),
            "aggregator.f",
            "found none",
        ),
        (
            table("trimmed-mean", Some(0.5), None, None),
            "aggregator.beta",
            "[0, 0.5), found 0.5",
        ),
        (
            table("trimmed-mean", None, None, None),
            "aggregator.beta",
            "found none",
        ),
    ];
    for (spec, field, expected) in refused {
        match parse(spec.clone()) {
            Err(StrategyError::InvalidInput { what, reason }) => {
                assert_eq!(what, field, "{spec:?}");
                assert!(reason.contains(expected), "{spec:?}: {reason}");
            }
            other => panic!("{spec:?}: {other:?}"),
        }
    }
    match parse(table("geomed", None, Some(1), None)) {
        Err(StrategyError::UnknownName { name, valid, .. }) => {
            assert_eq!(name, "geomed");
            assert!(
                valid.ends_with("median, trimmed-mean, krum, bulyan"),
                "{valid}"
            );
        }
        other => panic!("{other:?}"),
    }
}
