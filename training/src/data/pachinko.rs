//! The two-stage Pachinko allocation of Reddi et al., "Adaptive Federated Optimization" (ICLR
//! 2021, App. C.1), which splits CIFAR-100 over clients using its label hierarchy of 20 coarse
//! labels with 5 fine labels each (docs/algorithms.md §1.10: α = 1 over coarse, α = 10 coarse → fine).
//!
//! Per client `c`, in client order, each step seeded from its own [`Purpose::Data`] stream:
//! 1. a coarse mix `q_c ~ Dir(α_coarse · p_coarse)` and, for every coarse label `k`, a fine mix
//!    `r_ck ~ Dir(α_fine · p_fine|k)` over the fine labels under `k`, where `p` are the label
//!    frequencies of the input (`= p` itself when α = ∞);
//! 2. `samples_per_client` draws: a coarse label from `q_c`, a fine label from `r_ck`, and a
//!    sample of that fine label uniformly at random, without replacement (each fine label's
//!    samples are shuffled once into a pool and taken from its end).
//!
//! Labels run out as clients take samples. A fine label with no samples left is removed from
//! every `r_ck` and the rest renormalised; a coarse label whose fine labels are all used up is
//! removed from every `q_c` likewise (TFF's description; masking the weights at each draw does
//! exactly this). When all of a client's remaining mass sits on exhausted labels (possible for
//! tiny α, where Dirichlet weights underflow to 0), the draw falls back to the labels'
//! remaining sample counts, so every client still gets exactly `samples_per_client` samples.
//!
//! Concentration, as everywhere in this crate, multiplies the label distribution: `Dir(α·p)`.
//! Reddi et al. and TFF's stored split state a *symmetric* `Dir(α)` per component (α = 0.1 over
//! coarse, β = 10 over fine). On balanced CIFAR-100 (`p_coarse = 1/20`, `p_fine|k = 1/5`) that
//! split is `alpha_coarse = 0.1 · 20 = 2`, `alpha_fine = 10 · 5 = 50` here; the defaults
//! [`DEFAULT_ALPHA_COARSE`] and [`DEFAULT_ALPHA_FINE`] are those of §1.10 as written.
//!
//! [`Purpose::Data`]: fedshard_strategies::rng::Purpose::Data

use super::partition::{dirichlet, fits_clients, shuffled_pools};
use super::{DataError, DataStream, Result, data_stream};
use fedshard_strategies::rng::{ChaCha20Rng, uniform};

/// Concentration over coarse labels in docs/algorithms.md §1.10.
pub const DEFAULT_ALPHA_COARSE: f64 = 1.0;
/// Concentration over the fine labels of a coarse label in docs/algorithms.md §1.10.
pub const DEFAULT_ALPHA_FINE: f64 = 10.0;

/// How to split a two-level labelled dataset across clients.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PachinkoSpec {
    /// Number of clients, at least 1.
    pub clients: usize,
    /// Samples every client gets; `clients · samples_per_client` must not exceed the data.
    pub samples_per_client: usize,
    /// Dirichlet concentration of the coarse mixes, `Dir(α_coarse · p_coarse)`; ∞ for `p`.
    pub alpha_coarse: f64,
    /// Dirichlet concentration of the fine mixes, `Dir(α_fine · p_fine|k)`; ∞ for `p`.
    pub alpha_fine: f64,
}

impl PachinkoSpec {
    /// `clients × samples_per_client` with the concentrations of docs/algorithms.md §1.10.
    pub fn paper(clients: usize, samples_per_client: usize) -> Self {
        Self {
            clients,
            samples_per_client,
            alpha_coarse: DEFAULT_ALPHA_COARSE,
            alpha_fine: DEFAULT_ALPHA_FINE,
        }
    }
}

