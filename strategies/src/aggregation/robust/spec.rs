//! How a config writes an aggregator ([`AggregatorSpec`]): an aggregator without parameters by
//! its name, `aggregator = "median"`; one with parameters as a table of its `kind` and its
//! parameters, the paper's symbols, all required, `aggregator = { kind = "krum", f = 1, m = 3 }`,
//! as `staleness = { kind = "hinge", a = 10, b = 4 }` is written. One way for each: a name
//! alone for an aggregator with parameters, or a table for one without, is refused, saying
//! what to write.
//!
//! [`AggregatorName`] (de)serialises through this form, and the conversion is where the
//! parameters are checked: a refusal names `aggregator.<parameter>` and what was expected, for
//! the config to put its section in front.

use super::super::AggregatorName;
use super::{Bulyan, Krum, TrimFraction, TrimmedMean};
use crate::StrategyError;
use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::num::NonZeroUsize;

/// An aggregator as written, before its parameters are checked.
#[derive(Debug, Clone, PartialEq)]
pub enum AggregatorSpec {
    /// `aggregator = "fedavg"`.
    Name(String),
    /// `aggregator = { kind = "trimmed-mean", beta = 0.1 }`: the kind and the parameters
    /// given (integers as written, so that a negative count is named, not wrapped).
    Table {
        kind: String,
        beta: Option<f64>,
        f: Option<i64>,
        m: Option<i64>,
    },
}

/// The table form each aggregator with parameters takes, for messages.
fn table_form(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "trimmed-mean" => "{ kind = \"trimmed-mean\", beta = <fraction cut from each end> }",
        "krum" => "{ kind = \"krum\", f = <byzantine clients>, m = <updates kept> }",
        "bulyan" => "{ kind = \"bulyan\", f = <byzantine clients> }",
        _ => return None,
    })
}

/// The aggregators with parameters, in registry order.
pub(in super::super) const PARAMETERISED: [&str; 3] = ["trimmed-mean", "krum", "bulyan"];

impl AggregatorName {
    /// The name of an aggregator with parameters, given alone: refused with the table to write.
    pub(in super::super) fn needs_parameters(name: &str) -> Option<StrategyError> {
        table_form(name).map(|form| {
            StrategyError::invalid(
                "aggregator",
                format!("expected {form}: `{name}` takes parameters, found \"{name}\""),
            )
        })
    }
}

/// A count parameter (`f`, `m`): given, an integer at least `min`, and made a `T` by
/// `convert`; or an error naming it.
fn count<T>(
    what: &'static str,
    meaning: &str,
    (value, min): (Option<i64>, i64),
    convert: impl Fn(usize) -> Option<T>,
) -> Result<T, StrategyError> {
    let found = value.map_or("none".to_owned(), |v| v.to_string());
    value
        .filter(|&v| v >= min)
        .and_then(|v| usize::try_from(v).ok())
        .and_then(convert)
        .ok_or_else(|| {
            StrategyError::invalid(
                what,
                format!("expected {meaning}, an integer ≥ {min}, found {found}"),
            )
        })
}

impl TryFrom<AggregatorSpec> for AggregatorName {
    type Error = StrategyError;

