// FlashAttention for training and prefill: softmax(scale · q·kᵀ + mask)·v and its gradients
// without the [N, H, L, S] scores or probabilities in memory (Dao et al. 2022, "FlashAttention";
// the backward split of Dao 2023, "FlashAttention-2": one pass for dq over the keys, one for dk
// and dv over the queries, so that no sum needs atomics and a step is reproducible).
//
// Layouts (contiguous): q, o, dq [N, H, L, d]; k, v, dk, dv [N, KV, S, d] with H a multiple of KV
// (grouped-query attention: query head h reads key/value head h / (H / KV)); stats [N, H, L, 2]
// (each row's max m and log Σ e^(x − m), kept apart: with masked scores near −1e9 their sum
// would round the log away) and delta [N, H, L], in f32. The mask is the attention softmax's (model.cu): keys after past + i are
// masked for query i when causal, and pad [N, S] (in the dtype, 0 or mask_value) is added when
// has_pad. Masked scores get mask_value added, as the bias tensors would, so values match the
// softmax kernel's: a query that sees at least one key gives its masked keys exactly 0; a query
// that sees only padding spreads over the whole row (first_key, below), as the plain softmax does.
//
// Every block handles one tile of 32 keys at a time, a key per lane, in f32; in bf16 and f16 the
// products run on tensor cores (flash_fwd_tc, flash_bwd_dq_tc, flash_bwd_dkv_tc). Head dims up
// to FA_MAX_D; larger heads take the tensor-op attention (atomrl-model decides).

#include "common.cuh"

#include <mma.h>

#define FA_MAX_D 128
#define FA_PER_LANE (FA_MAX_D / 32)
#define FA_KEYS 32
// Query rows of a forward block and of a dq block (one per warp), keys of a dk/dv block.
#define FA_FWD_ROWS 16
#define FA_DQ_ROWS 8
#define FA_KV_ROWS 8

// The scalar arguments of every FlashAttention kernel, passed by value (atomrl-model's
// `FlashShape` and atomrl-cuda-sim's mirror it field for field).
struct FlashShape {
    int heads, kv_heads, l, s, d, past, causal;
    float scale, mask_value;
    int has_pad;
};

__device__ __forceinline__ float fa_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float fa_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The keys 0..end that query i takes: up to its causal limit, or every key when no key up to
// the limit is unpadded (first_key: the row's first unpadded key, S when none).
__device__ __forceinline__ int fa_key_end(int i, int past, int s, int causal, int first_key) {
    const int limit = causal ? min(past + i + 1, s) : s;
    return first_key < limit ? limit : s;
}

// The biased score of key j for query i, as model.cu's attn_score.
template <typename T>
__device__ __forceinline__ float fa_score(float dot, const T *pad_row, int j, int i,
                                          const FlashShape &f) {
    float t = dot * f.scale;
    if (f.causal && j > f.past + i) t += f.mask_value;
    if (f.has_pad) t += to_f(pad_row[j]);
    return t;
}

// fa_key_end of query i under f.
__device__ __forceinline__ int fa_end(int i, const FlashShape &f, int first_key) {
    return fa_key_end(i, f.past, f.s, f.causal, first_key);
}

// The keys a block of queries i0..i0 + rows takes: the most any of its queries takes.
__device__ __forceinline__ int fa_block_key_end(int i0, int rows, const FlashShape &f,
                                                int first_key) {
    int end = 0;
    for (int r = i0; r < min(i0 + rows, f.l); ++r) end = max(end, fa_end(r, f, first_key));
    return end;
}

// Rows t0..t0 + 32 of the [rows, d] matrices a and b (from `base`) into shared tiles as f32,
// zeros past `limit`, by the whole block.
template <typename T, int STRIDE_A, int STRIDE_B>
__device__ __forceinline__ void fa_load_tiles(const T *a, const T *b, size_t base, int t0,
                                              int limit, int d, float (*ta)[STRIDE_A],
                                              float (*tb)[STRIDE_B]) {
    for (int e = threadIdx.x; e < FA_KEYS * d; e += blockDim.x) {
        const int j = e / d, c = e % d;
        const bool in = t0 + j < limit;
        const size_t at = (base + (size_t)(t0 + j)) * d + c;
        ta[j][c] = in ? to_f(a[at]) : 0.0f;
        tb[j][c] = in ? to_f(b[at]) : 0.0f;
    }
}

// e^z, exactly 0 below −746 (as the softmax kernel and the CPU make masked scores).
__device__ __forceinline__ float fa_exp(float z) { return z < -746.0f ? 0.0f : expf(z); }

// first_key[n]: the first key of row n whose padding bias is 0 (S when none); 0 without
// padding. One block of 32 threads per row.
template <typename T>
__device__ void flash_first_key(const T *pad, int *first_key, int s, int has_pad) {
    const size_t n = blockIdx.x;
    int first = s;
    if (!has_pad) {
        first = 0;
    } else {
        for (int j = threadIdx.x; j < s; j += 32) {
            if (to_f(pad[n * s + j]) == 0.0f) {
                first = j;
                break;
            }
        }
    }
    for (int o = 16; o > 0; o >>= 1) first = min(first, __shfl_xor_sync(0xffffffffu, first, o));
    if (threadIdx.x == 0) first_key[n] = first;
}

