/* Internal: the OCP 8-bit floats. e4m3 (SDPA_FP8_E4M3): sign, 4 exponent bits (bias 7), 3
 * mantissa bits; no inf, S.1111.111 is NaN, the largest finite 448. e5m2 (SDPA_FP8_E5M2): sign,
 * 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like, the largest finite 57344. Converted in
 * integer arithmetic on the bit patterns, so no rounding mode, FTZ or DAZ changes a result. */
#ifndef SDPA_SRC_FP8_H
#define SDPA_SRC_FP8_H

#include <stddef.h>
#include <stdint.h>

static inline int sdpa_type_is_fp8(uint32_t t) { return t == 3 || t == 4; }

/* dst[i] = src[i] as float, exactly (NaN stays NaN, e5m2's infinities stay infinite). */
void sdpa_fp8_widen(float *dst, const uint8_t *src, size_t n, uint32_t type);

/* Every code's float as a backend's widen_fp8 and then widen[f16] give it (arch/kernels.h: e4m3
 * at 2^-8 of its value), for a backend whose own conversions go an element at a time. */
const float *sdpa_fp8_kernel_floats(uint32_t type);

/* dst[i] = src[i] rounded to nearest, ties to even. Past the largest finite value (after
 * rounding) e4m3 saturates to +-448 (infinities too) and e5m2 becomes +-inf; NaN stays NaN. */
void sdpa_fp8_narrow(uint8_t *dst, const float *src, size_t n, uint32_t type);

#endif