    /// Checks the kind and every parameter: each one its aggregator takes is given and in
    /// range, none it does not take is given.
    fn try_from(spec: AggregatorSpec) -> Result<Self, StrategyError> {
        let (kind, beta, f, m) = match spec {
            AggregatorSpec::Name(name) => return name.parse(),
            AggregatorSpec::Table { kind, beta, f, m } => (kind, beta, f, m),
        };
        let Some(form) = table_form(&kind) else {
            return Err(match kind.parse::<AggregatorName>() {
                Ok(_) => StrategyError::invalid(
                    "aggregator",
                    format!("expected \"{kind}\": `{kind}` takes no parameters, found a table"),
                ),
                Err(unknown) => unknown,
            });
        };
        let takes: &[&str] = match kind.as_str() {
            "trimmed-mean" => &["beta"],
            "krum" => &["f", "m"],
            _ => &["f"],
        };
        for (name, given) in [
            ("beta", beta.is_some()),
            ("f", f.is_some()),
            ("m", m.is_some()),
        ] {
            if given && !takes.contains(&name) {
                return Err(StrategyError::invalid(
                    "aggregator",
                    format!("expected {form}: `{kind}` takes no `{name}`"),
                ));
            }
        }
        let byzantine = "f, the byzantine clients assumed among a round's results";
        Ok(match kind.as_str() {
            "trimmed-mean" => {
                let Some(beta) = beta else {
                    return Err(StrategyError::invalid(
                        "aggregator.beta",
                        "expected the fraction cut from each end, in [0, 0.5), found none",
                    ));
                };
                AggregatorName::TrimmedMean(TrimmedMean {
                    beta: TrimFraction::new(beta)?,
                })
            }
            "krum" => AggregatorName::Krum(Krum {
                f: count("aggregator.f", byzantine, (f, 0), Some)?,
                m: count(
                    "aggregator.m",
                    "m, the updates kept and averaged (1: Krum)",
                    (m, 1),
                    NonZeroUsize::new,
                )?,
            }),
            _ => AggregatorName::Bulyan(Bulyan {
                f: count("aggregator.f", byzantine, (f, 0), Some)?,
            }),
        })
    }
}

impl From<AggregatorName> for AggregatorSpec {
    fn from(name: AggregatorName) -> Self {
        let table = |beta, f: Option<usize>, m: Option<usize>| AggregatorSpec::Table {
            kind: name.as_str().to_owned(),
            beta,
            f: f.map(|f| f as i64),
            m: m.map(|m| m as i64),
        };
        match name {
            AggregatorName::TrimmedMean(t) => table(Some(t.beta.get()), None, None),
            AggregatorName::Krum(k) => table(None, Some(k.f), Some(k.m.get())),
            AggregatorName::Bulyan(b) => table(None, Some(b.f), None),
            _ => AggregatorSpec::Name(name.as_str().to_owned()),
        }
    }
}

impl Serialize for AggregatorSpec {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            AggregatorSpec::Name(name) => serializer.serialize_str(name),
            AggregatorSpec::Table { kind, beta, f, m } => {
                let mut map = serializer.serialize_map(None)?;
                map.serialize_entry("kind", kind)?;
                if let Some(beta) = beta {
                    map.serialize_entry("beta", beta)?;
                }
                if let Some(f) = f {
                    map.serialize_entry("f", f)?;
                }
                if let Some(m) = m {
                    map.serialize_entry("m", m)?;
                }
                map.end()
            }
        }
    }
}

const FIELDS: &[&str] = &["kind", "beta", "f", "m"];

/// A name or a table, read without the catch-all message of an untagged enum: an unknown or a
/// repeated key is named.
struct SpecVisitor;

impl<'de> Visitor<'de> for SpecVisitor {
    type Value = AggregatorSpec;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an aggregator name, or a table { kind = \"...\", ... } of one with parameters")
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<AggregatorSpec, E> {
        Ok(AggregatorSpec::Name(name.to_owned()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<AggregatorSpec, A::Error> {
        let (mut kind, mut beta, mut f, mut m) = (None, None, None, None);
        fn once<T, E: de::Error>(slot: &mut Option<T>, key: &'static str, v: T) -> Result<(), E> {
            match slot.replace(v) {
                Some(_) => Err(E::duplicate_field(key)),
                None => Ok(()),
            }
        }
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "kind" => once(&mut kind, "kind", map.next_value::<String>()?)?,
                "beta" => once(&mut beta, "beta", map.next_value::<f64>()?)?,
                "f" => once(&mut f, "f", map.next_value::<i64>()?)?,
                "m" => once(&mut m, "m", map.next_value::<i64>()?)?,
                other => return Err(de::Error::unknown_field(other, FIELDS)),
            }
        }
        let kind = kind.ok_or_else(|| de::Error::missing_field("kind"))?;
        Ok(AggregatorSpec::Table { kind, beta, f, m })
    }
}

impl<'de> Deserialize<'de> for AggregatorSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(SpecVisitor)
    }
}