// Forward: o, and stats = (m, log Σ e^(x − m)) per query row. Grid (⌈L / 16⌉, H, N), 16 warps, a
// query row per warp; keys in tiles of 32 through shared memory, an online softmax per row.
template <typename T>
__device__ void flash_fwd(const T *q, const T *k, const T *v, const T *pad, const int *first_key,
                          T *o, float *stats, const FlashShape f) {
    __shared__ float ks[FA_KEYS][FA_MAX_D + 1];
    __shared__ float vs[FA_KEYS][FA_MAX_D];
    __shared__ float qs[FA_FWD_ROWS][FA_MAX_D];
    __shared__ float ps[FA_FWD_ROWS][FA_KEYS];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, d = f.d;
    const int h = blockIdx.y;
    const size_t n = blockIdx.z;
    const size_t g = h / (f.heads / f.kv_heads);
    const int i0 = blockIdx.x * FA_FWD_ROWS, i = i0 + w;
    const bool valid = i < f.l;
    const int fk = first_key[n];
    const int kend = fa_block_key_end(i0, FA_FWD_ROWS, f, fk);
    const int end = valid ? fa_end(i, f, fk) : 0;
    const size_t row = (n * f.heads + h) * (size_t)f.l + (valid ? i : 0);
    for (int c = lane; c < d; c += 32) qs[w][c] = valid ? to_f(q[row * d + c]) : 0.0f;
    const T *pad_row = pad + (f.has_pad ? n * f.s : 0);
    const size_t base = (n * f.kv_heads + g) * (size_t)f.s;
    float m = -INFINITY, sum = 0.0f, acc[FA_PER_LANE];
    for (int u = 0; u < FA_PER_LANE; ++u) acc[u] = 0.0f;
    for (int t0 = 0; t0 < kend; t0 += FA_KEYS) {
        __syncthreads();  // the last tile's readers are done; qs is written
        fa_load_tiles(k, v, base, t0, f.s, d, ks, vs);
        __syncthreads();
        const int j = t0 + lane;
        float x = -INFINITY;
        if (j < end) {
            float dot = 0.0f;
            for (int c = 0; c < d; ++c) dot += qs[w][c] * ks[lane][c];
            x = fa_score(dot, pad_row, j, i, f);
        }
        const float nm = fmaxf(m, fa_warp_max(x));
        float p = 0.0f, corr = 1.0f;
        if (nm != -INFINITY) {
            p = x == -INFINITY ? 0.0f : fa_exp(x - nm);
            corr = m == -INFINITY ? 0.0f : fa_exp(m - nm);
        }
        sum = sum * corr + fa_warp_sum(p);
        m = nm;
        ps[w][lane] = p;
        __syncthreads();
        for (int u = 0; u < FA_PER_LANE; ++u) {
            const int c = lane + 32 * u;
            if (c < d) {
                float a = acc[u] * corr;
                for (int jj = 0; jj < FA_KEYS; ++jj) a += ps[w][jj] * vs[jj][c];
                acc[u] = a;
            }
        }
    }
    if (valid) {
        const float inv = 1.0f / sum;
        for (int u = 0; u < FA_PER_LANE; ++u) {
            const int c = lane + 32 * u;
            if (c < d) o[row * d + c] = from_f<T>(acc[u] * inv);
        }
        if (lane == 0) {
            stats[2 * row] = m;
            stats[2 * row + 1] = logf(sum);
        }
    }
}

// Rows r0..r0 + rows of the [·, d] matrices a and b (from row `base`) into shared tiles in the
// dtype, zeros past row `limit` and column d (up to d16), by the whole block.
template <typename T, int ROWS>
__device__ __forceinline__ void fa_tc_load(const T *a, const T *b, size_t base, int r0, int limit,
                                           int d, int d16, T (*ta)[FA_MAX_D],
                                           T (*tb)[FA_MAX_D]) {
    const T zero = from_f<T>(0.0f);
    for (int e = threadIdx.x; e < ROWS * d16; e += blockDim.x) {
        const int r = e / d16, c = e % d16;
        const bool in = r0 + r < limit && c < d;
        const size_t at = (base + (size_t)(r0 + r)) * d + c;
        ta[r][c] = in ? a[at] : zero;
        tb[r][c] = in ? b[at] : zero;
    }
}

// Forward on tensor cores (bf16 and f16): flash_fwd's online softmax, with q·kᵀ and p·v as
// 16 × 16 × 16 WMMA products (f32 accumulators) in place of the lanes' f32 dot products. Grid
// (⌈L / 16⌉, H, N), 4 warps; a tile of 32 keys at a time: warps 0 and 1 take 16 keys' scores each,
// then every warp rescales and takes the probabilities of 4 query rows (a key a lane, as
// flash_fwd does), then the warps take the output's 16-column tiles, O ← O·corr + P·V, with O
// in shared memory in f32 (a fragment's layout is unspecified, so rows are rescaled there). P is
// rounded to the dtype for the product, as FlashAttention-2 does; its row sums are kept in f32.
// Head dims are padded with zeros to a multiple of 16.
#define FA_TC_WARPS 4

