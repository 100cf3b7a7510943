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

// The next token of each row and its log-prob in one pass over the logits [B, V] (one block
// of PICK_THREADS per row), in place of ~16 tensor ops over f32 copies (the tensor-op form is
// atomrl-sample's device_pick.rs): x = logit · inv_t; the token is argmax(x − log(−log u)) with
// u from `noise` [B, V] (Gumbel-max: a draw from softmax(x)), or argmax x when has_noise = 0
// (greedy); ties go to the lowest index. log_prob = x[token] − logsumexp(x), the sum kept as a
// running (max, sum) pair so the row is read once.
#define PICK_THREADS 1024

template <typename T>
__device__ void pick_row(const T *logits, const float *noise, int has_noise, float inv_t, int v,
                         unsigned *tokens, float *log_probs) {
    __shared__ float s_best[PICK_THREADS], s_m[PICK_THREADS], s_s[PICK_THREADS];
    __shared__ int s_idx[PICK_THREADS];
    const T *row = logits + (size_t)blockIdx.x * v;
    const float *u = noise + (has_noise ? (size_t)blockIdx.x * v : 0);
    float best = -INFINITY, m = -INFINITY, s = 0.0f;
    int idx = 0x7fffffff;
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        const float x = to_f(row[j]) * inv_t;
        const float g = has_noise ? x + -logf(-logf(u[j])) : x;
        if (g > best || (g == best && j < idx)) {
            best = g;
            idx = j;
        }
        if (x > m) {
            s = s * expf(m - x) + 1.0f;
            m = x;
        } else if (x > -INFINITY) {
            s += expf(x - m);
        }
    }
    const int t = threadIdx.x;
    s_best[t] = best;
    s_idx[t] = idx;
    s_m[t] = m;
    s_s[t] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (t < w) {
            const float b2 = s_best[t + w];
            const int i2 = s_idx[t + w];
            if (b2 > s_best[t] || (b2 == s_best[t] && i2 < s_idx[t])) {
                s_best[t] = b2;
                s_idx[t] = i2;
            }
            const float m1 = s_m[t], m2 = s_m[t + w];
            const float mm = fmaxf(m1, m2);
            if (mm > -INFINITY) {
                s_s[t] = s_s[t] * expf(m1 - mm) + s_s[t + w] * expf(m2 - mm);
                s_m[t] = mm;
            }
        }
        __syncthreads();
    }
    if (t == 0) {
        const int tok = s_idx[0] < v ? s_idx[0] : 0;
        tokens[blockIdx.x] = (unsigned)tok;
        log_probs[blockIdx.x] = to_f(row[tok]) * inv_t - (s_m[0] + logf(s_s[0]));
    }
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
    extern "C" __global__ void atomrl_pick_##SUFFIX(const T *logits, const float *noise,          \
                                                    int has_noise, float inv_t, int v,            \
                                                    unsigned *tokens, float *log_probs) {         \
        pick_row<T>(logits, noise, has_noise, inv_t, v, tokens, log_probs);                        \
    }

ENTRIES(float, f32)
ENTRIES(__nv_bfloat16, bf16)
ENTRIES(__half, f16)
