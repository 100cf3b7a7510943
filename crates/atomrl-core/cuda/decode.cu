// Kernels of the decode step (atomrl-model's `StaticDecode`, feature `cuda`): every value
// that changes from one decode step to the next (token ids, positions, the cache column written)
// is read from device memory, never passed as a launch argument, so that one captured CUDA graph
// replays every step. The tensor-op forms they replace are in crates/atomrl-model/src/
// static_decode.rs (`*_ops`), which the device check compares them with.
//
// `step` is the step's u32 input block: [ids (B), positions (B), slot (1)]; `slot` is the cache
// column the new token's key and value go to (the width of the cache before the step).

#include "common.cuh"

// The key-padding bias of one step, [B, cap] in the scores' dtype: 0 for the keys row b may
// attend (starts[b] ≤ j ≤ slot), mask_value for padding before starts[b] and for columns after
// the slot (not yet written).
template <typename T>
__device__ void decode_bias(const unsigned *starts, const unsigned *step, T *bias, int rows,
                            int cap, float mask_value) {
    const unsigned slot = step[2 * rows];
    GRID_STRIDE(i, (size_t)rows * cap) {
        const unsigned b = (unsigned)(i / cap), j = (unsigned)(i % cap);
        bias[i] = from_f<T>(j >= starts[b] && j <= slot ? 0.0f : mask_value);
    }
}

// Query, key and value of the new token: q [B, H·d], k, v [B, KV·d] with row strides ld_q and
// ld_kv (apart, ld_q = H·d and ld_kv = KV·d; views into one merged projection [B, (H + 2·KV)·d],
// both that width), optionally + bias (rounded to T as a separate add would), RoPE (rotate-half,
// tables [P, d] at row positions[b]) on q and k; q goes to q_out [B, H, d], k and v to column
// `slot` of the caches [B, KV, cap, d]. One thread per (row, head of H + 2·KV, k < d/2).
template <typename T>
__device__ void decode_qkv(const T *q, const T *k, const T *v, const T *qb, const T *kb,
                           const T *vb, int has_bias, const T *cos, const T *sin,
                           const unsigned *step, T *q_out, T *k_cache, T *v_cache, int rows,
                           int heads, int kv_heads, int d, int cap, int ld_q, int ld_kv) {
    const int half = d / 2;
    const int all = heads + 2 * kv_heads;
    const unsigned slot = step[2 * rows];
    GRID_STRIDE(i, (size_t)rows * all * half) {
        const int kk = (int)(i % half);
        const int head = (int)((i / half) % all);
        const size_t b = i / ((size_t)half * all);
        const T *src, *bias;
        int h;
        if (head < heads) {
            h = head;
            src = q + b * ld_q + (size_t)h * d;
            bias = qb + (size_t)h * d;
        } else if (head < heads + kv_heads) {
            h = head - heads;
            src = k + b * ld_kv + (size_t)h * d;
            bias = kb + (size_t)h * d;
        } else {
            h = head - heads - kv_heads;
            src = v + b * ld_kv + (size_t)h * d;
            bias = vb + (size_t)h * d;
        }
        float a = to_f(src[kk]), c = to_f(src[kk + half]);
        if (has_bias) {
            a = to_f(from_f<T>(a + to_f(bias[kk])));
            c = to_f(from_f<T>(c + to_f(bias[kk + half])));
        }
        if (head >= heads + kv_heads) {
            T *dst = v_cache + ((b * kv_heads + h) * cap + slot) * d;
            dst[kk] = from_f<T>(a);
            dst[kk + half] = from_f<T>(c);
            continue;
        }
        const size_t t = (size_t)step[rows + b] * d;
        const float c1 = to_f(cos[t + kk]), c2 = to_f(cos[t + kk + half]);
        const float s1 = to_f(sin[t + kk]), s2 = to_f(sin[t + kk + half]);
        const T y1 = from_f<T>(a * c1 - c * s1), y2 = from_f<T>(c * c2 + a * s2);
        T *dst = head < heads ? q_out + (b * heads + h) * d
                              : k_cache + ((b * kv_heads + h) * cap + slot) * d;
        dst[kk] = y1;
        dst[kk + half] = y2;
    }
}

// Philox4x32-10 (Salmon et al., SC 2011), as atomrl-sample's philox.rs: ten rounds, the key
// bumped by the Weyl increments before each round after the first.
__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k) {
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k.x += 0x9E3779B9u;
            k.y += 0xBB67AE85u;
        }
        const unsigned hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
        const unsigned hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
        c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    }
    return c;
}

// A uniform number in [0, 1): the word's top 24 bits over 2^24 (philox.rs's unit_f32).
__device__ __forceinline__ float unit_f32(unsigned w) {
    return (float)(w >> 8) * (1.0f / 16777216.0f);
}

// The running state of a draw over part of a row: the best Gumbel score and its index (ties to
// the lowest index), and log-sum-exp as a (max, sum) pair so the logits are read once.
struct PickState {
    float best;
    int idx;
    float m;
    float s;
};

__device__ __forceinline__ void pick_add(PickState &a, float g, int j, float x) {
    if (g > a.best || (g == a.best && j < a.idx)) {
        a.best = g;
        a.idx = j;
    }
    if (x > a.m) {
        a.s = a.s * expf(a.m - x) + 1.0f;
        a.m = x;
    } else if (x > -INFINITY) {
        a.s += expf(x - a.m);
    }
}

__device__ __forceinline__ void pick_merge(PickState &a, const PickState &b) {
    if (b.best > a.best || (b.best == a.best && b.idx < a.idx)) {
        a.best = b.best;
        a.idx = b.idx;
    }
    const float mm = fmaxf(a.m, b.m);
    if (mm > -INFINITY) {
        a.s = a.s * expf(a.m - mm) + b.s * expf(b.m - mm);
        a.m = mm;
    }
}