/// Splits the samples with labels `fine[i]` under `coarse[i]` (each fine label under a single
/// coarse label) into `spec.clients` disjoint index lists of `spec.samples_per_client` indices,
/// each in ascending order. The result depends only on the inputs and `seed`. Samples no client
/// drew are left out.
///
/// Errors when the label slices differ in length, a fine label appears under two coarse labels,
/// there are no clients, the clients want more samples than there are, or an α is not positive.
pub fn pachinko(
    fine: &[u32],
    coarse: &[u32],
    spec: &PachinkoSpec,
    seed: u64,
) -> Result<Vec<Vec<usize>>> {
    validate(fine, coarse, spec)?;
    let tree = LabelTree::new(fine, coarse)?;
    let n = fine.len() as f64;

    let mut pools = shuffled_pools(fine, tree.fine_classes, seed, DataStream::PachinkoShuffle);
    let p_coarse: Vec<f64> = tree
        .children
        .iter()
        .map(|kids| kids.iter().map(|&f| pools[f].len()).sum::<usize>() as f64 / n)
        .collect();
    let p_fine: Vec<Vec<f64>> = tree
        .children
        .iter()
        .map(|kids| {
            let total: usize = kids.iter().map(|&f| pools[f].len()).sum();
            kids.iter()
                .map(|&f| pools[f].len() as f64 / total.max(1) as f64)
                .collect()
        })
        .collect();

    let mut clients = Vec::with_capacity(spec.clients);
    for client in 0..spec.clients as u64 {
        let mut rng = data_stream(seed, DataStream::PachinkoMix, client);
        let q = mix(spec.alpha_coarse, &p_coarse, &mut rng);
        let r: Vec<Vec<f64>> = p_fine
            .iter()
            .map(|p| mix(spec.alpha_fine, p, &mut rng))
            .collect();

        let mut rng = data_stream(seed, DataStream::PachinkoDraw, client);
        let mut indices = Vec::with_capacity(spec.samples_per_client);
        for _ in 0..spec.samples_per_client {
            let coarse_left: Vec<usize> = tree
                .children
                .iter()
                .map(|kids| kids.iter().map(|&f| pools[f].len()).sum())
                .collect();
            let fine_pick = draw_available(&q, &coarse_left, &mut rng).and_then(|k| {
                let kids = &tree.children[k];
                let fine_left: Vec<usize> = kids.iter().map(|&f| pools[f].len()).collect();
                draw_available(&r[k], &fine_left, &mut rng).map(|j| kids[j])
            });
            // validate() checked that the clients want no more than there is, so a label with
            // samples left always exists; an error here would be a bug, not bad input.
            let sample =
                fine_pick
                    .and_then(|f| pools[f].pop())
                    .ok_or(DataError::InvalidParameter {
                        name: "samples_per_client",
                        value: spec.samples_per_client.to_string(),
                        expected: "no more samples than the data holds (internal error)",
                    })?;
            indices.push(sample);
        }
        indices.sort_unstable();
        clients.push(indices);
    }
    Ok(clients)
}

/// `Dir(α·p)`, or `p` itself for α = ∞.
fn mix(alpha: f64, p: &[f64], rng: &mut ChaCha20Rng) -> Vec<f64> {
    if alpha.is_infinite() {
        p.to_vec()
    } else {
        dirichlet(alpha, p, rng)
    }
}

/// An index drawn with probability proportional to `weights[i]` among the `i` with
/// `remaining[i] > 0`, i.e. the weights with exhausted entries removed and renormalised; if
/// those weights are all 0, proportional to `remaining`. `None` when nothing remains.
fn draw_available(weights: &[f64], remaining: &[usize], rng: &mut ChaCha20Rng) -> Option<usize> {
    let masked: Vec<f64> = weights
        .iter()
        .zip(remaining)
        .map(|(&w, &left)| if left > 0 { w } else { 0.0 })
        .collect();
    if masked.iter().sum::<f64>() > 0.0 {
        categorical(&masked, rng)
    } else {
        let counts: Vec<f64> = remaining.iter().map(|&left| left as f64).collect();
        categorical(&counts, rng)
    }
}