template <typename T>
__device__ void flash_fwd_tc(const T *q, const T *k, const T *v, const T *pad,
                             const int *first_key, T *o, float *stats, const FlashShape f) {
    using namespace nvcuda;
    typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;
    __shared__ __align__(32) T qs[FA_FWD_ROWS][FA_MAX_D];
    __shared__ __align__(32) T ks[FA_KEYS][FA_MAX_D];
    __shared__ __align__(32) T vs[FA_KEYS][FA_MAX_D];
    __shared__ __align__(32) float ss[FA_FWD_ROWS][FA_KEYS];
    __shared__ __align__(32) T ps[FA_FWD_ROWS][FA_KEYS];
    __shared__ __align__(32) float os[FA_FWD_ROWS][FA_MAX_D];
    __shared__ float m_s[FA_FWD_ROWS], sum_s[FA_FWD_ROWS];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, d = f.d;
    const int d16 = (d + 15) & ~15;
    const int h = blockIdx.y;
    const size_t n = blockIdx.z;
    const size_t g = h / (f.heads / f.kv_heads);
    const int i0 = blockIdx.x * FA_FWD_ROWS;
    const int fk = first_key[n];
    const int kend = fa_block_key_end(i0, FA_FWD_ROWS, f, fk);
    const size_t qbase = (n * f.heads + h) * (size_t)f.l;
    const T zero = from_f<T>(0.0f);
    for (int e = threadIdx.x; e < FA_FWD_ROWS * d16; e += blockDim.x) {
        const int r = e / d16, c = e % d16, i = i0 + r;
        qs[r][c] = i < f.l && c < d ? q[(qbase + i) * d + c] : zero;
        os[r][c] = 0.0f;
    }
    if (threadIdx.x < FA_FWD_ROWS) {
        m_s[threadIdx.x] = -INFINITY;
        sum_s[threadIdx.x] = 0.0f;
    }
    const T *pad_row = pad + (f.has_pad ? n * f.s : 0);
    const size_t base = (n * f.kv_heads + g) * (size_t)f.s;
    for (int t0 = 0; t0 < kend; t0 += FA_KEYS) {
        __syncthreads();  // the last tile's readers are done; qs, os and the stats are written
        fa_tc_load<T, FA_KEYS>(k, v, base, t0, f.s, d, d16, ks, vs);
        __syncthreads();
        if (w < FA_KEYS / 16) {
            Acc acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int c0 = 0; c0 < d16; c0 += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
                wmma::load_matrix_sync(a, &qs[0][c0], FA_MAX_D);
                wmma::load_matrix_sync(b, &ks[16 * w][c0], FA_MAX_D);
                wmma::mma_sync(acc, a, b, acc);
            }
            wmma::store_matrix_sync(&ss[0][16 * w], acc, FA_KEYS, wmma::mem_row_major);
        }
        __syncthreads();
        for (int r = w; r < FA_FWD_ROWS; r += FA_TC_WARPS) {
            const int i = i0 + r, j = t0 + lane;
            const int end = i < f.l ? fa_end(i, f, fk) : 0;
            const float x = j < end ? fa_score(ss[r][lane], pad_row, j, i, f) : -INFINITY;
            const float m = m_s[r], sum = sum_s[r];
            const float nm = fmaxf(m, fa_warp_max(x));
            float p = 0.0f, corr = 1.0f;
            if (nm != -INFINITY) {
                p = x == -INFINITY ? 0.0f : fa_exp(x - nm);
                corr = m == -INFINITY ? 0.0f : fa_exp(m - nm);
            }
            const float total = sum * corr + fa_warp_sum(p);
            ps[r][lane] = from_f<T>(p);
            for (int c = lane; c < d16; c += 32) os[r][c] *= corr;
            if (lane == 0) {
                m_s[r] = nm;
                sum_s[r] = total;
            }
        }
        __syncthreads();
        for (int ct = w; 16 * ct < d16; ct += FA_TC_WARPS) {
            Acc acc;
            wmma::load_matrix_sync(acc, &os[0][16 * ct], FA_MAX_D, wmma::mem_row_major);
            for (int k0 = 0; k0 < FA_KEYS; k0 += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;
                wmma::load_matrix_sync(a, &ps[0][k0], FA_KEYS);
                wmma::load_matrix_sync(b, &vs[k0][16 * ct], FA_MAX_D);
                wmma::mma_sync(acc, a, b, acc);
            }
            wmma::store_matrix_sync(&os[0][16 * ct], acc, FA_MAX_D, wmma::mem_row_major);
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < FA_FWD_ROWS * d; e += blockDim.x) {
        const int r = e / d, c = e % d, i = i0 + r;
        if (i < f.l) o[(qbase + i) * d + c] = from_f<T>(os[r][c] * (1.0f / sum_s[r]));
    }
    if (threadIdx.x < FA_FWD_ROWS && i0 + (int)threadIdx.x < f.l) {
        const size_t row = qbase + i0 + threadIdx.x;
        stats[2 * row] = m_s[threadIdx.x];
        stats[2 * row + 1] = logf(sum_s[threadIdx.x]);
    }
}

