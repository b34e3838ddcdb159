//! Connections a server node closes before they authenticate: why ([`Refusal`]), counted in
//! `fedshard_cluster_sessions_refused_total{reason}` and logged at most once per source address,
//! reason and interval ([`Refusals`], a `Throttle` each), so an attacker can neither hide nor
//! flood the log.

use crate::metrics::ClusterMetrics;
use crate::throttle::Throttle;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Why a connection was closed before its peer authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The TLS handshake failed on bytes that are not TLS: a node without `--tls-ca`.
    TlsPlaintext,
    /// Mutual TLS: the peer presented no client certificate.
    TlsNoClientCert,
    /// Mutual TLS: the peer's client certificate is not signed by `--tls-client-ca` (or is
    /// expired, or not for client use).
    TlsBadClientCert,
    /// A TLS handshake sent to a server without TLS: a node given `--tls-ca` against a server
    /// started without `--tls-cert`.
    TlsOnPlaintext,
    /// Any other TLS failure (the peer distrusts our certificate, no common version, …).
    TlsFailed,
    /// TLS and the secret's challenge not done within `--handshake-timeout`.
    HandshakeTimeout,
    /// The session closed before the peer proved it holds the secret (another secret, or not a
    /// fedshard node).
    NotAuthenticated,
    /// A frame above `--preauth-frame-cap` before authenticating.
    FrameTooLarge,
    /// `--max-unauthenticated` connections were already waiting to authenticate.
    TooManyUnauthenticated,
    /// `--max-unauthenticated-per-ip` connections from this address were already waiting.
    TooManyFromAddress,
}

impl Refusal {
    pub const ALL: [Refusal; 10] = [
        Refusal::TlsPlaintext,
        Refusal::TlsNoClientCert,
        Refusal::TlsBadClientCert,
        Refusal::TlsOnPlaintext,
        Refusal::TlsFailed,
        Refusal::HandshakeTimeout,
        Refusal::NotAuthenticated,
        Refusal::FrameTooLarge,
        Refusal::TooManyUnauthenticated,
        Refusal::TooManyFromAddress,
    ];

    /// The `reason` label of the Prometheus counter.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::TlsPlaintext => "tls_plaintext",
            Refusal::TlsNoClientCert => "tls_no_client_cert",
            Refusal::TlsBadClientCert => "tls_bad_client_cert",
            Refusal::TlsOnPlaintext => "tls_on_plaintext",
            Refusal::TlsFailed => "tls_failed",
            Refusal::HandshakeTimeout => "handshake_timeout",
            Refusal::NotAuthenticated => "not_authenticated",
            Refusal::FrameTooLarge => "frame_too_large",
            Refusal::TooManyUnauthenticated => "too_many_unauthenticated",
            Refusal::TooManyFromAddress => "too_many_from_address",
        }
    }

    /// What an operator reads in the log, naming the side and flag most likely at fault.
    pub fn explanation(self) -> &'static str {
        match self {
            Refusal::TlsPlaintext => {
                "it does not speak TLS (a node started without --tls-ca, or not a fedshard node)"
            }
            Refusal::TlsNoClientCert => {
                "it presented no client certificate, and --tls-client-ca requires one (start the node with --tls-cert and --tls-key)"
            }
            Refusal::TlsBadClientCert => {
                "its client certificate is not one --tls-client-ca accepts (another CA, expired, or not for client use)"
            }
            Refusal::TlsOnPlaintext => {
                "it speaks TLS and this server does not (a node given --tls-ca: drop it there, or start this server with --tls-cert and --tls-key)"
            }
            Refusal::TlsFailed => {
                "the TLS handshake failed (often: the node's --tls-ca did not sign this server's --tls-cert)"
            }
            Refusal::HandshakeTimeout => {
                "it did not finish the handshake (TLS if on, then the secret's challenge) within --handshake-timeout"
            }
            Refusal::NotAuthenticated => {
                "it closed before authenticating (another secret, or not a fedshard node)"
            }
            Refusal::FrameTooLarge => {
                "it sent a frame above --preauth-frame-cap before authenticating"
            }
            Refusal::TooManyUnauthenticated => {
                "--max-unauthenticated connections were already waiting to authenticate"
            }
            Refusal::TooManyFromAddress => {
                "--max-unauthenticated-per-ip connections from its address were already waiting to authenticate"
            }
        }
    }
}

/// Per source address and reason, a [`Throttle`] of its log lines.
#[derive(Debug, Default)]
struct RateLimit {
    sources: HashMap<(IpAddr, Refusal), Throttle>,
}

