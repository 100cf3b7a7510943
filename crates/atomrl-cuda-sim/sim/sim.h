// The CUDA language as AtomRL's kernels use it, for a host C++ compiler (force-included before
// every `.cu` file by build.rs). Each CUDA thread of a block is a host thread (runtime.cpp);
// `__syncthreads` is a barrier over the block, a warp shuffle a barrier over the warp, and
// `__shared__` memory a function-local static (blocks run one after another). The arithmetic
// is IEEE f32 in round-to-nearest, as the GPU's `_rn` intrinsics are; build.rs turns off FMA
// contraction, as the kernels' intrinsics do on the GPU. `expf`, `logf` and `sqrtf` are the C
// library's, so transcendental results may differ from the GPU's in the last bits.
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define __global__
#define __device__ inline
#define __host__
#define __forceinline__
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct uint2 {
    unsigned x, y;
};
struct uint3 {
    unsigned x, y, z;
};
struct uint4 {
    unsigned x, y, z, w;
};
struct dim3 {
    unsigned x, y, z;
};

inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    return uint4{x, y, z, w};
}

// The running launch: set by runtime.cpp before a block's threads start.
extern thread_local uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;

extern "C" void atomrl_sim_syncthreads(void);
extern "C" uint64_t atomrl_sim_shfl_xor(uint64_t bits, int lane_mask);

extern "C" void atomrl_sim_syncwarp(void);

inline void __syncthreads() { atomrl_sim_syncthreads(); }
// A barrier over the warp (the kernels pass a full mask; partial masks are not emulated).
inline void __syncwarp(unsigned = 0xffffffffu) { atomrl_sim_syncwarp(); }

// Every lane of the warp exchanges `v` with lane `lane ^ lane_mask` (the kernels pass a full
// mask; partial masks are not emulated).
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int lane_mask) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "a shuffled value fits 64 bits");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    bits = atomrl_sim_shfl_xor(bits, lane_mask);
    T out;
    memcpy(&out, &bits, sizeof(T));
    return out;
}

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline unsigned __umulhi(unsigned a, unsigned b) {
    return (unsigned)(((uint64_t)a * (uint64_t)b) >> 32);
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, sizeof u);
    return u;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
