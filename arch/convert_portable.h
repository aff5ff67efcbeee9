/* One element between float and the 16-bit types, in portable C: the scalar backend's
 * vocabulary's conversions, and the tails and fallbacks of the SIMD ones. Integer operations only,
 * so the result never depends on the rounding mode or on flush-to-zero and denormals-are-zero:
 *   widening is exact (every f16 and bf16 value is a float), a NaN stays a NaN, quieted;
 *   narrowing rounds to nearest, ties to even; a NaN stays a NaN, quieted, with its sign; a
 *   float beyond the largest finite f16 (65504, or the halfway point above it) gives inf; f16
 *   results may be subnormal (the nearest f16), and so may bf16's, whose exponent is float's. */
#ifndef SDPA_ARCH_CONVERT_PORTABLE_H
#define SDPA_ARCH_CONVERT_PORTABLE_H

#include <stdint.h>
#include <string.h>

static inline float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu;
    uint32_t bits;
    if (em >= 0x7c00u) { /* inf, or NaN with its payload, quieted */
        bits = 0x7f800000u | (em & 0x3ffu) << 13;
        if (em > 0x7c00u) bits |= 0x00400000u;
    } else if (em >= 0x0400u) { /* normal: rebias the exponent */
        bits = (em << 13) + ((127u - 15u) << 23);
    } else { /* subnormal or zero: m 2^-24 counted out, exactly, in integers */
        uint32_t m = em, e = 127u - 14u;
        if (m == 0) return f32_from_bits(sign);
        while (!(m & 0x0400u)) {
            m <<= 1;
            e--;
        }
        bits = e << 23 | (m & 0x3ffu) << 13;
    }
    return f32_from_bits(sign | bits);
}

static inline uint16_t f32_to_f16(float f) {
    const uint32_t bits = f32_bits(f), sign = (bits >> 16) & 0x8000u, a = bits & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | (a >> 13 & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* 65520 and up round to inf */
    if (a >= 0x38800000u) { /* a normal f16: drop 13 bits, ties to even */
        const uint32_t rebiased = a - ((127u - 15u) << 23);
        return (uint16_t)(sign | (rebiased + 0x0fffu + (rebiased >> 13 & 1u)) >> 13);
    }
    if (a < 0x33000000u) return (uint16_t)sign; /* at most half the smallest subnormal: 0 */
    /* a subnormal f16: the significand with its hidden bit, shifted to units of 2^-24 */
    const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e; /* 14..24 */
    const uint32_t half = 1u << (shift - 1), rest = m & ((half << 1) - 1u);
    uint32_t q = m >> shift;
    if (rest > half || (rest == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

static inline float bf16_to_f32(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    if ((bits & 0x7fffffffu) > 0x7f800000u) bits |= 0x00400000u;
    return f32_from_bits(bits);
}

static inline uint16_t f32_to_bf16(float f) {
    const uint32_t bits = f32_bits(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(bits >> 16 | 0x0040u);
    return (uint16_t)((bits + 0x7fffu + (bits >> 16 & 1u)) >> 16);
}

#endif
