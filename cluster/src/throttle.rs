//! The one rate limit of this crate's logging: at most one line per interval for an event a peer
//! (or the operating system) can repeat in a tight loop, each line saying how many went
//! unlogged, so the log can neither hide an event nor be flooded by it. The counters
//! (`fedshard_cluster_*_total`) count every occurrence; the log only samples them.

use std::time::{Duration, Instant};

/// When an event was last logged, and how many of it were not logged since.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Throttle {
    last: Option<Instant>,
    unlogged: u64,
}

impl Throttle {
    /// `Some(n)` when the event at `now` is to be logged, `n` being how many were not logged
    /// since the previous line; `None` when it is only counted.
    pub(crate) fn admit(&mut self, now: Instant, interval: Duration) -> Option<u64> {
        match self.last {
            Some(last) if now.duration_since(last) < interval => {
                self.unlogged += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.unlogged))
            }
        }
    }

    /// Whether the event's next occurrence at `now` would be logged: its last line is an
    /// interval old (or it never had one).
    pub(crate) fn is_quiet(&self, now: Instant, interval: Duration) -> bool {
        self.last
            .is_none_or(|last| now.duration_since(last) >= interval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_event_is_logged_once_per_interval_with_the_count_it_missed() {
        let mut throttle = Throttle::default();
        let second = Duration::from_secs(1);
        let t0 = Instant::now();
        assert!(throttle.is_quiet(t0, second));
        assert_eq!(throttle.admit(t0, second), Some(0));
        assert!(!throttle.is_quiet(t0, second));
        // An accept failing every 100 ms: nine silent ones, then a line that counts them.
        for i in 1..10 {
            assert_eq!(throttle.admit(t0 + i * second / 10, second), None);
        }
        assert!(throttle.is_quiet(t0 + second, second));
        assert_eq!(throttle.admit(t0 + second, second), Some(9));
        assert_eq!(throttle.admit(t0 + 3 * second, second), Some(0));
    }
}
