//! Policies are chosen by kebab-case name (in a config file or on the command line). Each policy
//! family is an enum with `ALL` and `as_str`; `policy_names!` derives `Display` and a `FromStr`
//! whose error lists every valid name, so a typo tells the user what would have worked.
//!
//! The families: sharding strategies ([`crate::sharding::plan::StrategySpec`], which also takes
//! `+scaled`/`+cliplr` modifiers), joint samplers ([`crate::sampling::SamplerName`]), client
//! selectors ([`crate::selection::SelectorName`]) and aggregators
//! ([`crate::aggregation::AggregatorName`], whose robust members take parameters, so it writes
//! its own `Display` and `FromStr` and is written as a name or a table,
//! `crate::aggregation::robust`'s spec).

/// Implements `Display` and `FromStr` for a policy-name enum with `ALL` and `as_str`.
#[macro_export]
macro_rules! policy_names {
    ($ty:ty, $kind:literal) => {
        impl ::std::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $ty {
            type Err = $crate::StrategyError;

            fn from_str(s: &str) -> $crate::Result<Self> {
                <$ty>::ALL
                    .into_iter()
                    .find(|n| n.as_str() == s)
                    .ok_or_else(|| $crate::StrategyError::UnknownName {
                        kind: $kind,
                        name: s.to_owned(),
                        valid: <$ty>::ALL.map(|n| n.as_str()).join(", "),
                    })
            }
        }
    };
}
