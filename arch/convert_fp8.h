/* The OCP 8-bit floats widened to f16 (kernels.h's widen_fp8), in integer operations only, so
 * that no rounding mode, FTZ or DAZ changes a result.
 *
 * e5m2 is f16's top byte (the same exponent bias, two of its ten mantissa bits). e4m3's fields
 * placed in f16's (the exponent's four bits in the low four of f16's five, the three mantissa
 * bits at the top of its ten) are an f16 of 2^-8 times the e4m3 value, subnormals included: the
 * two formats differ only in the bias (7 against 15), and both read an exponent field of 0 as
 * 2^(1 - bias) times 0.m. So an e4m3 code is widened by a shift, with no case but NaN
 * (S.1111.111, its only one), which becomes an f16 NaN with the sign kept; the caller takes
 * the 2^8 back in a scale (SDPA_FP8_E4M3_F16_SHIFT).
 *
 * The scalar form is the definition (every backend's tail); a backend that defines W, its floats
 * a vector (every one, scalar's W being 1), also gets the same steps on vectors of 16-bit lanes,
 * as GCC's vector extensions compile them for its ISA. */
#ifndef SDPA_ARCH_CONVERT_FP8_H
#define SDPA_ARCH_CONVERT_FP8_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

/* the f16 bits of 2^-8 times e4m3 code c: the code's seven bits moved up by 7, its sign to
   f16's; NaN's exponent made all ones */
static inline uint16_t fp8_e4m3_to_f16(uint8_t c) {
    const unsigned a = c & 0x7fu, nan = a == 0x7fu ? 0x7c00u : 0;
    return (uint16_t)((c & 0x80u) << 8 | a << 7 | nan);
}

/* the f16 bits of e5m2 code c */
static inline uint16_t fp8_e5m2_to_f16(uint8_t c) { return (uint16_t)(c << 8); }

#ifdef W
/* 2 W lanes, at most 16: 256 bits of 16-bit lanes, which AVX-512F (no BW) handles as AVX2 does */
#define FP8_LANES (2 * W < 16 ? 2 * W : 16)
typedef int8_t vi8_fp8_ __attribute__((vector_size(FP8_LANES)));
typedef int16_t vi16_fp8_ __attribute__((vector_size(2 * FP8_LANES)));
typedef uint16_t vu16_fp8_ __attribute__((vector_size(2 * FP8_LANES)));

/* fp8_e4m3_to_f16 on a vector c of codes sign-extended to 16-bit lanes (a macro: GCC's vector
   extensions have no function generic in the lane count): shifted up by 7, the sign's copies
   land on bits 15 and 14, and the mask clears 14; then the one sum that carries into bit 14 is
   a NaN's (0x3f80 + 0x80), and that bit completes its exponent's ones */
#define E4M3_TO_F16_LANES_(c, h) ((h) = ((c) << 7) & 0xbfff, (h) | (((h) + 0x80) & 0x4000))

ALWAYS_INLINE vu16_fp8_ e4m3_to_f16_vector(vu16_fp8_ c) {
    vu16_fp8_ h;
    return E4M3_TO_F16_LANES_(c, h);
}

/* dst[i] = src[i] as f16 bits for i < n: FP8_LANES codes a step (or the ISA's own
   vf_widen_fp8 of VF_FP8_LANES, where its header has one), the tail by the scalar form */
ALWAYS_INLINE void widen_fp8_loops(uint16_t *dst, const uint8_t *src, size_t n, int e5m2) {
    size_t i = 0;
#ifdef VF_FP8_LANES
    for (; i + VF_FP8_LANES <= n; i += VF_FP8_LANES) vf_widen_fp8(dst + i, src + i, e5m2);
#endif
    for (; i + FP8_LANES <= n; i += FP8_LANES) {
        vi8_fp8_ raw;
        memcpy(&raw, src + i, sizeof raw);
        const vu16_fp8_ c = (vu16_fp8_) __builtin_convertvector(raw, vi16_fp8_);
        const vu16_fp8_ h = e5m2 ? c << 8 : e4m3_to_f16_vector(c);
        memcpy(dst + i, &h, sizeof h);
    }
    for (; i < n; i++) dst[i] = e5m2 ? fp8_e5m2_to_f16(src[i]) : fp8_e4m3_to_f16(src[i]);
}

