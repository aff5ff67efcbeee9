/* The widening and narrowing kernels of every backend (kernels.h's widen and narrow),
 * written once over each ISA's conversions of one vector (arch/x86/<isa>.h, arch/arm/neon.h):
 *   vf_widen_f16(p), vf_widen_bf16(p)         W 16-bit values at p, as floats, exactly
 *   vf_narrow_f16(p, x), vf_narrow_bf16(p, x) x's W floats to p, as convert_portable.h rounds
 *   vf_widen_f16_ok(), vf_narrow_f16_ok()      whether vf_widen_f16 and vf_narrow_f16 convert as
 *                                              convert_portable.h does in the caller's
 *                                              floating-point environment (F16C and NEON may read
 *                                              or write f16 subnormals as 0 under DAZ or FTZ, and
 *                                              NEON's narrowing follows the rounding mode)
 * Where they do not, f16 is widened by widen_f16_exact (below, in integer operations) and
 * narrowed element by element.
 * The tails, fewer than W elements, take convert_portable.h's: the masked 16-bit loads and
 * stores they would need are not in every ISA (AVX-512F lacks them). */
#ifndef SDPA_ARCH_CONVERT_ROWS_H
#define SDPA_ARCH_CONVERT_ROWS_H

#include "any_address.h"
#include "convert_fp8.h"
#include "convert_portable.h"
#include "kernels.h"

typedef uint32_t vu32_ __attribute__((vector_size(4 * W)));
typedef uint16_t vu16_ __attribute__((vector_size(2 * W)));
typedef float vf32_ __attribute__((vector_size(4 * W)));

/* W 32-bit lanes as a vf: a cast, or the ISA's where vf is no vector type (scalar's float) */
#ifndef vf_of_lanes
#define vf_of_lanes(x) ((vf)(x))
#endif

/* W f16 values from p as floats, exactly, in any floating-point environment: the exponent
 * rebiased in integers; a subnormal m 2^-24 as 2^-14 (1 + m 2^-10) - 2^-14, a difference of
 * normal floats, which is exact and so untouched by the rounding mode, FTZ and DAZ (and +0, not
 * -0, for m = 0 when rounding down). GCC's vector extensions: one source for every width. */
ALWAYS_INLINE vf widen_f16_exact(const uint16_t *p) {
    vu16_ raw;
    memcpy(&raw, p, sizeof raw);
    const vu32_ h = __builtin_convertvector(raw, vu32_), em = h & 0x7fffu, sign = (h ^ em) << 16;
    vu32_ f = (em << 13) + (112u << 23);
    f += (vu32_)(em > 0x7bffu) & (112u << 23); /* inf and NaN: the top exponent */
    f |= (vu32_)(em > 0x7c00u) & 0x00400000u;  /* NaN: quieted */
    const vf32_ sub = (vf32_)(f + (1u << 23)) - 0x1p-14f;
    const vu32_ tiny = (vu32_)(em < 0x0400u), subnormal = (vu32_)sub & (vu32_)(em > 0u);
    return vf_of_lanes((tiny & subnormal) | (~tiny & f) | sign);
}

ALWAYS_INLINE vf widen_vector(const uint16_t *p, int type, int exact) {
    if (type == SDPA_TYPE_F16) return exact ? widen_f16_exact(p) : vf_widen_f16(p);
    return vf_widen_bf16(p);
}

ALWAYS_INLINE void narrow_vector(uint16_t *p, vf x, int type) {
    if (type == SDPA_TYPE_F16)
        vf_narrow_f16(p, x);
    else
        vf_narrow_bf16(p, x);
}

ALWAYS_INLINE void widen_portable(f32_any *dst, const u16_any *src, size_t n, int type) {
    for (size_t i = 0; i < n; i++)
        dst[i] = type == SDPA_TYPE_F16 ? f16_to_f32(src[i]) : bf16_to_f32(src[i]);
}

ALWAYS_INLINE void narrow_portable(u16_any *dst, const f32_any *src, size_t n, int type) {
    for (size_t i = 0; i < n; i++)
        dst[i] = type == SDPA_TYPE_F16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
}

/* four vectors a step: the conversions are a port's or two a vector, so they keep pace with the
 * loads and stores of a stream beyond L1 only with several in flight */
ALWAYS_INLINE void widen_loops(float *dst, const uint16_t *s, size_t n, int type, int exact) {
    size_t i = 0;
    for (; i + 4 * W <= n; i += 4 * W) {
        const vf x0 = widen_vector(s + i, type, exact), x1 = widen_vector(s + i + W, type, exact);
        const vf x2 = widen_vector(s + i + 2 * W, type, exact);
        const vf x3 = widen_vector(s + i + 3 * W, type, exact);
        vf_store(dst + i, x0);
        vf_store(dst + i + W, x1);
        vf_store(dst + i + 2 * W, x2);
        vf_store(dst + i + 3 * W, x3);
    }
    for (; i + W <= n; i += W) vf_store(dst + i, widen_vector(s + i, type, exact));
    widen_portable(dst + i, s + i, n - i, type);
}

ALWAYS_INLINE void widen_row(float *dst, const void *src, size_t n, int type) {
    if (type == SDPA_TYPE_F16 && !vf_widen_f16_ok())
        widen_loops(dst, src, n, type, 1);
    else
        widen_loops(dst, src, n, type, 0);
}

ALWAYS_INLINE void narrow_row(void *dst, const float *src, size_t n, int type) {
    uint16_t *d = dst;
    size_t i = 0;
    if (type == SDPA_TYPE_F16 && !vf_narrow_f16_ok()) {
        narrow_portable(d, src, n, type);
        return;
    }
    for (; i + 4 * W <= n; i += 4 * W) {
        const vf x0 = vf_load(src + i), x1 = vf_load(src + i + W);
        const vf x2 = vf_load(src + i + 2 * W), x3 = vf_load(src + i + 3 * W);
        narrow_vector(d + i, x0, type);
        narrow_vector(d + i + W, x1, type);
        narrow_vector(d + i + 2 * W, x2, type);
        narrow_vector(d + i + 3 * W, x3, type);
    }
    for (; i + W <= n; i += W) narrow_vector(d + i, vf_load(src + i), type);
    narrow_portable(d + i, src + i, n - i, type);
}

static inline void widen_f16_row(float *dst, const void *src, size_t n) {
    widen_row(dst, src, n, SDPA_TYPE_F16);
}
static inline void widen_bf16_row(float *dst, const void *src, size_t n) {
    widen_row(dst, src, n, SDPA_TYPE_BF16);
}
static inline void narrow_f16_row(void *dst, const float *src, size_t n) {
    narrow_row(dst, src, n, SDPA_TYPE_F16);
}
static inline void narrow_bf16_row(void *dst, const float *src, size_t n) {
    narrow_row(dst, src, n, SDPA_TYPE_BF16);
}

/* the table's entries, indexed by type (f32 needs none), and the 8-bit ones */
#define CONVERT_ENTRIES                                                                            \
    .widen = {NULL, widen_f16_row, widen_bf16_row},                                                \
    .narrow = {NULL, narrow_f16_row, narrow_bf16_row}, FP8_ENTRIES

#endif