// Backward, queries: delta = Σ dO·O per row (written for the dk/dv pass) and
// dq = Σ_j dS_ij · k_j with dS = scale · P ⊙ (dO·vᵀ − delta), P = e^(x − m − log Σ). Grid
// (⌈L / 8⌉, H, N), 8 warps, a query row per warp.
template <typename T>
__device__ void flash_bwd_dq(const T *q, const T *k, const T *v, const T *o, const T *dout,
                             const float *stats, const T *pad, const int *first_key, T *dq,
                             float *delta, const FlashShape f) {
    __shared__ float ks[FA_KEYS][FA_MAX_D + 1];
    __shared__ float vs[FA_KEYS][FA_MAX_D + 1];
    __shared__ float qs[FA_DQ_ROWS][FA_MAX_D];
    __shared__ float dos[FA_DQ_ROWS][FA_MAX_D];
    __shared__ float ds_s[FA_DQ_ROWS][FA_KEYS];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, d = f.d;
    const int h = blockIdx.y;
    const size_t n = blockIdx.z;
    const size_t g = h / (f.heads / f.kv_heads);
    const int i0 = blockIdx.x * FA_DQ_ROWS, i = i0 + w;
    const bool valid = i < f.l;
    const int fk = first_key[n];
    const int kend = fa_block_key_end(i0, FA_DQ_ROWS, f, fk);
    const int end = valid ? fa_end(i, f, fk) : 0;
    const size_t row = (n * f.heads + h) * (size_t)f.l + (valid ? i : 0);
    float dd = 0.0f;
    for (int c = lane; c < d; c += 32) {
        qs[w][c] = valid ? to_f(q[row * d + c]) : 0.0f;
        const float go = valid ? to_f(dout[row * d + c]) : 0.0f;
        dos[w][c] = go;
        dd += go * (valid ? to_f(o[row * d + c]) : 0.0f);
    }
    dd = fa_warp_sum(dd);
    if (valid && lane == 0) delta[row] = dd;
    const float mi = valid ? stats[2 * row] : 0.0f, li = valid ? stats[2 * row + 1] : 0.0f;
    const T *pad_row = pad + (f.has_pad ? n * f.s : 0);
    const size_t base = (n * f.kv_heads + g) * (size_t)f.s;
    float acc[FA_PER_LANE];
    for (int u = 0; u < FA_PER_LANE; ++u) acc[u] = 0.0f;
    for (int t0 = 0; t0 < kend; t0 += FA_KEYS) {
        __syncthreads();
        fa_load_tiles(k, v, base, t0, f.s, d, ks, vs);
        __syncthreads();
        const int j = t0 + lane;
        float ds = 0.0f;
        if (j < end) {
            float dot = 0.0f, dp = 0.0f;
            for (int c = 0; c < d; ++c) {
                dot += qs[w][c] * ks[lane][c];
                dp += dos[w][c] * vs[lane][c];
            }
            const float x = fa_score(dot, pad_row, j, i, f);
            const float p = x == -INFINITY ? 0.0f : fa_exp((x - mi) - li);
            ds = f.scale * (p * (dp - dd));
        }
        ds_s[w][lane] = ds;
        __syncthreads();
        for (int u = 0; u < FA_PER_LANE; ++u) {
            const int c = lane + 32 * u;
            if (c < d) {
                float a = acc[u];
                for (int jj = 0; jj < FA_KEYS; ++jj) a += ds_s[w][jj] * ks[jj][c];
                acc[u] = a;
            }
        }
    }
    if (valid) {
        for (int u = 0; u < FA_PER_LANE; ++u) {
            const int c = lane + 32 * u;
            if (c < d) dq[row * d + c] = from_f<T>(acc[u]);
        }
    }
}