/// An index drawn with probability `weights[i] / Σ weights` (non-negative weights), by inverse
/// CDF on one [`uniform`]; `None` when all weights are 0.
fn categorical(weights: &[f64], rng: &mut ChaCha20Rng) -> Option<usize> {
    let total: f64 = weights.iter().sum();
    if total.is_nan() || total <= 0.0 {
        return None;
    }
    let mut u = uniform(rng) * total;
    let mut last = None;
    for (i, &w) in weights.iter().enumerate() {
        if w <= 0.0 {
            continue;
        }
        if u < w {
            return Some(i);
        }
        u -= w;
        last = Some(i);
    }
    // Rounding can leave u a hair above the last weight: that is the last positive entry.
    last
}

/// Which fine labels sit under which coarse label.
struct LabelTree {
    /// One more than the largest fine label.
    fine_classes: usize,
    /// Fine labels under each coarse label, ascending.
    children: Vec<Vec<usize>>,
}

impl LabelTree {
    fn new(fine: &[u32], coarse: &[u32]) -> Result<Self> {
        let fine_classes = fine.iter().max().map_or(0, |&m| m as usize + 1);
        let coarse_classes = coarse.iter().max().map_or(0, |&m| m as usize + 1);
        let mut parent: Vec<Option<u32>> = vec![None; fine_classes];
        for (&f, &k) in fine.iter().zip(coarse) {
            match parent[f as usize] {
                None => parent[f as usize] = Some(k),
                Some(seen) if seen != k => {
                    return Err(DataError::InvalidParameter {
                        name: "coarse labels",
                        value: format!("fine label {f} under coarse labels {seen} and {k}"),
                        expected: "every fine label under exactly one coarse label",
                    });
                }
                Some(_) => {}
            }
        }
        let mut children = vec![Vec::new(); coarse_classes];
        for (f, k) in parent.iter().enumerate() {
            if let Some(k) = *k {
                children[k as usize].push(f);
            }
        }
        Ok(Self {
            fine_classes,
            children,
        })
    }
}

fn validate(fine: &[u32], coarse: &[u32], spec: &PachinkoSpec) -> Result<()> {
    let invalid = |name, value: String, expected| {
        Err(DataError::InvalidParameter {
            name,
            value,
            expected,
        })
    };
    if fine.len() != coarse.len() {
        return invalid(
            "coarse labels",
            format!("{} coarse for {} fine labels", coarse.len(), fine.len()),
            "one coarse label per sample",
        );
    }
    if spec.clients == 0 {
        return invalid("clients", "0".into(), "at least one client");
    }
    fits_clients(
        "samples_per_client",
        spec.samples_per_client,
        spec.clients,
        fine.len(),
        "clients · samples_per_client ≤ number of samples",
    )?;
    for (name, alpha) in [
        ("alpha_coarse", spec.alpha_coarse),
        ("alpha_fine", spec.alpha_fine),
    ] {
        if alpha.is_nan() || alpha <= 0.0 {
            return invalid(
                name,
                alpha.to_string(),
                "a positive Dirichlet concentration (inf for the global mix)",
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categorical_skips_zero_weights_and_empty_input() {
        let mut rng = data_stream(0, DataStream::PachinkoDraw, 0);
        for _ in 0..100 {
            assert_eq!(categorical(&[0.0, 2.0, 0.0], &mut rng), Some(1));
        }
        assert_eq!(categorical(&[0.0, 0.0], &mut rng), None);
        // All of the client's mass on an exhausted label: fall back to what is left.
        assert_eq!(draw_available(&[1.0, 0.0], &[0, 3], &mut rng), Some(1));
        assert_eq!(draw_available(&[1.0, 0.0], &[0, 0], &mut rng), None);
    }

    #[test]
    fn inconsistent_hierarchy_is_named() {
        let e = pachinko(&[0, 0], &[0, 1], &PachinkoSpec::paper(1, 1), 0).unwrap_err();
        assert!(
            e.to_string()
                .contains("fine label 0 under coarse labels 0 and 1"),
            "{e}"
        );
    }
}
