// `nvcuda::wmma` for the host (sim.h), as AtomRL's kernels use it: 16 × 16 × 16 tiles of bf16 or
// f16 inputs with f32 accumulators.
//
// On the GPU a fragment is spread over the warp's 32 lanes in a layout CUDA leaves unspecified,
// so a kernel may only load, store, fill and multiply fragments and apply one operation to
// every element. Here every lane holds the whole tile (num_elements = 256) and computes the
// whole product itself: any kernel that keeps to those rules computes the same values, and one
// that assumed a layout would fail its tests. Each load, store and product waits for the whole
// warp first, as the `.sync` of PTX's `wmma` instructions does. A store is made by lane 0 alone,
// as one write of the warp: a lane that reads the stored tile without a __syncwarp or
// __syncthreads after the store races with it, as it would on the GPU. Products are exact in f32 and summed in k order
// from the accumulator; a tensor core's own order may differ in the last bits.
#pragma once

#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_fp16.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static constexpr int rows = std::is_same<Use, matrix_b>::value ? K : M;
    static constexpr int cols = std::is_same<Use, matrix_a>::value ? K : N;
    static constexpr int num_elements = rows * cols;
    T x[num_elements];
};

inline float sim_to_f(float x) { return x; }
inline float sim_to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
inline float sim_to_f(__half x) { return __half2float(x); }

// Element (r, c) of a tile at p with leading dimension ldm.
inline unsigned sim_at(bool row_major_, int r, int c, unsigned ldm) {
    return row_major_ ? r * ldm + c : c * ldm + r;
}

template <typename Use, int M, int N, int K, typename T, typename L>
inline void fill_fragment(fragment<Use, M, N, K, T, L> &a, T v) {
    for (auto &e : a.x) e = v;
}

// An input fragment (matrix_a or matrix_b) in its declared layout.
template <typename Use, int M, int N, int K, typename T, typename L>
inline void load_matrix_sync(fragment<Use, M, N, K, T, L> &a, const T *p, unsigned ldm) {
    using F = fragment<Use, M, N, K, T, L>;
    __syncwarp();
    const bool rm = std::is_same<L, row_major>::value;
    for (int r = 0; r < F::rows; ++r)
        for (int c = 0; c < F::cols; ++c) a.x[r * F::cols + c] = p[sim_at(rm, r, c, ldm)];
}

// An accumulator, in the layout given at the call.
template <int M, int N, int K>
inline void load_matrix_sync(fragment<accumulator, M, N, K, float> &a, const float *p,
                             unsigned ldm, layout_t layout) {
    __syncwarp();
    for (int r = 0; r < M; ++r)
        for (int c = 0; c < N; ++c) a.x[r * N + c] = p[sim_at(layout == mem_row_major, r, c, ldm)];
}

template <int M, int N, int K>
inline void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, float> &a,
                              unsigned ldm, layout_t layout) {
    __syncwarp();
    if (threadIdx.x % 32 != 0) return;
    for (int r = 0; r < M; ++r)
        for (int c = 0; c < N; ++c) p[sim_at(layout == mem_row_major, r, c, ldm)] = a.x[r * N + c];
}

// d = a · b + c (d may be c).
template <int M, int N, int K, typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, M, N, K, float> &d,
                     const fragment<matrix_a, M, N, K, T, LA> &a,
                     const fragment<matrix_b, M, N, K, T, LB> &b,
                     const fragment<accumulator, M, N, K, float> &c) {
    __syncwarp();
    float out[M * N];
    for (int r = 0; r < M; ++r) {
        for (int j = 0; j < N; ++j) {
            float acc = c.x[r * N + j];
            for (int k = 0; k < K; ++k) acc += sim_to_f(a.x[r * K + k]) * sim_to_f(b.x[k * N + j]);
            out[r * N + j] = acc;
        }
    }
    for (int e = 0; e < M * N; ++e) d.x[e] = out[e];
}

}  // namespace wmma
}  // namespace nvcuda
