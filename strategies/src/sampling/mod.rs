//! Joint samplers (ALGORITHMS.md §1.5–1.6): draw exactly `n` distinct term indices with given
//! inclusion probabilities `π` (or, for NumPy-style choice, given selection weights).
//!
//! A sampler is prepared once per `π` (the fit of conditional Poisson's working probabilities,
//! its selection table), then draws cheaply for every client of a group from a caller-provided
//! ChaCha stream.

use crate::rng::ChaCha20Rng;

/// A sampling design fitted to one `π` vector, ready to draw index sets.
pub trait PreparedDesign: Send + Sync + std::fmt::Debug {
    /// The fixed sample size `n` every draw has.
    fn sample_size(&self) -> usize;
    /// Draws one index set of exactly [`Self::sample_size`] distinct indices into `out`
    /// (cleared first), in ascending order.
    fn draw_into(&self, rng: &mut ChaCha20Rng, out: &mut Vec<usize>);
    /// Convenience wrapper around [`Self::draw_into`].
    fn draw(&self, rng: &mut ChaCha20Rng) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.sample_size());
        self.draw_into(rng, &mut out);
        out
    }
}
