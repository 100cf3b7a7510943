// Fused decoder kernels for CUDA tensors (atomrl-model's kernels, feature `cuda`): RMSNorm, the
// attention softmax with its causal and key-padding mask applied from a description, rotary
// embeddings and the SwiGLU gate, each a forward and a backward.
//
// They mirror the CPU kernels of crates/atomrl-model/src/kernels/ formula for formula; every
// kernel reads and writes the tensor's dtype (f32, bf16, f16) and computes in f32, rounding where
// the tensor-op forms round (an RMSNorm's normalised value is rounded to the dtype before the
// weight multiplies it, as `y.to_dtype(dtype).broadcast_mul(weight)` does).
//
// Row kernels run one block per row with a block-wide f32 reduction (warp shuffles, then one
// shared-memory pass); elementwise kernels use grid-stride loops.

#include "common.cuh"

// ---- RMSNorm: y = w · round(x / sqrt(mean(x²) + eps)), rows of width h, one block per row.
// round_xhat = 0 skips the inner rounding (y = round(w · x / rms), as candle's forward-only
// kernel computes it): the generation view's form, which earlier releases decoded with.

template <typename T>
__device__ void rms_norm_fwd(const T *x, const T *w, T *y, int h, float eps, int round_xhat) {
    const T *xr = x + (size_t)blockIdx.x * h;
    T *yr = y + (size_t)blockIdx.x * h;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < h; j += blockDim.x) {
        float v = to_f(xr[j]);
        ss += v * v;
    }
    const float inv = 1.0f / sqrtf(block_sum(ss) / (float)h + eps);
    for (int j = threadIdx.x; j < h; j += blockDim.x) {
        float xhat = to_f(xr[j]) * inv;
        if (round_xhat) xhat = to_f(from_f<T>(xhat));
        yr[j] = from_f<T>(to_f(w[j]) * xhat);
    }
}

// The residual add and the RMSNorm after it, forward only (the decode step): s = round(x + r),
// y = round(w · s / sqrt(mean(s²) + eps)); one block per row writes both. One launch for the
// add and the generation view's norm (round_xhat = 0 above) apart, with the same roundings.
template <typename T>
__device__ void add_rms_norm_fwd(const T *x, const T *r, const T *w, T *s, T *y, int h,
                                 float eps) {
    const size_t off = (size_t)blockIdx.x * h;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < h; j += blockDim.x) {
        const T v = from_f<T>(to_f(x[off + j]) + to_f(r[off + j]));
        s[off + j] = v;
        const float f = to_f(v);
        ss += f * f;
    }
    const float inv = 1.0f / sqrtf(block_sum(ss) / (float)h + eps);
    // Each thread reads back only the elements it wrote above.
    for (int j = threadIdx.x; j < h; j += blockDim.x)
        y[off + j] = from_f<T>(to_f(w[j]) * (to_f(s[off + j]) * inv));
}

// inv[r] = 1 / sqrt(mean(x_r²) + eps) in f32, one block per row.
template <typename T>
__device__ void rms_norm_inv(const T *x, float *inv, int h, float eps) {
    const T *xr = x + (size_t)blockIdx.x * h;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < h; j += blockDim.x) {
        float v = to_f(xr[j]);
        ss += v * v;
    }
    const float total = block_sum(ss);
    if (threadIdx.x == 0) inv[blockIdx.x] = 1.0f / sqrtf(total / (float)h + eps);
}

// dx = inv · (g·w − x̂ · mean(g·w·x̂)), x̂ = x · inv; one block per row.
template <typename T>
__device__ void rms_norm_dx(const T *x, const T *w, const T *g, const float *inv, T *dx, int h) {
    const size_t off = (size_t)blockIdx.x * h;
    const float iv = inv[blockIdx.x];
    float dot = 0.0f;
    for (int j = threadIdx.x; j < h; j += blockDim.x)
        dot += to_f(g[off + j]) * to_f(w[j]) * (to_f(x[off + j]) * iv);
    const float mean = block_sum(dot) / (float)h;
    for (int j = threadIdx.x; j < h; j += blockDim.x) {
        float xhat = to_f(x[off + j]) * iv;
        dx[off + j] = from_f<T>(iv * (to_f(g[off + j]) * to_f(w[j]) - xhat * mean));
    }
}

// part[c, j] = Σ_{r in chunk c} g[r, j] · x[r, j] · inv[r] (f32): grid (ceil(h / blockDim), chunks);
// the chunks are then summed in order (a deterministic dw, no atomics).
template <typename T>
__device__ void rms_norm_dw_part(const T *x, const T *g, const float *inv, float *part, int rows,
                                 int h, int chunk) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= h) return;
    const int r0 = blockIdx.y * chunk;
    const int r1 = min(rows, r0 + chunk);
    float acc = 0.0f;
    for (int r = r0; r < r1; r++) {
        const size_t k = (size_t)r * h + j;
        acc += to_f(g[k]) * (to_f(x[k]) * inv[r]);
    }
    part[(size_t)blockIdx.y * h + j] = acc;
}

