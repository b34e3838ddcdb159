//! File descriptors of a server node. Every connection waiting to authenticate holds one, and
//! so does every file of the run (checkpoint, metrics, log): with the soft limit many systems
//! start a process with (1024, or 256), a flood of connections used to leave none for the
//! checkpoint and the run died. So [`raise`] lifts the soft limit to the hard one at start, and
//! the number of connections that may wait to authenticate is sized from what it leaves after
//! a [`reserve`].

use crate::error::Error;

/// Descriptors kept for everything but connections waiting to authenticate, besides one per
/// client (each client node holds one session, and hosts at least one client): the run's files,
/// the `/metrics` connections (at most 64), the runtime's own, and room for a connection being
/// refused.
pub const BASE_RESERVE: u64 = 192;

/// The most connections that wait to authenticate by default, however high the limit.
pub const DEFAULT_MAX_UNAUTHENTICATED: usize = 512;

/// Descriptors kept for everything else by a server of `clients` clients.
pub fn reserve(clients: usize) -> u64 {
    BASE_RESERVE + clients as u64
}

/// Raises this process's soft limit on open files to its hard limit, and returns the limit in
/// force after (the soft limit as it was when it cannot be raised; `u64::MAX` where the
/// platform has none to read).
pub fn raise() -> u64 {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one `rlimit` through a valid pointer.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
            return u64::MAX;
        }
        let before = limit.rlim_cur;
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            // SAFETY: setrlimit reads one `rlimit` through a valid pointer.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                tracing::debug!(
                    "raised the open-file limit from {before} to {}",
                    raised.rlim_cur
                );
                return raised.rlim_cur;
            }
            tracing::warn!(
                "cannot raise the open-file limit from {before} to its hard limit {}",
                limit.rlim_max
            );
        }
        before
    }
    #[cfg(not(unix))]
    {
        u64::MAX
    }
}

/// `--max-unauthenticated` for a server of `clients` clients under the open-file limit `limit`:
/// `requested` if the limit leaves room for it after the [`reserve`], else an error naming the
/// option, the limit and what fits; without a request, [`DEFAULT_MAX_UNAUTHENTICATED`] or what
/// fits, whichever is less.
pub fn max_unauthenticated(
    requested: Option<usize>,
    limit: u64,
    clients: usize,
) -> Result<usize, Error> {
    let reserve = reserve(clients);
    let room = usize::try_from(limit.saturating_sub(reserve)).unwrap_or(usize::MAX);
    if room == 0 {
        return Err(Error::TooFewDescriptors { limit, reserve });
    }
    match requested {
        None => Ok(room.min(DEFAULT_MAX_UNAUTHENTICATED)),
        Some(n) if n <= room => Ok(n),
        Some(n) => Err(Error::MaxUnauthenticatedOverLimit {
            requested: n,
            limit,
            reserve,
            room,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_fits_under_the_limit_with_the_reserve_kept() {
        // A generous limit: the usual default.
        assert_eq!(max_unauthenticated(None, 1 << 20, 6), Ok(512));
        // `ulimit -n 256` with six clients: 256 - 198 = 58 may wait.
        assert_eq!(max_unauthenticated(None, 256, 6), Ok(58));
        assert_eq!(max_unauthenticated(Some(58), 256, 6), Ok(58));
    }

    #[test]
    fn a_value_that_leaves_no_reserve_is_refused_naming_the_option_and_the_limit() {
        let error = max_unauthenticated(Some(1000), 256, 6).unwrap_err();
        let text = error.to_string();
        for part in [
            "--max-unauthenticated 1000",
            "256",
            "at most 58",
            "ulimit -n",
        ] {
            assert!(text.contains(part), "{part} in {text}");
        }
        let error = max_unauthenticated(None, 100, 6).unwrap_err().to_string();
        assert!(
            error.contains("100") && error.contains("ulimit -n"),
            "{error}"
        );
    }

    #[test]
    fn raising_never_lowers_the_limit() {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as in `raise`.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        let raised = raise();
        assert!(raised >= limit.rlim_cur);
    }
}
