//! The grid and block dimensions of AtomRL's CUDA launches, as plain numbers: the CUDA build
//! turns them into cudarc's `LaunchConfig` (`atomrl_core::cuda`, feature `cuda`), and the CPU
//! emulation of the kernels (atomrl-cuda-sim) runs them with the very same dimensions.

/// Grid and block dimensions `([x, y, z], [x, y, z])`.
pub type Dims = ([u32; 3], [u32; 3]);

/// An elementwise launch over `n` elements: 256 threads per block, at most 65,535 blocks (the
/// kernels stride over the rest).
///
/// ```
/// assert_eq!(atomrl_core::launch_dims::elementwise(1_000), ([4, 1, 1], [256, 1, 1]));
/// assert_eq!(atomrl_core::launch_dims::elementwise(0).0, [1, 1, 1]);
/// ```
pub fn elementwise(n: usize) -> Dims {
    ([n.div_ceil(256).clamp(1, 65_535) as u32, 1, 1], [256, 1, 1])
}

/// One block per row of `width` elements: a multiple of 32 threads, at most 256 (the row
/// kernels of `model.cu` and `logprob.cu` reduce over the block).
///
/// ```
/// assert_eq!(atomrl_core::launch_dims::rows(6, 40), ([6, 1, 1], [64, 1, 1]));
/// assert_eq!(atomrl_core::launch_dims::rows(2, 151_936).1, [256, 1, 1]);
/// ```
pub fn rows(rows: usize, width: usize) -> Dims {
    let threads = width.div_ceil(32).clamp(1, 8) as u32 * 32;
    ([rows.max(1) as u32, 1, 1], [threads, 1, 1])
}

/// The squared-norm launch over `n` elements (`atomrl_sq_norm_part_f32`): a fixed grid of one
/// block per 2,048 elements, 1 to 512 blocks of 256 threads, each writing one partial sum, so
/// that the norm is the same on every run.
///
/// ```
/// assert_eq!(atomrl_core::launch_dims::sq_norm(10_000), ([5, 1, 1], [256, 1, 1]));
/// ```
pub fn sq_norm(n: usize) -> Dims {
    ([n.div_ceil(2048).clamp(1, 512) as u32, 1, 1], [256, 1, 1])
}

/// A multi-tensor launch over tensors of `lens` elements (`atomrl_adamw_multi_f32`,
/// `atomrl_sq_norm_multi_f32`): each tensor gets the blocks [`sq_norm`] would give it alone, in
/// one grid of their sum. Returns the launch and each tensor's block count.
///
/// ```
/// let (dims, blocks) = atomrl_core::launch_dims::multi_tensor(&[10_000, 3, 4_000_000]);
/// assert_eq!(blocks, vec![5, 1, 512]);
/// assert_eq!(dims, ([518, 1, 1], [256, 1, 1]));
/// ```
pub fn multi_tensor(lens: &[usize]) -> (Dims, Vec<usize>) {
    let blocks: Vec<usize> = lens.iter().map(|&n| sq_norm(n).0[0] as usize).collect();
    let total: usize = blocks.iter().sum();
    (([total.max(1) as u32, 1, 1], [256, 1, 1]), blocks)
}

/// The RMSNorm weight-gradient launch (`atomrl_rms_norm_dw_part_*`): blocks of 256 threads
/// across the `h` columns, one grid row per chunk of rows.
///
/// ```
/// assert_eq!(atomrl_core::launch_dims::rms_norm_dw(300, 3), ([2, 3, 1], [256, 1, 1]));
/// ```
pub fn rms_norm_dw(h: usize, chunks: usize) -> Dims {
    ([h.div_ceil(256) as u32, chunks as u32, 1], [256, 1, 1])
}

/// Threads per block of the draw's first launch (`PICK_THREADS` in `decode.cu`).
pub const PICK_THREADS: u32 = 256;

/// The draw's first launch (`atomrl_pick_part_*`): block `(c, b)` for chunk `c` of row `b`.
///
/// ```
/// assert_eq!(atomrl_core::launch_dims::pick_part(4, 3), ([4, 3, 1], [256, 1, 1]));
/// ```
pub fn pick_part(chunks: usize, rows: usize) -> Dims {
    ([chunks as u32, rows as u32, 1], [PICK_THREADS, 1, 1])
}

/// The draw's second launch (`atomrl_pick_finish_*`): one thread per row, 64 a block.
///
/// ```
/// assert_eq!(atomrl_core::launch_dims::pick_finish(70), ([2, 1, 1], [64, 1, 1]));
/// ```
pub fn pick_finish(rows: usize) -> Dims {
    ([rows.div_ceil(64) as u32, 1, 1], [64, 1, 1])
}

/// Head dims up to this take the FlashAttention kernels (`FA_MAX_D` in `attention.cu`).
pub const FLASH_MAX_HEAD_DIM: usize = 128;

/// Query rows of a FlashAttention forward block, one per warp (`FA_FWD_ROWS`).
pub const FLASH_FWD_ROWS: usize = 16;