// ---- SwiGLU: y = silu(gate) · up, silu(g) = g / (1 + e^−g).

template <typename T>
__device__ void swiglu_fwd(const T *gate, const T *up, T *y, size_t n) {
    GRID_STRIDE(i, n) {
        float g = to_f(gate[i]);
        y[i] = from_f<T>(g / (expf(-g) + 1.0f) * to_f(up[i]));
    }
}

// out[0..n) = dgate = G · up · σ(g)(1 + g(1 − σ(g))), out[n..2n) = dup = G · silu(g).
template <typename T>
__device__ void swiglu_bwd(const T *gate, const T *up, const T *grad, T *out, size_t n) {
    GRID_STRIDE(i, n) {
        float g = to_f(gate[i]), u = to_f(up[i]), gr = to_f(grad[i]);
        float den = expf(-g) + 1.0f;
        float s = 1.0f / den, silu = g / den;
        out[i] = from_f<T>(gr * u * (s * (1.0f + g * (1.0f - s))));
        out[n + i] = from_f<T>(gr * silu);
    }
}

// SwiGLU of a merged gate/up projection, forward only (the decode step): gu [R, 2·I] holds
// gate | up per row; y [R, I] = silu(gate) · up.
template <typename T>
__device__ void swiglu_packed_fwd(const T *gu, T *y, int inter, size_t n) {
    GRID_STRIDE(i, n) {
        const size_t r = i / inter, j = i % inter;
        const T *row = gu + r * 2 * inter;
        float g = to_f(row[j]);
        y[i] = from_f<T>(g / (expf(-g) + 1.0f) * to_f(row[inter + j]));
    }
}

// ---- Rotary embeddings, rotate-half layout: x [N, H, L, d], tables [N, 1, L, d].
// back = 0: y = x·cos + R(x)·sin, R([x₁, x₂]) = [−x₂, x₁];
// back = 1: dx = g·cos + Rᵀ(g·sin), Rᵀ([u₁, u₂]) = [u₂, −u₁]. One thread per (row, k < d/2).
// x_tm / y_tm: that tensor lies token-major, as [N, L, H, d] in memory (the projections' own
// layout, so the forward reads them without a transposing copy, and the backward writes the
// gradient back in it); otherwise head-major, as [N, H, L, d].

template <typename T>
__device__ void rope(const T *x, const T *cos, const T *sin, T *y, int heads, int l, int d,
                     size_t rows, int back, int x_tm, int y_tm) {
    const int half = d / 2;
    GRID_STRIDE(i, rows * half) {
        const size_t r = i / half;
        const int k = (int)(i % half);
        const size_t n = r / ((size_t)heads * l);
        const size_t h = (r / l) % heads;
        const size_t pos = r % l;
        const size_t t = (n * l + pos) * d;
        const size_t tm = ((n * l + pos) * heads + h) * d;
        const size_t xo = x_tm ? tm : r * d;
        const size_t yo = y_tm ? tm : r * d;
        const float a = to_f(x[xo + k]), b = to_f(x[xo + k + half]);
        const float c1 = to_f(cos[t + k]), c2 = to_f(cos[t + k + half]);
        const float s1 = to_f(sin[t + k]), s2 = to_f(sin[t + k + half]);
        if (back) {
            y[yo + k] = from_f<T>(a * c1 + b * s2);
            y[yo + k + half] = from_f<T>(b * c2 - a * s1);
        } else {
            y[yo + k] = from_f<T>(a * c1 - b * s1);
            y[yo + k + half] = from_f<T>(b * c2 + a * s2);
        }
    }
}

// ---- Attention probabilities: softmax over keys of scale · scores + bias, scores [N, H, L, S],
// one block per row. The bias comes from a description: `causal` adds mask_value to keys after
// the query (key j > past + i), and `pad` ([N, S] in the dtype, 0 or mask_value) adds a row's
// key-padding bias when has_pad. Masked scores underflow to exactly 0 below −746, as on the CPU.

template <typename T>
__device__ float attn_score(const T *row, const T *pad_row, int j, int i, float scale,
                            int causal, int past, float mask_value, int has_pad) {
    float t = to_f(row[j]) * scale;
    if (causal && j > past + i) t += mask_value;
    if (has_pad) t += to_f(pad_row[j]);
    return t;
}

