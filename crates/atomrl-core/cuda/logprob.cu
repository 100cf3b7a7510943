// The selective log-softmax of a chunk of logits rows (atomrl-logprob, feature `cuda`): per row
// of `v` logits, the log-probability of one token and the entropy of softmax(x / T), and their
// backward, each one block per row reading the row in its dtype and computing in f32.
//
// They replace the tensor-op form of crates/atomrl-logprob/src/fused.rs (an f32 copy of the
// chunk, the scaled and shifted copies, their exponentials, reductions, a scatter and a cast:
// about seven passes over an [R, V] f32 buffer forward and fifteen backward) with two or three
// passes over the logits themselves. The formulas are that file's:
//   s_j = x_j / T − max, lse = log Σ e^{s_j}, lp = s_tok − lse, H = lse − Σ e^{s_j} s_j / Σ e^{s_j},
//   dx_j = (−p_j (g_lp + g_H (s_j − lse + H)) + [j = tok] g_lp) / T, p_j = e^{s_j} / Σ e^{s_j}.

#include "common.cuh"

// Row statistics: the max of x / T, Σ e^s and (when with_entropy) Σ e^s · s, to every thread.
template <typename T>
__device__ void row_stats(const T *row, int v, float inv_t, int with_entropy, float *mx,
                          float *sum, float *weighted) {
    float m = -INFINITY;
    for (int j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, to_f(row[j]) * inv_t);
    m = block_max(m);
    float s = 0.0f, w = 0.0f;
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        const float z = to_f(row[j]) * inv_t - m;
        const float e = expf(z);
        s += e;
        if (with_entropy) w += e * z;
    }
    *mx = m;
    *sum = block_sum(s);
    *weighted = with_entropy ? block_sum(w) : 0.0f;
}

// lp[r] and (when with_entropy) ent[r], f32.
template <typename T>
__device__ void selective_fwd(const T *logits, const uint32_t *tokens, float *lp, float *ent,
                              int v, float inv_t, int with_entropy) {
    const size_t r = blockIdx.x;
    const T *row = logits + r * v;
    float mx, sum, weighted;
    row_stats(row, v, inv_t, with_entropy, &mx, &sum, &weighted);
    if (threadIdx.x == 0) {
        const float lse = logf(sum);
        lp[r] = (to_f(row[tokens[r]]) * inv_t - mx) - lse;
        if (with_entropy) ent[r] = lse - weighted / sum;
    }
}

// dx [R, V] in the logits' dtype from g [R, 2] (f32: the log-prob and entropy columns).
template <typename T>
__device__ void selective_bwd(const T *logits, const uint32_t *tokens, const float *g, T *dx,
                              int v, float inv_t, int with_entropy) {
    const size_t r = blockIdx.x;
    const T *row = logits + r * v;
    T *out = dx + r * v;
    float mx, sum, weighted;
    row_stats(row, v, inv_t, with_entropy, &mx, &sum, &weighted);
    const float lse = logf(sum);
    const float h = lse - weighted / sum;
    const float g_lp = g[2 * r], g_h = with_entropy ? g[2 * r + 1] : 0.0f;
    const uint32_t tok = tokens[r];
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        const float s = to_f(row[j]) * inv_t - mx;
        const float p = expf(s) / sum;
        const float coef = with_entropy ? (s - lse + h) * g_h + g_lp : g_lp;
        float d = -(p * coef);
        if ((uint32_t)j == tok) d += g_lp;
        out[j] = from_f<T>(d * inv_t);
    }
}

#define ENTRIES(T, SUFFIX)                                                                        \
    extern "C" __global__ void atomrl_selective_log_softmax_fwd_##SUFFIX(                          \
        const T *logits, const uint32_t *tokens, float *lp, float *ent, int v, float inv_t,        \
        int with_entropy) {                                                                        \
        selective_fwd<T>(logits, tokens, lp, ent, v, inv_t, with_entropy);                         \
    }                                                                                              \
    extern "C" __global__ void atomrl_selective_log_softmax_bwd_##SUFFIX(                          \
        const T *logits, const uint32_t *tokens, const float *g, T *dx, int v, float inv_t,        \
        int with_entropy) {                                                                        \
        selective_bwd<T>(logits, tokens, g, dx, v, inv_t, with_entropy);                           \
    }

ENTRIES(float, f32)
ENTRIES(__nv_bfloat16, bf16)
ENTRIES(__half, f16)
