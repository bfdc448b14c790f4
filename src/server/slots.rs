//! Connection slots: so many open at most, and so many per client address, so that one client
//! reconnecting as fast as it is cut off cannot hold every slot the API server needs.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;

/// Open connections, counted overall and per client address.
pub struct Slots {
    max: usize,
    max_per_peer: usize,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    total: usize,
    /// Only addresses with a connection open: at most `max` entries.
    per_peer: HashMap<IpAddr, usize>,
}

/// Why a connection was not given a slot.
#[derive(Debug, PartialEq, Eq)]
pub enum Full {
    /// Every slot is taken.
    All,
    /// This client has its share.
    Peer,
}

impl Slots {
    pub fn new(max: usize, max_per_peer: usize) -> Arc<Slots> {
        Arc::new(Slots { max, max_per_peer, open: Mutex::default() })
    }

    /// A slot for a connection from `peer`, held until the `Slot` is dropped.
    pub fn take(self: &Arc<Self>, peer: IpAddr) -> Result<Slot, Full> {
        let mut open = self.open.lock();
        if open.total >= self.max {
            return Err(Full::All);
        }
        let mine = open.per_peer.entry(peer).or_default();
        if *mine >= self.max_per_peer {
            return Err(Full::Peer);
        }
        *mine += 1;
        open.total += 1;
        Ok(Slot { slots: self.clone(), peer })
    }
}

/// One open connection's slot.
pub struct Slot {
    slots: Arc<Slots>,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock();
        open.total -= 1;
        if let Some(mine) = open.per_peer.get_mut(&self.peer) {
            *mine -= 1;
            if *mine == 0 {
                open.per_peer.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn a_client_gets_its_share_and_no_more_while_others_still_get_slots() {
        let slots = Slots::new(10, 3);
        let held: Vec<Slot> = (0..3).map(|_| slots.take(ip(1)).unwrap()).collect();
        assert_eq!(slots.take(ip(1)).err(), Some(Full::Peer));
        assert!(slots.take(ip(2)).is_ok());
        drop(held);
        assert!(slots.take(ip(1)).is_ok(), "its slots are given back when its connections close");
    }

    #[test]
    fn no_slot_beyond_the_total_whoever_asks_and_every_slot_comes_back() {
        let slots = Slots::new(4, 3);
        let held: Vec<Slot> = [1, 1, 2, 3].into_iter().map(|i| slots.take(ip(i)).unwrap()).collect();
        assert_eq!(slots.take(ip(4)).err(), Some(Full::All));
        drop(held);
        let open = slots.open.lock();
        assert_eq!((open.total, open.per_peer.len()), (0, 0), "nothing kept for addresses gone");
    }
}