template <typename T>
__device__ void attn_softmax_fwd(const T *scores, const T *pad, T *p, int heads, int l, int s,
                                 int past, int causal, float scale, float mask_value,
                                 int has_pad) {
    const size_t r = blockIdx.x;
    const int i = (int)(r % l);
    const size_t n = r / ((size_t)heads * l);
    const T *row = scores + r * s;
    const T *pad_row = pad + (has_pad ? n * s : 0);
    T *out = p + r * s;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < s; j += blockDim.x)
        mx = fmaxf(mx, attn_score(row, pad_row, j, i, scale, causal, past, mask_value, has_pad));
    mx = block_max(mx);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < s; j += blockDim.x) {
        float z = attn_score(row, pad_row, j, i, scale, causal, past, mask_value, has_pad) - mx;
        sum += z < -746.0f ? 0.0f : expf(z);
    }
    const float inv = 1.0f / block_sum(sum);
    for (int j = threadIdx.x; j < s; j += blockDim.x) {
        float z = attn_score(row, pad_row, j, i, scale, causal, past, mask_value, has_pad) - mx;
        out[j] = from_f<T>((z < -746.0f ? 0.0f : expf(z)) * inv);
    }
}

// dscores = scale · p · (g − Σ g·p), one block per row.
template <typename T>
__device__ void attn_softmax_bwd(const T *p, const T *g, T *dx, int s, float scale) {
    const size_t off = (size_t)blockIdx.x * s;
    float dot = 0.0f;
    for (int j = threadIdx.x; j < s; j += blockDim.x) dot += to_f(p[off + j]) * to_f(g[off + j]);
    dot = block_sum(dot);
    for (int j = threadIdx.x; j < s; j += blockDim.x)
        dx[off + j] = from_f<T>(scale * (to_f(p[off + j]) * (to_f(g[off + j]) - dot)));
}

// ---- Entry points, one per dtype: NAME_f32, NAME_bf16, NAME_f16.

#define ENTRIES(T, SUFFIX)                                                                        \
    extern "C" __global__ void atomrl_rms_norm_fwd_##SUFFIX(const T *x, const T *w, T *y, int h,  \
                                                            float eps, int round_xhat) {          \
        rms_norm_fwd<T>(x, w, y, h, eps, round_xhat);                                              \
    }                                                                                              \
    extern "C" __global__ void atomrl_add_rms_norm_fwd_##SUFFIX(                                  \
        const T *x, const T *r, const T *w, T *s, T *y, int h, float eps) {                        \
        add_rms_norm_fwd<T>(x, r, w, s, y, h, eps);                                                \
    }                                                                                              \
    extern "C" __global__ void atomrl_swiglu_packed_fwd_##SUFFIX(const T *gu, T *y, int inter,     \
                                                                 size_t n) {                      \
        swiglu_packed_fwd<T>(gu, y, inter, n);                                                     \
    }                                                                                              \
    extern "C" __global__ void atomrl_rms_norm_inv_##SUFFIX(const T *x, float *inv, int h,        \
                                                            float eps) {                          \
        rms_norm_inv<T>(x, inv, h, eps);                                                           \
    }                                                                                              \
    extern "C" __global__ void atomrl_rms_norm_dx_##SUFFIX(const T *x, const T *w, const T *g,    \
                                                           const float *inv, T *dx, int h) {      \
        rms_norm_dx<T>(x, w, g, inv, dx, h);                                                       \
    }                                                                                              \
    extern "C" __global__ void atomrl_rms_norm_dw_part_##SUFFIX(                                   \
        const T *x, const T *g, const float *inv, float *part, int rows, int h, int chunk) {       \
        rms_norm_dw_part<T>(x, g, inv, part, rows, h, chunk);                                      \
    }                                                                                              \
    extern "C" __global__ void atomrl_swiglu_fwd_##SUFFIX(const T *gate, const T *up, T *y,       \
                                                          size_t n) {                             \
        swiglu_fwd<T>(gate, up, y, n);                                                             \
    }                                                                                              \
    extern "C" __global__ void atomrl_swiglu_bwd_##SUFFIX(const T *gate, const T *up,             \
                                                          const T *grad, T *out, size_t n) {      \
        swiglu_bwd<T>(gate, up, grad, out, n);                                                     \
    }                                                                                              \
    extern "C" __global__ void atomrl_rope_##SUFFIX(const T *x, const T *cos, const T *sin, T *y, \
                                                    int heads, int l, int d, size_t rows,         \
                                                    int back, int x_tm, int y_tm) {               \
        rope<T>(x, cos, sin, y, heads, l, d, rows, back, x_tm, y_tm);                              \
    }                                                                                              \
    extern "C" __global__ void atomrl_attn_softmax_fwd_##SUFFIX(                                   \
        const T *scores, const T *pad, T *p, int heads, int l, int s, int past, int causal,       \
        float scale, float mask_value, int has_pad) {                                             \
        attn_softmax_fwd<T>(scores, pad, p, heads, l, s, past, causal, scale, mask_value,         \
                            has_pad);                                                              \
    }                                                                                              \
    extern "C" __global__ void atomrl_attn_softmax_bwd_##SUFFIX(const T *p, const T *g, T *dx,     \
                                                                int s, float scale) {             \
        attn_softmax_bwd<T>(p, g, dx, s, scale);                                                   \
    }

ENTRIES(float, f32)
ENTRIES(__nv_bfloat16, bf16)
ENTRIES(__half, f16)
