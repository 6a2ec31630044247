//! Hashing for the tables the hot path looks up per packet by a number this side chose: memory
//! keys (random, `MrTable::insert`) and QP numbers (`Endpoint::alloc_qpn`).

use std::hash::{BuildHasher, Hasher};

/// A multiplicative (Fibonacci) hash for `u32` keys this side hands out. Only this side inserts
/// keys, so a peer choosing the numbers it sends can only look up: it cannot build collisions,
/// and SipHash's resistance to flooding buys nothing here, at several times the cost.
#[derive(Default, Clone, Copy)]
pub(crate) struct LocalKeys;

impl BuildHasher for LocalKeys {
    type Hasher = LocalKeyHasher;
    fn build_hasher(&self) -> LocalKeyHasher {
        LocalKeyHasher(0)
    }
}

pub(crate) struct LocalKeyHasher(u64);

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for LocalKeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(GOLDEN);
        }
    }
    fn write_u32(&mut self, k: u32) {
        // The high bits (hashbrown's tags) and the low bits (its buckets) both vary.
        self.0 = (k as u64 ^ self.0).wrapping_mul(GOLDEN);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    #[test]
    fn neighbouring_keys_spread_over_tags_and_buckets() {
        // QPNs are consecutive within a slot: their hashes must differ in the top 7 bits
        // (hashbrown's tag) and in the low bits (the bucket), or lookups degrade to scans.
        let tags: HashSet<u64> = (0x1_0011u32..0x1_0011 + 128)
            .map(|k| LocalKeys.hash_one(k) >> 57)
            .collect();
        assert!(tags.len() > 64, "{} distinct tags of 128", tags.len());
        let buckets: HashSet<u64> = (0x1_0011u32..0x1_0011 + 128)
            .map(|k| LocalKeys.hash_one(k) & 127)
            .collect();
        assert!(
            buckets.len() > 64,
            "{} distinct buckets of 128",
            buckets.len()
        );
        let mut m: HashMap<u32, u32, LocalKeys> = HashMap::default();
        for k in 0..1000u32 {
            m.insert(k * 7, k);
        }
        assert!((0..1000u32).all(|k| m[&(k * 7)] == k));
        assert!(!m.contains_key(&1));
    }
}
