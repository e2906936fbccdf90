//! The build of the tensor-core prefill attention (`kernels/prefill_mma.cu`) for a device and a
//! KV pool: warps a block, keys a tile, and blocks an SM.
//!
//! Measured on the H200 (BENCHMARKS.md, seventeenth pass), Qwen3-8B's attention shape:
//! - two tiles of 16 rows a warp (each key and value fragment loaded feeds two products) were
//!   1.15-1.18x faster than one from a bf16 pool and 1.31-1.34x from an fp8 one;
//! - 64-key tiles spill a few registers at head_dim 128 and were 6% faster than 32-key ones,
//!   which do not;
//! - eight warps a block were 4% slower than four from a bf16 pool but 11% faster from an fp8
//!   one, whose tiles a block widens to bf16 once for all its rows.

use crate::kv_pool::PoolDtype;

/// Tiles of 16 (token, head) rows a warp takes, as the kernel's `PM_MT`.
const TILES: usize = 2;
/// Builds to try, best first, as (warps a block, keys a tile): the first whose shared memory a
/// block may have is taken.
const BF16_BUILDS: [(usize, usize); 2] = [(4, 64), (4, 32)];
const FP8_BUILDS: [(usize, usize); 4] = [(8, 64), (8, 32), (4, 64), (4, 32)];
/// Most warps an SM the launch bounds ask for: at two tiles a warp a thread takes 255
/// registers, room for eight warps (two blocks of four, or one of eight).
const MAX_WARPS: usize = 8;
/// The most query heads a KV head may have: a block of four warps' rows.
pub const MAX_GROUP: usize = 16 * TILES * 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmaShape {
    /// Warps a block (`PM_WARPS`).
    pub warps: usize,
    /// Keys a tile (`PM_KN`).
    pub keys: usize,
    /// Blocks an SM the launch bounds ask for (`PM_MIN_BLOCKS`).
    pub blocks: usize,
}

impl MmaShape {
    /// The shape for `head_dim` and `dtype` on a device whose blocks may have `block_shared`
    /// bytes of shared memory and SMs `sm_shared`: the first build that fits a block, asking
    /// for as many blocks an SM as fit, up to `MAX_WARPS` warps, so that registers are not
    /// capped for blocks that could never be resident. `None` when none fits.
    pub fn choose(
        head_dim: usize,
        dtype: PoolDtype,
        block_shared: usize,
        sm_shared: usize,
    ) -> Option<Self> {
        let builds: &[(usize, usize)] = match dtype {
            PoolDtype::Bf16 => &BF16_BUILDS,
            PoolDtype::Fp8 => &FP8_BUILDS,
        };
        builds
            .iter()
            .map(|&(warps, keys)| Self {
                warps,
                keys,
                blocks: 1,
            })
            .find(|s| s.shared_bytes(head_dim) <= block_shared)
            .map(|s| Self {
                // The driver reserves 1 KiB of each block's shared memory (compute capability
                // 8.0 on).
                blocks: (sm_shared / (s.shared_bytes(head_dim) + 1024))
                    .clamp(1, MAX_WARPS / s.warps),
                ..s
            })
    }

    /// (token, head) rows a block takes.
    pub fn rows(&self) -> usize {
        16 * TILES * self.warps
    }

    pub fn threads(&self) -> usize {
        32 * self.warps
    }

    /// Dynamic shared memory a block takes, as the kernel's `PM_SMEM_BYTES`: two buffers of a
    /// key tile and its values, then the block's queries, bf16 rows of `head_dim + 8` (an fp8
    /// pool's staging fits in the buffers).
    pub fn shared_bytes(&self, head_dim: usize) -> usize {
        (2 * 2 * self.keys + self.rows()) * (head_dim + 8) * 2
    }

    /// The kernel's defines for this shape.
    pub fn defines(&self) -> [(&'static str, String); 4] {
        [
            ("PM_WARPS", self.warps.to_string()),
            ("PM_MT", TILES.to_string()),
            ("PM_KN", self.keys.to_string()),
            ("PM_MIN_BLOCKS", self.blocks.to_string()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_follows_the_pool_and_the_shared_memory() {
        let shape = |warps, keys, blocks| {
            Some(MmaShape {
                warps,
                keys,
                blocks,
            })
        };
        let choose = |d, dtype, block_kib: usize, sm_kib: usize| {
            MmaShape::choose(d, dtype, block_kib << 10, sm_kib << 10)
        };
        let (bf16, fp8) = (PoolDtype::Bf16, PoolDtype::Fp8);
        // Hopper (227 KiB a block, 228 an SM).
        assert_eq!(choose(128, bf16, 227, 228), shape(4, 64, 2));
        assert_eq!(choose(64, bf16, 227, 228), shape(4, 64, 2));
        assert_eq!(choose(128, fp8, 227, 228), shape(8, 64, 1));
        assert_eq!(choose(64, fp8, 227, 228), shape(8, 64, 1));
        // A100 (163, 164).
        assert_eq!(choose(128, bf16, 163, 164), shape(4, 64, 1));
        assert_eq!(choose(64, bf16, 163, 164), shape(4, 64, 2));
        assert_eq!(choose(128, fp8, 163, 164), shape(8, 64, 1));
        // Compute capability 8.6 and 8.9 (99, 100).
        assert_eq!(choose(128, bf16, 99, 100), shape(4, 32, 1));
        assert_eq!(choose(64, bf16, 99, 100), shape(4, 64, 1));
        assert_eq!(choose(128, fp8, 99, 100), shape(4, 32, 1));
        assert_eq!(choose(64, fp8, 99, 100), shape(8, 64, 1));
        assert_eq!(choose(128, bf16, 0, 0), None);
        for d in [32, 64, 96, 128] {
            for dtype in [bf16, fp8] {
                let s = choose(d, dtype, 227, 228).unwrap();
                assert!(s.rows() >= MAX_GROUP && s.shared_bytes(d) <= 227 << 10);
                assert!(s.warps * s.blocks <= MAX_WARPS);
            }
        }
    }
}
