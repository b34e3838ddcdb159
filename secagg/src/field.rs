//! Arithmetic in the prime field GF(p), p = 2⁶¹ − 1 (a Mersenne prime), for Shamir sharing.
//!
//! A Mersenne modulus reduces a 122-bit product with two shifts and adds, and 61 bits hold
//! 7-byte chunks of a secret (56 bits), so a 32-byte secret is five field elements.

/// The field's modulus, 2⁶¹ − 1.
pub const MODULUS: u64 = (1 << 61) - 1;

/// An element of GF(2⁶¹ − 1), always in canonical form `0 ≤ value < MODULUS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fe(u64);

impl Fe {
    pub const ZERO: Fe = Fe(0);
    pub const ONE: Fe = Fe(1);

    /// The element `value`, or `None` when `value` is not canonical (≥ p): values from a peer
    /// are checked, never silently reduced, so a share has exactly one encoding.
    pub fn new(value: u64) -> Option<Fe> {
        (value < MODULUS).then_some(Fe(value))
    }

    /// `value mod p`, for values this crate computes itself.
    pub fn reduce(value: u64) -> Fe {
        let folded = (value & MODULUS) + (value >> 61);
        Fe(if folded >= MODULUS {
            folded - MODULUS
        } else {
            folded
        })
    }

    pub fn value(self) -> u64 {
        self.0
    }

    /// The multiplicative inverse by Fermat's little theorem, `a^(p−2)`; `None` for zero.
    pub fn inverse(self) -> Option<Fe> {
        if self.0 == 0 {
            return None;
        }
        let mut result = Fe::ONE;
        let mut base = self;
        let mut exponent = MODULUS - 2;
        while exponent > 0 {
            if exponent & 1 == 1 {
                result = result * base;
            }
            base = base * base;
            exponent >>= 1;
        }
        Some(result)
    }

    /// A uniform element from a random 64-bit stream, by rejection (61 bits, reject `p`).
    pub fn random(rng: &mut impl rand::Rng) -> Fe {
        loop {
            if let Some(fe) = Fe::new(rng.next_u64() >> 3) {
                return fe;
            }
        }
    }
}

impl std::ops::Add for Fe {
    type Output = Fe;
    fn add(self, other: Fe) -> Fe {
        Fe::reduce(self.0 + other.0)
    }
}

impl std::ops::Sub for Fe {
    type Output = Fe;
    fn sub(self, other: Fe) -> Fe {
        Fe::reduce(self.0 + MODULUS - other.0)
    }
}

impl std::ops::Mul for Fe {
    type Output = Fe;
    fn mul(self, other: Fe) -> Fe {
        let product = u128::from(self.0) * u128::from(other.0);
        // 2⁶¹ ≡ 1 (mod p): fold the high bits onto the low ones.
        let low = (product as u64) & MODULUS;
        let high = (product >> 61) as u64;
        Fe::reduce(low + high)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverse_times_element_is_one() {
        for value in [1, 2, 3, 12_345, MODULUS - 1, 1 << 60] {
            let fe = Fe::new(value).unwrap();
            assert_eq!(fe * fe.inverse().unwrap(), Fe::ONE, "value {value}");
        }
        assert_eq!(Fe::ZERO.inverse(), None);
    }

    #[test]
    fn arithmetic_matches_u128_reference() {
        let p = u128::from(MODULUS);
        for (a, b) in [
            (MODULUS - 1, MODULUS - 1),
            (5, MODULUS - 3),
            (1 << 60, 3),
            (0, 7),
        ] {
            let (x, y) = (Fe::new(a).unwrap(), Fe::new(b).unwrap());
            let (a, b) = (u128::from(a), u128::from(b));
            assert_eq!(u128::from((x * y).value()), a * b % p);
            assert_eq!(u128::from((x + y).value()), (a + b) % p);
            assert_eq!(u128::from((x - y).value()), (a + p - b) % p);
        }
        assert_eq!(Fe::new(MODULUS), None);
    }
}
