// `__half` for the host (sim.h): storage and the two conversions the kernels use, rounding to
// nearest even as CUDA's `__float2half` does (overflow to infinity, subnormals kept).
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

struct __half {
    uint16_t bits;
};

inline float __half2float(__half h) {
    const uint32_t sign = (uint32_t)(h.bits & 0x8000u) << 16;
    const uint32_t exp = (h.bits >> 10) & 0x1fu, mant = h.bits & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        const float f = ldexpf((float)mant, -24);  // zero or subnormal: exact
        memcpy(&u, &f, sizeof u);
    } else if (exp == 31) {
        u = 0x7f800000u | (mant << 13);
    } else {
        u = ((exp + 112u) << 23) | (mant << 13);
    }
    u |= sign;
    float out;
    memcpy(&out, &u, sizeof out);
    return out;
}

inline __half __float2half(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return __half{(uint16_t)(sign | 0x7e00u)};  // NaN
    if (a >= 0x477ff000u) return __half{(uint16_t)(sign | 0x7c00u)};  // ≥ 65520: infinity
    if (a < 0x38800000u) {
        // Below 2^-14: a subnormal half, round(|f| · 2^24) (exact scaling, nearest even).
        float af;
        memcpy(&af, &a, sizeof af);
        return __half{(uint16_t)(sign | (uint16_t)nearbyintf(af * 16777216.0f))};
    }
    uint32_t h = ((((a >> 23) - 112u) << 10) | ((a & 0x7fffffu) >> 13));
    const uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;  // a carry moves the exponent
    return __half{(uint16_t)(sign | h)};
}
