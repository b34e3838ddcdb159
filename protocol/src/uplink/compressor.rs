//! The compressors a federation selects by name (`[federation] compressor`), and the codec
//! each name stands for.

use super::codec::Codec;
use super::fedpm::Fedpm;
use super::identity::IdentityCodec;
use super::klms::Klms;
use super::qsgd::{EliasSymbols, Qsgd, Trits};
use super::sgld::Sgld;
use super::signsgd::Signsgd;
use serde::{Deserialize, Serialize};

/// An uplink compressor, selected by name in `[federation] compressor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Compressor {
    /// bincode of the updated tensors, f32: 32 bits per value plus framing.
    #[default]
    Identity,
    /// QSGD with one level: a 32-bit norm and a symbol in `{−1, 0, +1}` per value (1.6 bits).
    Qsgd,
    /// The same QSGD symbols Elias-coded as in the QSGD paper: a 32-bit norm, the number of
    /// non-zero symbols, then per non-zero symbol its gap (Elias gamma) and its sign.
    QsgdElias,
    /// QSGD's symbols coded with KLMS against last round's symbol frequencies.
    QsgdKlms,
    /// Stochastic SignSGD: one sign bit per value.
    Signsgd,
    /// SignSGD's signs coded with KLMS against a fair coin.
    SignsgdKlms,
    /// FedPM: one mask bit per value (the model is mask probabilities).
    Fedpm,
    /// FedPM's mask coded with KLMS against the global mask probabilities.
    FedpmKlms,
    /// SGLD: the client's Gaussian sample `y_c ~ N(H_c, σ² I)` as f32 values (32 bits each).
    Sgld,
    /// SGLD's Gaussian sample coded with KLMS against `N(0, σ² I)`.
    SgldKlms,
}

/// The method a compressor transmits, with or without KLMS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    Qsgd,
    Signsgd,
    Fedpm,
    Sgld,
}

impl Compressor {
    pub const ALL: [Compressor; 10] = [
        Compressor::Identity,
        Compressor::Qsgd,
        Compressor::QsgdElias,
        Compressor::QsgdKlms,
        Compressor::Signsgd,
        Compressor::SignsgdKlms,
        Compressor::Fedpm,
        Compressor::FedpmKlms,
        Compressor::Sgld,
        Compressor::SgldKlms,
    ];

    /// The host method; `None` for the identity encoding.
    pub fn host(self) -> Option<Host> {
        match self {
            Compressor::Identity => None,
            Compressor::Qsgd | Compressor::QsgdElias | Compressor::QsgdKlms => Some(Host::Qsgd),
            Compressor::Signsgd | Compressor::SignsgdKlms => Some(Host::Signsgd),
            Compressor::Fedpm | Compressor::FedpmKlms => Some(Host::Fedpm),
            Compressor::Sgld | Compressor::SgldKlms => Some(Host::Sgld),
        }
    }

    /// Whether the host's symbols go through KLMS.
    pub fn klms(self) -> bool {
        matches!(
            self,
            Compressor::QsgdKlms
                | Compressor::SignsgdKlms
                | Compressor::FedpmKlms
                | Compressor::SgldKlms
        )
    }

    /// Every config name, comma-separated.
    fn names() -> String {
        let names: Vec<_> = Self::ALL.iter().map(|c| c.name()).collect();
        names.join(", ")
    }

    /// The coder of this compressor: the one place a config name meets its codec (the `-klms`
    /// names wrap their host's codec in [`Klms`]).
    pub fn codec(self) -> &'static dyn Codec {
        match self {
            Compressor::Identity => &IdentityCodec,
            Compressor::Qsgd => &Qsgd::<Trits>::NEW,
            Compressor::QsgdElias => &Qsgd::<EliasSymbols>::NEW,
            // KLMS replaces the host's own code, so QSGD's frame does not matter here.
            Compressor::QsgdKlms => &Klms(Qsgd::<Trits>::NEW),
            Compressor::Signsgd => &Signsgd,
            Compressor::SignsgdKlms => &Klms(Signsgd),
            Compressor::Fedpm => &Fedpm,
            Compressor::FedpmKlms => &Klms(Fedpm),
            Compressor::Sgld => &Sgld,
            Compressor::SgldKlms => &Klms(Sgld),
        }
    }

    /// The config name.
    pub fn name(self) -> &'static str {
        match self {
            Compressor::Identity => "identity",
            Compressor::Qsgd => "qsgd",
            Compressor::QsgdElias => "qsgd-elias",
            Compressor::QsgdKlms => "qsgd-klms",
            Compressor::Signsgd => "signsgd",
            Compressor::SignsgdKlms => "signsgd-klms",
            Compressor::Fedpm => "fedpm",
            Compressor::FedpmKlms => "fedpm-klms",
            Compressor::Sgld => "sgld",
            Compressor::SgldKlms => "sgld-klms",
        }
    }
}

/// A compressor name that is not one of [`Compressor::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown compressor `{0}`; expected one of {names}", names = Compressor::names())]
pub struct UnknownCompressor(pub String);

impl std::str::FromStr for Compressor {
    type Err = UnknownCompressor;

    fn from_str(name: &str) -> Result<Self, UnknownCompressor> {
        Self::ALL
            .into_iter()
            .find(|c| c.name() == name)
            .ok_or_else(|| UnknownCompressor(name.to_string()))
    }
}

impl std::fmt::Display for Compressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
