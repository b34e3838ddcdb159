//! Seeded randomness: every random draw in fedshard comes from a ChaCha20 stream derived from
//! `(seed, round, client, purpose)` (docs/algorithms.md §4.2), never from a global generator, so a
//! run is reproducible bit for bit and server and client can regenerate each other's draws.

use rand::{Rng, SeedableRng};
pub use rand_chacha::ChaCha20Rng;

/// What a stream is used for; distinct purposes never share random numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u64)]
pub enum Purpose {
    /// Joint sampler draws of a client's index set.
    Sharding = 1,
    /// Client selection by the coordinator.
    Selection = 2,
    /// Data partitioning and synthetic data.
    Data = 3,
    /// Model initialisation.
    Init = 4,
    /// Local training (batch order, dropout).
    Training = 5,
    /// Shared randomness of a compressor (KLMS candidates).
    Compression = 6,
    /// Research commands and experiments.
    Experiment = 7,
    /// The permutation of the clients that the keep-ratio shares are laid over.
    KeepRatios = 8,
    /// The sample of held-out examples evaluated (Shakespeare's test windows).
    TestSample = 9,
    /// A client's subset of its own training examples (Shakespeare's `max_samples`); the client
    /// slot is the client's index.
    ClientSubsample = 10,
    /// The ground truth of synthetic data: θ* and the client sizes of the one-shot setting.
    SyntheticTruth = 11,
    /// A synthetic client's samples; the client slot is the client's index.
    SyntheticSamples = 12,
    /// The held-out synthetic samples.
    SyntheticTest = 13,
    /// KLMS candidates shared by client and server (docs/algorithms.md §4.2): the ChaCha stream id is
    /// the block index, so the server regenerates every block's candidates from
    /// `(seed, round, client)` alone.
    KlmsCandidates = 14,
    /// A KLMS client's private choice of the candidate index (§4.1 step 3).
    KlmsSelection = 15,
    /// FedPM's frozen random weights `w_init` (docs/algorithms.md §4.6): the client slot is a hash
    /// of the tensor's name, so clients and the server's evaluator draw the same weights from
    /// the run seed without shipping them.
    FedpmWeights = 16,
    /// The Bernoulli masks a FedPM client samples in each local training step.
    FedpmMasks = 17,
    /// The one mask the server's FedPM evaluator samples from the global θ.
    FedpmEvalMask = 18,
    /// The extra arrival sequences behind a KLMS client's estimate of its ordered selection's
    /// probabilities (its drift ratio); the ChaCha stream id is the block index. Apart from the
    /// selection stream, so that measuring the ratio does not change the candidate chosen.
    KlmsDriftEstimate = 19,
    /// Simulated time's draws of each client's device speed and link rates (the client slot is
    /// the client's index, the round slot which draw).
    SimulatedTime = 20,
    /// Differential privacy's Gaussian noise: the client slot 0 for the noise added to a round's
    /// sum of clipped updates, 1 for the noise of adaptive clipping's count.
    PrivacyNoise = 21,
    /// Secure aggregation's public draws of a round: its session id and the SecAgg+ graph's
    /// relabelling (never a client's secrets, which come from the client's own OS entropy).
    SecureSession = 22,
    /// FjORD's per-batch draws of a client's ordered-dropout width level.
    OrderedDropout = 23,
    /// Byzantine clients (`[faults.byzantine]`): the round slot `u64::MAX` chooses the
    /// attackers (the client slot is the client's index), a task's round the Gaussian attack's
    /// noise.
    Byzantine = 24,
}

/// The stream for `(seed, round, client, purpose)`: the 32-byte ChaCha key is the four numbers in
/// little-endian order, so streams are independent whenever any of them differs.
pub fn stream(seed: u64, round: u64, client: u64, purpose: Purpose) -> ChaCha20Rng {
    let mut key = [0u8; 32];
    for (chunk, word) in key
        .chunks_exact_mut(8)
        .zip([seed, round, client, purpose as u64])
    {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    ChaCha20Rng::from_seed(key)
}

/// A uniform double in `[0, 1)` with 53 random bits, `(next_u64 >> 11) · 2⁻⁵³`: the same
/// construction as NumPy's `Generator.random()`, so samplers written against NumPy's algorithms
/// consume randomness the same way.
#[inline]
pub fn uniform(rng: &mut impl Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<u64> = (0..4)
            .map(|_| 0)
            .scan(stream(7, 1, 2, Purpose::Sharding), |r, _| {
                Some(r.next_u64())
            })
            .collect();
        let b: Vec<u64> = (0..4)
            .map(|_| 0)
            .scan(stream(7, 1, 2, Purpose::Sharding), |r, _| {
                Some(r.next_u64())
            })
            .collect();
        let c: Vec<u64> = (0..4)
            .map(|_| 0)
            .scan(stream(7, 1, 3, Purpose::Sharding), |r, _| {
                Some(r.next_u64())
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn uniform_is_in_unit_interval() {
        let mut rng = stream(1, 0, 0, Purpose::Experiment);
        for _ in 0..10_000 {
            let u = uniform(&mut rng);
            assert!((0.0..1.0).contains(&u));
        }
    }
}
