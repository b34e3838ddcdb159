//! Who shares with whom: the complete graph of SecAgg (Bonawitz et al. 2017) or the sparse
//! random `k`-regular graph of SecAgg+ (Bell et al. 2020).
//!
//! SecAgg+ needs a graph every party can rebuild from public data. Following Bell et al.'s
//! construction, it is the Harary graph `H(k, n)` (position `i` joined to positions
//! `i ± 1, …, i ± k/2` mod `n`) under a random relabelling of the clients drawn from a public
//! seed: each client has exactly `k` neighbours, and which they are is uniform over the
//! relabellings. A client masks with its neighbours only and shares its secrets with its
//! neighbours and itself, so its costs are `O(k)` rather than `O(n)`; with
//! `k = O(log n)` the paper shows privacy and dropout robustness hold with high probability
//! (docs/algorithms.md §7, "Graph").

use std::collections::{BTreeMap, BTreeSet};

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::message::ClientId;
use crate::params::Param;

/// The communication graph of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Graph {
    /// Every client is every other's neighbour (SecAgg).
    Complete,
    /// A Harary graph of even degree `degree`, relabelled by a permutation drawn from `seed`
    /// (SecAgg+). A degree of `n − 1` or more is the complete graph.
    RandomRegular { degree: usize, seed: u64 },
}

/// The largest SecAgg+ degree. SecAgg+'s point is a degree of `O(log n)` (Bell et al. 2020;
/// docs/secagg.md takes `k ≈ 2 log₂ n`, 40 at [`crate::params::MAX_CLIENTS`]): 1024 leaves
/// ample room for stricter choices, and a larger degree is the complete graph (no degree) in all
/// but name, at a cost per client that grows with `k`.
pub const MAX_DEGREE: usize = 1024;

/// Every client's neighbours (never itself), symmetric.
pub type Neighbourhoods = BTreeMap<ClientId, BTreeSet<ClientId>>;

impl Graph {
    /// Checks the degree: SecAgg+'s Harary construction needs an even degree of at least 2,
    /// and one above [`MAX_DEGREE`] is refused.
    pub fn validate(&self) -> Result<(), Error> {
        match *self {
            Graph::Complete => Ok(()),
            Graph::RandomRegular { degree, .. }
                if (2..=MAX_DEGREE).contains(&degree) && degree % 2 == 0 =>
            {
                Ok(())
            }
            Graph::RandomRegular { degree, .. } => Err(Error::OutOfRange {
                param: Param::Degree,
                expected: format!(
                    "an even number of neighbours in 2..={MAX_DEGREE} (omit the degree for the \
                     complete graph)"
                ),
                found: degree.to_string(),
            }),
        }
    }

    /// The neighbours of each of `clients` (distinct ids).
    pub fn neighbourhoods(&self, clients: &[ClientId]) -> Neighbourhoods {
        let n = clients.len();
        match *self {
            Graph::RandomRegular { degree, seed } if degree < n.saturating_sub(1) => {
                let mut order = clients.to_vec();
                order.shuffle(&mut ChaCha20Rng::seed_from_u64(seed));
                let mut out = Neighbourhoods::new();
                for (i, &u) in order.iter().enumerate() {
                    let set = (1..=degree / 2)
                        .flat_map(|d| [order[(i + d) % n], order[(i + n - d) % n]])
                        .collect();
                    out.insert(u, set);
                }
                out
            }
            _ => clients
                .iter()
                .map(|&u| (u, clients.iter().copied().filter(|&v| v != u).collect()))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_regular_graph_is_regular_and_symmetric() {
        let clients: Vec<ClientId> = (0..31).collect();
        let graph = Graph::RandomRegular { degree: 6, seed: 3 };
        let hoods = graph.neighbourhoods(&clients);
        for (&u, set) in &hoods {
            assert_eq!(set.len(), 6, "client {u}");
            assert!(!set.contains(&u));
            assert!(set.iter().all(|v| hoods[v].contains(&u)), "client {u}");
        }
        assert_eq!(
            hoods,
            graph.neighbourhoods(&clients),
            "same seed, same graph"
        );
        let other = Graph::RandomRegular { degree: 6, seed: 4 }.neighbourhoods(&clients);
        assert_ne!(hoods, other);
    }

    #[test]
    fn large_degree_is_the_complete_graph() {
        let clients: Vec<ClientId> = vec![2, 5, 9, 11];
        let complete = Graph::Complete.neighbourhoods(&clients);
        assert_eq!(
            Graph::RandomRegular { degree: 4, seed: 1 }.neighbourhoods(&clients),
            complete
        );
        assert_eq!(complete[&5], BTreeSet::from([2, 9, 11]));
        assert!(
            Graph::RandomRegular { degree: 3, seed: 1 }
                .validate()
                .is_err()
        );
    }

    /// An odd degree, one below 2 or one above [`MAX_DEGREE`] is refused as the degree.
    #[test]
    fn a_degree_outside_its_range_is_refused() {
        for degree in [2, 16, MAX_DEGREE] {
            assert_eq!(Graph::RandomRegular { degree, seed: 1 }.validate(), Ok(()));
        }
        for degree in [0, 1, 5, MAX_DEGREE + 2, 1_000_000] {
            let refused = Graph::RandomRegular { degree, seed: 1 }.validate();
            assert!(
                matches!(
                    refused,
                    Err(Error::OutOfRange {
                        param: Param::Degree,
                        ..
                    })
                ),
                "{degree}: {refused:?}"
            );
        }
    }
}