// The next token of each row of logits [B, V] and its log-prob, in place of ~16 tensor ops over
// f32 copies (the tensor-op form is atomrl-sample's device_pick.rs), in two launches:
//
// 1. atomrl_pick_part: block (c, b) reads columns [c·span, (c + 1)·span) of row b (span a
//    multiple of 4), so a few rows still fill the GPU; x = logit · inv_t, the token is
//    argmax(x − log(−log u)) (Gumbel-max: a draw from softmax(x)), or argmax x when
//    has_noise = 0 (greedy). u is made here: entry j of row b is word j mod 4 of
//    Philox4x32-10 at counter [j / 4, row_ids[b], step, 0] under key [seed_lo, seed_hi]
//    (philox.rs's StepNoise, which the host uses for the same numbers), so no [B, V] noise
//    buffer is written or read. It writes the block's PickState to parts [B, chunks].
// 2. atomrl_pick_finish: one thread per row merges its chunks in order (the same bits on every
//    run) and writes out[b] = the token and out[B + b] = the bits of its log-prob,
//    x[token] − logsumexp(x): one buffer, so the host reads both in one copy.
#define PICK_THREADS 256

template <typename T>
__device__ void pick_part(const T *logits, int has_noise, unsigned seed_lo, unsigned seed_hi,
                          const unsigned *row_ids, unsigned step, float inv_t, int v, int span,
                          PickState *parts) {
    __shared__ PickState s_part[PICK_THREADS];
    const int b = blockIdx.y, c = blockIdx.x, chunks = gridDim.x;
    const T *row = logits + (size_t)b * v;
    const int begin = c * span;
    const int end = min(v, begin + span);
    PickState st = {-INFINITY, 0x7fffffff, -INFINITY, 0.0f};
    const uint2 key = make_uint2(seed_lo, seed_hi);
    const unsigned rid = has_noise ? row_ids[b] : 0u;
    for (int q = begin / 4 + (int)threadIdx.x; 4 * q < end; q += blockDim.x) {
        uint4 w = make_uint4(0u, 0u, 0u, 0u);
        if (has_noise) w = philox4x32_10(make_uint4((unsigned)q, rid, step, 0u), key);
        const unsigned words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int j = 4 * q + e;
            if (j < end) {
                // __fmul_rn: rounded before the add, as the tensor-op form rounds it.
                const float x = __fmul_rn(to_f(row[j]), inv_t);
                const float g = has_noise ? x + -logf(-logf(unit_f32(words[e]))) : x;
                pick_add(st, g, j, x);
            }
        }
    }
    const int t = threadIdx.x;
    s_part[t] = st;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (t < w) {
            PickState a = s_part[t];
            pick_merge(a, s_part[t + w]);
            s_part[t] = a;
        }
        __syncthreads();
    }
    if (t == 0) parts[(size_t)b * chunks + c] = s_part[0];
}

template <typename T>
__device__ void pick_finish(const T *logits, const PickState *parts, int rows, int chunks,
                            float inv_t, int v, unsigned *out) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= rows) return;
    PickState st = parts[(size_t)b * chunks];
    for (int c = 1; c < chunks; ++c) pick_merge(st, parts[(size_t)b * chunks + c]);
    const int tok = st.idx < v ? st.idx : 0;
    out[b] = (unsigned)tok;
    const float lp = __fmul_rn(to_f(logits[(size_t)b * v + tok]), inv_t) - (st.m + logf(st.s));
    out[rows + b] = __float_as_uint(lp);
}

#define ENTRIES(T, SUFFIX)                                                                        \
    extern "C" __global__ void atomrl_decode_bias_##SUFFIX(                                        \
        const unsigned *starts, const unsigned *step, T *bias, int rows, int cap,                 \
        float mask_value) {                                                                       \
        decode_bias<T>(starts, step, bias, rows, cap, mask_value);                                 \
    }                                                                                              \
    extern "C" __global__ void atomrl_decode_qkv_##SUFFIX(                                         \
        const T *q, const T *k, const T *v, const T *qb, const T *kb, const T *vb, int has_bias,  \
        const T *cos, const T *sin, const unsigned *step, T *q_out, T *k_cache, T *v_cache,      \
        int rows, int heads, int kv_heads, int d, int cap, int ld_q, int ld_kv) {                 \
        decode_qkv<T>(q, k, v, qb, kb, vb, has_bias, cos, sin, step, q_out, k_cache, v_cache,     \
                      rows, heads, kv_heads, d, cap, ld_q, ld_kv);                                \
    }                                                                                              \
    extern "C" __global__ void atomrl_pick_part_##SUFFIX(                                       \
        const T *logits, int has_noise, unsigned seed_lo, unsigned seed_hi,                       \
        const unsigned *row_ids, unsigned step, float inv_t, int v, int span, PickState *parts) { \
        pick_part<T>(logits, has_noise, seed_lo, seed_hi, row_ids, step, inv_t, v, span, parts);  \
    }                                                                                              \
    extern "C" __global__ void atomrl_pick_finish_##SUFFIX(const T *logits,                       \
                                                           const PickState *parts, int rows,      \
                                                           int chunks, float inv_t, int v,        \
                                                           unsigned *out) {                       \
        pick_finish<T>(logits, parts, rows, chunks, inv_t, v, out);                                \
    }

ENTRIES(float, f32)
ENTRIES(__nv_bfloat16, bf16)
ENTRIES(__half, f16)