// Backward, keys: dv_j = Σ_i P_ij · dO_i and dk_j = Σ_i dS_ij · q_i over the query heads of the
// key's group and every query that sees it. Grid (⌈S / 8⌉, KV, N), 8 warps, a key per warp; the
// queries in tiles of 32 through shared memory, a query per lane. Reads delta from flash_bwd_dq,
// which must run first (the same stream).
template <typename T>
__device__ void flash_bwd_dkv(const T *q, const T *k, const T *v, const T *dout, const float *stats,
                              const float *delta, const T *pad, const int *first_key, T *dk,
                              T *dv, const FlashShape f) {
    __shared__ float qs[FA_KEYS][FA_MAX_D + 1];
    __shared__ float dos[FA_KEYS][FA_MAX_D + 1];
    __shared__ float kown[FA_KV_ROWS][FA_MAX_D];
    __shared__ float vown[FA_KV_ROWS][FA_MAX_D];
    __shared__ float p_s[FA_KV_ROWS][FA_KEYS];
    __shared__ float ds_s[FA_KV_ROWS][FA_KEYS];
    __shared__ float m_s[FA_KEYS], log_s[FA_KEYS], delta_s[FA_KEYS];
    __shared__ int end_s[FA_KEYS];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, d = f.d;
    const size_t g = blockIdx.y, n = blockIdx.z;
    const int group = f.heads / f.kv_heads;
    const int j0 = blockIdx.x * FA_KV_ROWS, j = j0 + w;
    const bool valid = j < f.s;
    const int fk = first_key[n];
    const size_t krow = (n * f.kv_heads + g) * (size_t)f.s + (valid ? j : 0);
    for (int c = lane; c < d; c += 32) {
        kown[w][c] = valid ? to_f(k[krow * d + c]) : 0.0f;
        vown[w][c] = valid ? to_f(v[krow * d + c]) : 0.0f;
    }
    const T *pad_row = pad + (f.has_pad ? n * f.s : 0);
    float ak[FA_PER_LANE], av[FA_PER_LANE];
    for (int u = 0; u < FA_PER_LANE; ++u) ak[u] = av[u] = 0.0f;
    for (int hh = (int)g * group; hh < ((int)g + 1) * group; ++hh) {
        const size_t qbase = (n * f.heads + hh) * (size_t)f.l;
        for (int i0 = 0; i0 < f.l; i0 += FA_KEYS) {
            // Skip a tile none of whose queries sees a key of this block (the same choice on
            // every thread, so the barriers below stay uniform).
            if (fa_block_key_end(i0, FA_KEYS, f, fk) <= j0) continue;
            __syncthreads();  // the last tile's readers are done; kown and vown are written
            fa_load_tiles(q, dout, qbase, i0, f.l, d, qs, dos);
            if (threadIdx.x < FA_KEYS) {
                const int r = threadIdx.x, i = i0 + r;
                const bool in = i < f.l;
                m_s[r] = in ? stats[2 * (qbase + i)] : 0.0f;
                log_s[r] = in ? stats[2 * (qbase + i) + 1] : 0.0f;
                delta_s[r] = in ? delta[qbase + i] : 0.0f;
                end_s[r] = in ? fa_end(i, f, fk) : 0;
            }
            __syncthreads();
            const int i = i0 + lane;
            float p = 0.0f, ds = 0.0f;
            if (valid && j < end_s[lane]) {
                float dot = 0.0f, dp = 0.0f;
                for (int c = 0; c < d; ++c) {
                    dot += qs[lane][c] * kown[w][c];
                    dp += dos[lane][c] * vown[w][c];
                }
                const float x = fa_score(dot, pad_row, j, i, f);
                p = x == -INFINITY ? 0.0f : fa_exp((x - m_s[lane]) - log_s[lane]);
                ds = f.scale * (p * (dp - delta_s[lane]));
            }
            p_s[w][lane] = p;
            ds_s[w][lane] = ds;
            __syncthreads();
            for (int u = 0; u < FA_PER_LANE; ++u) {
                const int c = lane + 32 * u;
                if (c < d) {
                    float a = av[u], b = ak[u];
                    for (int r = 0; r < FA_KEYS; ++r) {
                        a += p_s[w][r] * dos[r][c];
                        b += ds_s[w][r] * qs[r][c];
                    }
                    av[u] = a;
                    ak[u] = b;
                }
            }
        }
    }
    if (valid) {
        for (int u = 0; u < FA_PER_LANE; ++u) {
            const int c = lane + 32 * u;
            if (c < d) {
                dk[krow * d + c] = from_f<T>(ak[u]);
                dv[krow * d + c] = from_f<T>(av[u]);
            }
        }
    }
}

// Backward on tensor cores (bf16 and f16), FlashAttention-2's split as flash_bwd_dq and
// flash_bwd_dkv, with the four products of a tile as 16 × 16 × 16 WMMA products (f32
// accumulators) in place of the lanes' f32 dot products. Each block takes 16 rows (queries for
// dq, keys for dk and dv) and 4 warps: per tile of 32 columns, warps 0 and 1 take the scores'
// two 16-column halves and warps 2 and 3 those of dO·vᵀ; then every warp makes P and dS for 4
// rows (a column a lane, in f32, as the CUDA-core kernels do); then each warp adds its 16-column
// tiles of the gradients, whose accumulators stay in the warp's fragments across the whole loop
// (no rescaling here, unlike the forward's O). P and dS are rounded to the dtype for their
// products, as FlashAttention-2 does.
#define FA_TC_ROWS 16
// Output column tiles a warp holds: dq's FA_MAX_D / 16 over 4 warps, dk's and dv's twice that.
#define FA_TC_DQ_SLOTS (FA_MAX_D / 16 / FA_TC_WARPS)
#define FA_TC_DKV_SLOTS (2 * FA_TC_DQ_SLOTS)

