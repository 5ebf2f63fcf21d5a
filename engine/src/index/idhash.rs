//! [`IdHashing`]: a cheap, seeded hash for `u64` ids (stream ids) in the writer's maps.

use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

/// Hashing for stream ids: one folded 64 × 64 → 128-bit multiply of the id and a per-process
/// random seed, instead of SipHash (the writer hashes each appended event's stream id a few
/// times). Clients choose the ids they append to (unknown ones are cached as absent), so the
/// seed keeps them from picking ids that collide.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IdHashing {
    seed: u64,
}

impl Default for IdHashing {
    fn default() -> Self {
        static SEED: OnceLock<u64> = OnceLock::new();
        let seed = *SEED.get_or_init(|| {
            std::collections::hash_map::RandomState::new().hash_one(0x243f_6a88_85a3_08d3_u64)
        });
        Self { seed }
    }
}

impl BuildHasher for IdHashing {
    type Hasher = IdHasher;

    fn build_hasher(&self) -> IdHasher {
        IdHasher { state: self.seed }
    }
}

/// The [`Hasher`] of [`IdHashing`]; meant for one `u64`, correct (if slower) for any input.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IdHasher {
    state: u64,
}

impl IdHasher {
    fn mix(&mut self, x: u64) {
        let folded = u128::from(self.state ^ x) * 0x9e37_79b9_7f4a_7c15_u128;
        // The high half folded onto the low half: every input bit reaches the low bits.
        self.state = (folded as u64) ^ ((folded >> 64) as u64);
    }
}

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.state
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.mix(x);
    }
}
