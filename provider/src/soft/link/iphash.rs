//! A fast hasher for maps keyed by peer address, looked up for every
//! datagram a link sends. `std`'s SipHash resists hash flooding, which a
//! map of the peers a device itself chose to talk to does not need, and it
//! cost ~200 instructions per lookup of an `IpAddr`.

use std::hash::{BuildHasherDefault, Hasher};

/// FxHash-style multiplicative hashing (as rustc's `FxHasher`).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IpHasher(u64);

const K: u64 = 0xf135_7aea_2e62_a9c5;

impl Hasher for IpHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(K);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
    }
}

/// `BuildHasher` for address-keyed maps of links.
pub(crate) type IpHash = BuildHasherDefault<IpHasher>;

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::net::IpAddr;

    use super::IpHash;

    #[test]
    fn addresses_of_both_families_are_told_apart() {
        let mut m: HashMap<IpAddr, u32, IpHash> = HashMap::default();
        let addrs: Vec<IpAddr> = ["127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1", "fd00::1"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        for (i, a) in addrs.iter().enumerate() {
            m.insert(*a, i as u32);
        }
        for (i, a) in addrs.iter().enumerate() {
            assert_eq!(m.get(a), Some(&(i as u32)));
        }
    }
}