static inline void widen_e4m3_f16_row(uint16_t *dst, const uint8_t *src, size_t n) {
    widen_fp8_loops(dst, src, n, 0);
}
static inline void widen_e5m2_f16_row(uint16_t *dst, const uint8_t *src, size_t n) {
    widen_fp8_loops(dst, src, n, 1);
}

#define FP8_ENTRIES .widen_fp8 = {widen_e4m3_f16_row, widen_e5m2_f16_row}

/* W codes (a vector of floats' lanes) as f16 bits in 16-bit lanes, in registers: the typed
   loads of the attention microkernels (arch/attention_tiles.h), which widen them on to floats.
   no_nan: e4m3 codes known to hold no NaN (e4m3_any_nan below), which skip its fix-up. The
   codes are sign-extended by the ISA's vf_fp8_codes where it has one; e4m3 with its NaN by
   the ISA's vf_fp8_to_f16 where that takes W codes. */
typedef int8_t vi8_fp8_w_ __attribute__((vector_size(W)));
typedef int16_t vi16_fp8_w_ __attribute__((vector_size(2 * W)));
typedef uint16_t vu16_fp8_w_ __attribute__((vector_size(2 * W)));
ALWAYS_INLINE vu16_fp8_w_ fp8_to_f16_lanes(const uint8_t *p, int e5m2, int no_nan) {
#if defined(VF_FP8_LANES) && VF_FP8_LANES == W
    if (!e5m2 && !no_nan) return (vu16_fp8_w_)vf_fp8_to_f16(p, 0);
#endif
#ifdef vf_fp8_codes
    const vu16_fp8_w_ c = (vu16_fp8_w_)vf_fp8_codes(p);
#else
    vi8_fp8_w_ raw;
    memcpy(&raw, p, sizeof raw);
    const vu16_fp8_w_ c = (vu16_fp8_w_) __builtin_convertvector(raw, vi16_fp8_w_);
#endif
    vu16_fp8_w_ h;
    if (e5m2) return c << 8;
    return no_nan ? (c << 7) & 0xbfff : E4M3_TO_F16_LANES_(c, h);
}

/* Whether any of the n codes at p is e4m3's NaN (S.1111.111): four codes a 32-bit lane, where
   a code's low seven bits plus 1 reach its top bit only for NaN, and no carry leaves its byte. */
typedef uint32_t vu32_fp8_w_ __attribute__((vector_size(4 * W)));
ALWAYS_INLINE int e4m3_any_nan(const uint8_t *p, size_t n) {
    vu32_fp8_w_ acc = {0}, acc2 = {0}; /* two chains: the loads of a block in L1 keep pace */
    size_t i = 0;
    for (; i + 2 * sizeof acc <= n; i += 2 * sizeof acc) {
        vu32_fp8_w_ w, w2;
        memcpy(&w, p + i, sizeof w);
        memcpy(&w2, p + i + sizeof w, sizeof w);
        acc |= (w & 0x7f7f7f7fu) + 0x01010101u;
        acc2 |= (w2 & 0x7f7f7f7fu) + 0x01010101u;
    }
    for (; i + sizeof acc <= n; i += sizeof acc) {
        vu32_fp8_w_ w;
        memcpy(&w, p + i, sizeof w);
        acc |= (w & 0x7f7f7f7fu) + 0x01010101u;
    }
    acc |= acc2;
    uint32_t any = 0;
    for (int l = 0; l < W; l++) any |= acc[l];
    for (; i < n; i++) any |= (p[i] & 0x7fu) + 1u;
    return (any & 0x80808080u) != 0;
}
#endif

#endif
