//! How many connections may wait to authenticate at once: in all, and from one source address.
//! A connection holds a [`Slot`] from its accept until it authenticates or closes, so peers
//! without the secret can hold at most `global` slots, each for at most the handshake deadline.

use crate::refusal::Refusal;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Debug)]
pub(crate) struct Admission {
    global: Arc<Semaphore>,
    per_address: usize,
    waiting: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place among those waiting to authenticate; dropping it frees the place.
#[derive(Debug)]
pub(crate) struct Slot {
    _global: OwnedSemaphorePermit,
    address: IpAddr,
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
        let mut waiting = self.lock();
        if waiting.get(&address).copied().unwrap_or(0) >= self.per_address {
            return Err(Refusal::TooManyFromAddress);
        }
        let permit = self
            .global
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refusal::TooManyUnauthenticated)?;
        *waiting.entry(address).or_insert(0) += 1;
        Ok(Slot {
            _global: permit,
            address,
            admission: self.clone(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.waiting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut waiting = self.admission.lock();
        if let Some(n) = waiting.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                waiting.remove(&self.address);
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
        assert_eq!(admission.lock().get(&a), Some(&5));
        drop(slots);
        assert!(admission.lock().is_empty());
    }
}
