//! A map looked up on every review (the view's, the outbox's per-pod limits): foldhash rather
//! than SipHash, a fifth of the cost per key, seeded at random as SipHash is.

pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
