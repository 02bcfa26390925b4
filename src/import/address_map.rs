//! Caches keyed by an object's address (types, dtypes), for the importers that remember what
//! they found per type or per dtype.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Caches keyed by an object's address (types, dtypes): the address is the hash, mixed once.
/// SipHash, the standard default, cost as much as the rest of an import.
pub type AddressMap<V> = HashMap<usize, V, BuildHasherDefault<AddressHasher>>;

#[derive(Default)]
pub struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_usize(&mut self, address: usize) {
        // Fibonacci hashing; objects are 16-byte aligned, so the low bits carry nothing.
        self.0 = ((address as u64) >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}