/// Query rows of a FlashAttention dq block (`FA_DQ_ROWS`).
pub const FLASH_DQ_ROWS: usize = 8;

/// Keys of a FlashAttention dk/dv block (`FA_KV_ROWS`).
pub const FLASH_KV_ROWS: usize = 8;

/// `atomrl_flash_first_key_*`: one warp per batch row.
///
/// ```
/// assert_eq!(atomrl_core::launch_dims::flash_first_key(3), ([3, 1, 1], [32, 1, 1]));
/// ```
pub fn flash_first_key(n: usize) -> Dims {
    ([n.max(1) as u32, 1, 1], [32, 1, 1])
}

/// `atomrl_flash_fwd_*` over `q [n, heads, l, d]`: block `(t, h, n)` for the tile `t` of
/// [`FLASH_FWD_ROWS`] queries of head `h`, a warp per query.
///
/// ```
/// assert_eq!(atomrl_core::launch_dims::flash_fwd(2, 14, 40), ([3, 14, 2], [512, 1, 1]));
/// ```
pub fn flash_fwd(n: usize, heads: usize, l: usize) -> Dims {
    let tiles = l.div_ceil(FLASH_FWD_ROWS).max(1) as u32;
    (
        [tiles, heads as u32, n as u32],
        [FLASH_FWD_ROWS as u32 * 32, 1, 1],
    )
}

/// Warps of a tensor-core FlashAttention forward block (`FA_TC_WARPS`).
pub const FLASH_TC_WARPS: usize = 4;

/// `atomrl_flash_fwd_tc_*` (bf16, f16): the tiles of [`flash_fwd`], [`FLASH_TC_WARPS`] warps a
/// block.
///
/// ```
/// assert_eq!(atomrl_core::launch_dims::flash_fwd_tc(2, 14, 40), ([3, 14, 2], [128, 1, 1]));
/// ```
pub fn flash_fwd_tc(n: usize, heads: usize, l: usize) -> Dims {
    (flash_fwd(n, heads, l).0, [FLASH_TC_WARPS as u32 * 32, 1, 1])
}

/// `atomrl_flash_bwd_dq_*`: as [`flash_fwd`] with tiles of [`FLASH_DQ_ROWS`] queries.
///
/// ```
/// assert_eq!(atomrl_core::launch_dims::flash_bwd_dq(2, 14, 40), ([5, 14, 2], [256, 1, 1]));
/// ```
pub fn flash_bwd_dq(n: usize, heads: usize, l: usize) -> Dims {
    let tiles = l.div_ceil(FLASH_DQ_ROWS).max(1) as u32;
    (
        [tiles, heads as u32, n as u32],
        [FLASH_DQ_ROWS as u32 * 32, 1, 1],
    )
}

/// Rows (queries for dq, keys for dk and dv) of a tensor-core FlashAttention backward block
/// (`FA_TC_ROWS`).
pub const FLASH_TC_ROWS: usize = 16;

/// `atomrl_flash_bwd_dq_tc_*` (bf16, f16): tiles of [`FLASH_TC_ROWS`] queries,
/// [`FLASH_TC_WARPS`] warps a block.
///
/// ```
/// assert_eq!(atomrl_core::launch_dims::flash_bwd_dq_tc(2, 14, 40), ([3, 14, 2], [128, 1, 1]));
/// ```
pub fn flash_bwd_dq_tc(n: usize, heads: usize, l: usize) -> Dims {
    let tiles = l.div_ceil(FLASH_TC_ROWS).max(1) as u32;
    (
        [tiles, heads as u32, n as u32],
        [FLASH_TC_WARPS as u32 * 32, 1, 1],
    )
}

/// `atomrl_flash_bwd_dkv_*` over `k, v [n, kv_heads, s, d]`: block `(t, g, n)` for the tile
/// `t` of [`FLASH_KV_ROWS`] keys of key/value head `g`, a warp per key.
///
/// ```
/// assert_eq!(atomrl_core::launch_dims::flash_bwd_dkv(2, 2, 40), ([5, 2, 2], [256, 1, 1]));
/// ```
pub fn flash_bwd_dkv(n: usize, kv_heads: usize, s: usize) -> Dims {
    let tiles = s.div_ceil(FLASH_KV_ROWS).max(1) as u32;
    (
        [tiles, kv_heads as u32, n as u32],
        [FLASH_KV_ROWS as u32 * 32, 1, 1],
    )
}

/// `atomrl_flash_bwd_dkv_tc_*` (bf16, f16): tiles of [`FLASH_TC_ROWS`] keys, [`FLASH_TC_WARPS`]
/// warps a block.
///
/// ```
/// assert_eq!(atomrl_core::launch_dims::flash_bwd_dkv_tc(2, 2, 40), ([3, 2, 2], [128, 1, 1]));
/// ```
pub fn flash_bwd_dkv_tc(n: usize, kv_heads: usize, s: usize) -> Dims {
    let tiles = s.div_ceil(FLASH_TC_ROWS).max(1) as u32;
    (
        [tiles, kv_heads as u32, n as u32],
        [FLASH_TC_WARPS as u32 * 32, 1, 1],
    )
}