// The two products of a tile that every warp takes a quarter of: warps 0 and 1 write the
// 16-column halves of x·yᵀ into xy, warps 2 and 3 those of u·wᵀ into uw; x and u are 16 rows,
// y and w 32 (all [·, d16] in shared memory, row-major with stride FA_MAX_D).
template <typename T>
__device__ __forceinline__ void fa_tc_scores(const T (*x)[FA_MAX_D], const T (*y)[FA_MAX_D],
                                             const T (*u)[FA_MAX_D], const T (*w)[FA_MAX_D],
                                             int d16, float (*xy)[FA_KEYS],
                                             float (*uw)[FA_KEYS]) {
    using namespace nvcuda;
    const int warp = threadIdx.x >> 5, half = warp & 1;
    const T(*a)[FA_MAX_D] = warp < 2 ? x : u;
    const T(*b)[FA_MAX_D] = warp < 2 ? y : w;
    float(*out)[FA_KEYS] = warp < 2 ? xy : uw;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int c0 = 0; c0 < d16; c0 += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
        wmma::load_matrix_sync(fa, &a[0][c0], FA_MAX_D);
        wmma::load_matrix_sync(fb, &b[16 * half][c0], FA_MAX_D);
        wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(&out[0][16 * half], acc, FA_KEYS, wmma::mem_row_major);
}

// acc += a·b for a [16, 32] (row-major, stride FA_KEYS) and the 16 columns from c0 of a
// [32, ·] b (row-major, stride FA_MAX_D).
template <typename T>
__device__ __forceinline__ void fa_tc_add_product(
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> &acc,
    const T (*a)[FA_KEYS], const T (*b)[FA_MAX_D], int c0) {
    using namespace nvcuda;
    for (int k0 = 0; k0 < FA_KEYS; k0 += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, &a[0][k0], FA_KEYS);
        wmma::load_matrix_sync(fb, &b[k0][c0], FA_MAX_D);
        wmma::mma_sync(acc, fa, fb, acc);
    }
}

// Backward, queries, on tensor cores: flash_bwd_dq's delta and dq. Grid (⌈L / 16⌉, H, N), 4
// warps.
template <typename T>
__device__ void flash_bwd_dq_tc(const T *q, const T *k, const T *v, const T *o, const T *dout,
                                const float *stats, const T *pad, const int *first_key, T *dq,
                                float *delta, const FlashShape f) {
    using namespace nvcuda;
    typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;
    __shared__ __align__(32) T qs[FA_TC_ROWS][FA_MAX_D];
    __shared__ __align__(32) T dos[FA_TC_ROWS][FA_MAX_D];
    __shared__ __align__(32) T ks[FA_KEYS][FA_MAX_D];
    __shared__ __align__(32) T vs[FA_KEYS][FA_MAX_D];
    __shared__ __align__(32) float ss[FA_TC_ROWS][FA_KEYS];
    __shared__ __align__(32) float dps[FA_TC_ROWS][FA_KEYS];
    __shared__ __align__(32) T ds_s[FA_TC_ROWS][FA_KEYS];
    __shared__ __align__(32) float out[FA_TC_ROWS][FA_MAX_D];
    __shared__ float m_s[FA_TC_ROWS], log_s[FA_TC_ROWS], delta_s[FA_TC_ROWS];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, d = f.d;
    const int d16 = (d + 15) & ~15;
    const int h = blockIdx.y;
    const size_t n = blockIdx.z;
    const size_t g = h / (f.heads / f.kv_heads);
    const int i0 = blockIdx.x * FA_TC_ROWS;
    const int fk = first_key[n];
    const int kend = fa_block_key_end(i0, FA_TC_ROWS, f, fk);
    const size_t qbase = (n * f.heads + h) * (size_t)f.l;
    fa_tc_load<T, FA_TC_ROWS>(q, dout, qbase, i0, f.l, d, d16, qs, dos);
    // delta as flash_bwd_dq sums it (lanes over columns, then the warp), from the inputs.
    for (int r = w; r < FA_TC_ROWS; r += FA_TC_WARPS) {
        const int i = i0 + r;
        const bool valid = i < f.l;
        const size_t row = qbase + (valid ? i : 0);
        float dd = 0.0f;
        for (int c = lane; c < d; c += 32)
            dd += valid ? to_f(dout[row * d + c]) * to_f(o[row * d + c]) : 0.0f;
        dd = fa_warp_sum(dd);
        if (lane == 0) {
            if (valid) delta[row] = dd;
            delta_s[r] = dd;
            m_s[r] = valid ? stats[2 * row] : 0.0f;
            log_s[r] = valid ? stats[2 * row + 1] : 0.0f;
        }
    }
    const T *pad_row = pad + (f.has_pad ? n * f.s : 0);
    const size_t base = (n * f.kv_heads + g) * (size_t)f.s;
    Acc acc[FA_TC_DQ_SLOTS];
#pragma unroll
    for (int u = 0; u < FA_TC_DQ_SLOTS; ++u) wmma::fill_fragment(acc[u], 0.0f);
    for (int t0 = 0; t0 < kend; t0 += FA_KEYS) {
        __syncthreads();  // the last tile's readers are done; qs, dos and the row stats are written
        fa_tc_load<T, FA_KEYS>(k, v, base, t0, f.s, d, d16, ks, vs);
        __syncthreads();
        fa_tc_scores<T>(qs, ks, dos, vs, d16, ss, dps);
        __syncthreads();
        for (int r = w; r < FA_TC_ROWS; r += FA_TC_WARPS) {
            const int i = i0 + r, j = t0 + lane;
            const int end = i < f.l ? fa_end(i, f, fk) : 0;
            float ds = 0.0f;
            if (j < end) {
                const float x = fa_score(ss[r][lane], pad_row, j, i, f);
                const float p = fa_exp((x - m_s[r]) - log_s[r]);
                ds = f.scale * (p * (dps[r][lane] - delta_s[r]));
            }
            ds_s[r][lane] = from_f<T>(ds);
        }
        __syncthreads();
#pragma unroll
        for (int u = 0; u < FA_TC_DQ_SLOTS; ++u) {
            const int ct = w + FA_TC_WARPS * u;
            if (16 * ct < d16) fa_tc_add_product<T>(acc[u], ds_s, ks, 16 * ct);
        }
    }
#pragma unroll
    for (int u = 0; u < FA_TC_DQ_SLOTS; ++u) {
        const int ct = w + FA_TC_WARPS * u;
        if (16 * ct < d16)
            wmma::store_matrix_sync(&out[0][16 * ct], acc[u], FA_MAX_D, wmma::mem_row_major);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < FA_TC_ROWS * d; e += blockDim.x) {
        const int r = e / d, c = e % d, i = i0 + r;
        if (i < f.l) dq[(qbase + i) * d + c] = from_f<T>(out[r][c]);
    }
}

