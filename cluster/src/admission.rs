//! How many connections may wait to authenticate at once: in all, and from one source address.
//! A connection holds a [`Slot`] from its accept until it authenticates or closes, so peers
//! without the secret can hold at most `global` slots, each for at most the handshake deadline.
//!
//! A "source address" is an IPv4 address, or an IPv6 /64: one host or link is usually given a
//! whole /64 and can pick any address in it, so counting IPv6 addresses one by one would let a
//! single machine take every slot.

use crate::refusal::Refusal;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Debug)]
pub(crate) struct Admission {
    global: Arc<Semaphore>,
    per_address: usize,
    waiting: Mutex<HashMap<Source, usize>>,
}

/// What the per-address cap counts: an IPv4 address (IPv4-mapped IPv6 included) or an IPv6 /64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Source {
    V4(Ipv4Addr),
    V6Prefix64(u64),
}

impl From<IpAddr> for Source {
    fn from(address: IpAddr) -> Self {
        match address {
            IpAddr::V4(v4) => Source::V4(v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Source::V4(v4),
                None => Source::V6Prefix64((v6.to_bits() >> 64) as u64),
            },
        }
    }
}

/// One connection's place among those waiting to authenticate; dropping it frees the place.
#[derive(Debug)]
pub(crate) struct Slot {
    _global: OwnedSemaphorePermit,
    source: Source,
    admission: Arc<Admission>,
}

impl Admission {
    pub(crate) fn new(global: usize, per_address: usize) -> Self {
        Self {
            global: Arc::new(Semaphore::new(global)),
            per_address,
            waiting: Mutex::new(HashMap::new()),
        }
    }

    /// A slot for a connection from `address`, or why there is none.
    pub(crate) fn admit(self: &Arc<Self>, address: IpAddr) -> Result<Slot, Refusal> {
        let source = Source::from(address);
        let mut waiting = self.lock();
        if waiting.get(&source).copied().unwrap_or(0) >= self.per_address {
            return Err(Refusal::TooManyFromAddress);
        }
        let permit = self
            .global
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refusal::TooManyUnauthenticated)?;
        *waiting.entry(source).or_insert(0) += 1;
        Ok(Slot {
            _global: permit,
            source,
            admission: self.clone(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Source, usize>> {
        crate::lock(&self.waiting)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut waiting = self.admission.lock();
        if let Some(n) = waiting.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                waiting.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_cannot_take_every_slot_and_freed_slots_return() {
        let admission = Arc::new(Admission::new(3, 2));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = admission.admit(a).unwrap();
        let _a2 = admission.admit(a).unwrap();
        assert_eq!(admission.admit(a).unwrap_err(), Refusal::TooManyFromAddress);
        let _b1 = admission.admit(b).unwrap();
        assert_eq!(
            admission.admit(b).unwrap_err(),
            Refusal::TooManyUnauthenticated
        );
        drop(a1);
        let _b2 = admission.admit(b).unwrap();
        assert_eq!(
            admission.admit(a).unwrap_err(),
            Refusal::TooManyUnauthenticated
        );
    }

    #[test]
    fn an_address_is_forgotten_once_its_last_slot_is_freed() {
        let admission = Arc::new(Admission::new(8, 8));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let slots: Vec<_> = (0..5).map(|_| admission.admit(a).unwrap()).collect();
        assert_eq!(admission.lock().get(&Source::from(a)), Some(&5));
        drop(slots);
        assert!(admission.lock().is_empty());
    }

    #[test]
    fn an_ipv6_64_is_one_source_and_a_mapped_ipv4_is_its_address() {
        let admission = Arc::new(Admission::new(16, 2));
        let admit = |s: &str| admission.admit(s.parse().unwrap());
        // Two addresses of one /64 share its cap; the next /64 has its own.
        let _x = admit("2001:db8:0:1::1").unwrap();
        let _y = admit("2001:db8:0:1:ffff:1:2:3").unwrap();
        assert_eq!(
            admit("2001:db8:0:1::beef").unwrap_err(),
            Refusal::TooManyFromAddress
        );
        let _z = admit("2001:db8:0:2::1").unwrap();
        // An IPv4 peer counts the same whether the socket reports it mapped or not.
        let _v4 = admit("192.0.2.7").unwrap();
        let _mapped = admit("::ffff:192.0.2.7").unwrap();
        assert_eq!(admit("192.0.2.7").unwrap_err(), Refusal::TooManyFromAddress);
        // IPv4 addresses stay one by one.
        let _other = admit("192.0.2.8").unwrap();
    }
}