impl RateLimit {
    /// Sources remembered at most; beyond, those quiet for an interval are forgotten first.
    const MAX_SOURCES: usize = 4096;

    /// `Some(n)` when a refusal from `source` at `now` is to be logged, `n` being how many were
    /// not logged since its previous line; `None` when it is only counted.
    fn admit(
        &mut self,
        source: (IpAddr, Refusal),
        now: Instant,
        interval: Duration,
    ) -> Option<u64> {
        if self.sources.len() >= Self::MAX_SOURCES && !self.sources.contains_key(&source) {
            self.sources
                .retain(|_, throttle| !throttle.is_quiet(now, interval));
            if self.sources.len() >= Self::MAX_SOURCES {
                // Every remembered source is recent: an attack from many addresses. Log none
                // of the new ones (they are still counted).
                return None;
            }
        }
        self.sources.entry(source).or_default().admit(now, interval)
    }
}

/// Counts every refusal by reason and logs it, at most one line per source address and
/// interval. Cloning shares the counters and the rate limit.
#[derive(Clone)]
pub struct Refusals {
    metrics: ClusterMetrics,
    interval: Duration,
    limit: Arc<Mutex<RateLimit>>,
}

impl Refusals {
    /// At most one line per source address, reason and minute.
    pub const LOG_INTERVAL: Duration = Duration::from_secs(60);

    pub fn new(metrics: ClusterMetrics) -> Self {
        Self {
            metrics,
            interval: Self::LOG_INTERVAL,
            limit: Arc::default(),
        }
    }

    /// Counts a refusal of a connection from `peer` and logs it if `peer`'s address has had no
    /// line for this reason for an interval.
    pub fn refuse(&self, peer: std::net::SocketAddr, why: Refusal) {
        self.metrics.session_refused(why);
        let logged =
            crate::lock(&self.limit).admit((peer.ip(), why), Instant::now(), self.interval);
        match logged {
            Some(0) => {
                tracing::warn!("refused a node session from {peer}: {}", why.explanation());
            }
            Some(missed) => tracing::warn!(
                "refused a node session from {peer}: {} ({missed} more from {} for this reason in the last {} s, see fedshard_cluster_sessions_refused_total)",
                why.explanation(),
                peer.ip(),
                self.interval.as_secs()
            ),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_logged_once_per_reason_and_interval_and_told_how_many_it_missed() {
        let mut limit = RateLimit::default();
        let interval = Duration::from_secs(60);
        let t0 = Instant::now();
        let a = ("10.0.0.1".parse().unwrap(), Refusal::HandshakeTimeout);
        let b = ("10.0.0.2".parse().unwrap(), Refusal::HandshakeTimeout);
        let a_other_reason = (a.0, Refusal::TlsPlaintext);
        assert_eq!(limit.admit(a, t0, interval), Some(0));
        // A thousand more from `a` within the minute: counted, not logged.
        for i in 0..1000 {
            assert_eq!(
                limit.admit(a, t0 + Duration::from_millis(i), interval),
                None
            );
        }
        // Another source has its own line, and so has another reason.
        assert_eq!(limit.admit(b, t0, interval), Some(0));
        assert_eq!(limit.admit(a_other_reason, t0, interval), Some(0));
        // After the interval, `a` logs again and hears of the thousand it missed.
        assert_eq!(limit.admit(a, t0 + interval, interval), Some(1000));
        assert_eq!(limit.admit(a, t0 + interval, interval), None);
    }

    #[test]
    fn the_remembered_sources_stay_bounded_under_an_attack_from_many_addresses() {
        let mut limit = RateLimit::default();
        let interval = Duration::from_secs(60);
        let t0 = Instant::now();
        let logged = (0..20_000u32)
            .filter(|&i| {
                let ip = IpAddr::from(i.to_be_bytes());
                limit
                    .admit((ip, Refusal::FrameTooLarge), t0, interval)
                    .is_some()
            })
            .count();
        assert_eq!(logged, RateLimit::MAX_SOURCES);
        assert_eq!(limit.sources.len(), RateLimit::MAX_SOURCES);
        // Once the old ones are an interval old, new sources are logged again.
        let late = ("192.168.1.1".parse().unwrap(), Refusal::FrameTooLarge);
        assert_eq!(limit.admit(late, t0 + interval, interval), Some(0));
        assert_eq!(limit.sources.len(), 1);
    }

    #[test]
    fn every_reason_has_its_own_label() {
        let labels: std::collections::HashSet<_> = Refusal::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), Refusal::ALL.len());
    }
}