// Backward, keys, on tensor cores: flash_bwd_dkv's dk and dv, over the query heads of the
// key's group and the tiles of 32 queries that see a key of the block. Grid (⌈S / 16⌉, KV, N),
// 4 warps. Reads delta from flash_bwd_dq_tc (or flash_bwd_dq), which must run first.
template <typename T>
__device__ void flash_bwd_dkv_tc(const T *q, const T *k, const T *v, const T *dout,
                                 const float *stats, const float *delta, const T *pad,
                                 const int *first_key, T *dk, T *dv, const FlashShape f) {
    using namespace nvcuda;
    typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;
    __shared__ __align__(32) T kown[FA_TC_ROWS][FA_MAX_D];
    __shared__ __align__(32) T vown[FA_TC_ROWS][FA_MAX_D];
    __shared__ __align__(32) T qs[FA_KEYS][FA_MAX_D];
    __shared__ __align__(32) T dos[FA_KEYS][FA_MAX_D];
    // Transposed scores and dO·vᵀ: a row per key, a column per query.
    __shared__ __align__(32) float st[FA_TC_ROWS][FA_KEYS];
    __shared__ __align__(32) float dpt[FA_TC_ROWS][FA_KEYS];
    __shared__ __align__(32) T pt[FA_TC_ROWS][FA_KEYS];
    __shared__ __align__(32) T dst[FA_TC_ROWS][FA_KEYS];
    __shared__ __align__(32) float out[FA_TC_ROWS][FA_MAX_D];
    __shared__ float m_s[FA_KEYS], log_s[FA_KEYS], delta_s[FA_KEYS];
    __shared__ int end_s[FA_KEYS];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, d = f.d;
    const int d16 = (d + 15) & ~15, tiles = d16 / 16;
    const size_t g = blockIdx.y, n = blockIdx.z;
    const int group = f.heads / f.kv_heads;
    const int j0 = blockIdx.x * FA_TC_ROWS;
    const int fk = first_key[n];
    const size_t kbase = (n * f.kv_heads + g) * (size_t)f.s;
    fa_tc_load<T, FA_TC_ROWS>(k, v, kbase, j0, f.s, d, d16, kown, vown);
    const T *pad_row = pad + (f.has_pad ? n * f.s : 0);
    // Slot u of warp w holds column tile w + 4u of [dv | dk] (dv's tiles first).
    Acc acc[FA_TC_DKV_SLOTS];
#pragma unroll
    for (int u = 0; u < FA_TC_DKV_SLOTS; ++u) wmma::fill_fragment(acc[u], 0.0f);
    for (int hh = (int)g * group; hh < ((int)g + 1) * group; ++hh) {
        const size_t qbase = (n * f.heads + hh) * (size_t)f.l;
        for (int i0 = 0; i0 < f.l; i0 += FA_KEYS) {
            // Skip a tile none of whose queries sees a key of this block (the same choice on
            // every thread, so the barriers below stay uniform).
            if (fa_block_key_end(i0, FA_KEYS, f, fk) <= j0) continue;
            __syncthreads();  // the last tile's readers are done; kown and vown are written
            fa_tc_load<T, FA_KEYS>(q, dout, qbase, i0, f.l, d, d16, qs, dos);
            if (threadIdx.x < FA_KEYS) {
                const int r = threadIdx.x, i = i0 + r;
                const bool in = i < f.l;
                m_s[r] = in ? stats[2 * (qbase + i)] : 0.0f;
                log_s[r] = in ? stats[2 * (qbase + i) + 1] : 0.0f;
                delta_s[r] = in ? delta[qbase + i] : 0.0f;
                end_s[r] = in ? fa_end(i, f, fk) : 0;
            }
            __syncthreads();
            fa_tc_scores<T>(kown, qs, vown, dos, d16, st, dpt);
            __syncthreads();
            for (int r = w; r < FA_TC_ROWS; r += FA_TC_WARPS) {
                const int j = j0 + r, i = i0 + lane;
                float p = 0.0f, ds = 0.0f;
                if (j < end_s[lane]) {  // end_s ≤ S: a key past S is never taken
                    const float x = fa_score(st[r][lane], pad_row, j, i, f);
                    p = fa_exp((x - m_s[lane]) - log_s[lane]);
                    ds = f.scale * (p * (dpt[r][lane] - delta_s[lane]));
                }
                pt[r][lane] = from_f<T>(p);
                dst[r][lane] = from_f<T>(ds);
            }
            __syncthreads();
#pragma unroll
            for (int u = 0; u < FA_TC_DKV_SLOTS; ++u) {
                const int t = w + FA_TC_WARPS * u;
                if (t < tiles)
                    fa_tc_add_product<T>(acc[u], pt, dos, 16 * t);
                else if (t < 2 * tiles)
                    fa_tc_add_product<T>(acc[u], dst, qs, 16 * (t - tiles));
            }
        }
    }
    // dv's tiles, then dk's, through the same shared buffer.
    for (int pass = 0; pass < 2; ++pass) {
        __syncthreads();  // the loop's readers (or the last pass's writers) are done
#pragma unroll
        for (int u = 0; u < FA_TC_DKV_SLOTS; ++u) {
            const int t = w + FA_TC_WARPS * u - pass * tiles;
            if (t >= 0 && t < tiles)
                wmma::store_matrix_sync(&out[0][16 * t], acc[u], FA_MAX_D, wmma::mem_row_major);
        }
        __syncthreads();
        T *grad = pass == 0 ? dv : dk;
        for (int e = threadIdx.x; e < FA_TC_ROWS * d; e += blockDim.x) {
            const int r = e / d, c = e % d, j = j0 + r;
            if (j < f.s) grad[(kbase + j) * d + c] = from_f<T>(out[r][c]);
        }
    }
}

