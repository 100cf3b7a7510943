// `__nv_bfloat16` for the host (sim.h): storage and the two conversions the kernels use,
// rounding to nearest even as CUDA's `__float2bfloat16` does.
#pragma once

#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
    uint16_t bits;
};

inline float __bfloat162float(__nv_bfloat16 h) {
    const uint32_t u = (uint32_t)h.bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{(uint16_t)((u >> 16) | 0x0040u)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return __nv_bfloat16{(uint16_t)(u >> 16)};
}