// ---- Entry points, one per dtype: NAME_f32, NAME_bf16, NAME_f16.

#define ENTRIES(T, SUFFIX)                                                                        \
    extern "C" __global__ void atomrl_flash_first_key_##SUFFIX(const T *pad, int *first_key,      \
                                                               int s, int has_pad) {              \
        flash_first_key<T>(pad, first_key, s, has_pad);                                            \
    }                                                                                              \
    extern "C" __global__ void atomrl_flash_fwd_##SUFFIX(const T *q, const T *k, const T *v,      \
                                                         const T *pad, const int *first_key,      \
                                                         T *o, float *stats, FlashShape f) {      \
        flash_fwd<T>(q, k, v, pad, first_key, o, stats, f);                                        \
    }                                                                                              \
    extern "C" __global__ void atomrl_flash_bwd_dq_##SUFFIX(                                       \
        const T *q, const T *k, const T *v, const T *o, const T *dout, const float *stats,        \
        const T *pad, const int *first_key, T *dq, float *delta, FlashShape f) {                  \
        flash_bwd_dq<T>(q, k, v, o, dout, stats, pad, first_key, dq, delta, f);                    \
    }                                                                                              \
    extern "C" __global__ void atomrl_flash_bwd_dkv_##SUFFIX(                                      \
        const T *q, const T *k, const T *v, const T *dout, const float *stats,                    \
        const float *delta, const T *pad, const int *first_key, T *dk, T *dv, FlashShape f) {     \
        flash_bwd_dkv<T>(q, k, v, dout, stats, delta, pad, first_key, dk, dv, f);                  \
    }

// The tensor-core forward and backward, for the 16-bit dtypes.
#define TC_ENTRIES(T, SUFFIX)                                                                     \
    extern "C" __global__ void atomrl_flash_fwd_tc_##SUFFIX(const T *q, const T *k, const T *v,   \
                                                            const T *pad, const int *first_key,   \
                                                            T *o, float *stats, FlashShape f) {   \
        flash_fwd_tc<T>(q, k, v, pad, first_key, o, stats, f);                                     \
    }                                                                                              \
    extern "C" __global__ void atomrl_flash_bwd_dq_tc_##SUFFIX(                                    \
        const T *q, const T *k, const T *v, const T *o, const T *dout, const float *stats,        \
        const T *pad, const int *first_key, T *dq, float *delta, FlashShape f) {                  \
        flash_bwd_dq_tc<T>(q, k, v, o, dout, stats, pad, first_key, dq, delta, f);                 \
    }                                                                                              \
    extern "C" __global__ void atomrl_flash_bwd_dkv_tc_##SUFFIX(                                   \
        const T *q, const T *k, const T *v, const T *dout, const float *stats,                    \
        const float *delta, const T *pad, const int *first_key, T *dk, T *dv, FlashShape f) {     \
        flash_bwd_dkv_tc<T>(q, k, v, dout, stats, delta, pad, first_key, dk, dv, f);               \
    }

ENTRIES(float, f32)
ENTRIES(__nv_bfloat16, bf16)
ENTRIES(__half, f16)
TC_ENTRIES(__nv_bfloat16, bf16)
TC_ENTRIES(__half, f16)
