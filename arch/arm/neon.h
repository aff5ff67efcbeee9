/* NEON (AArch64 Advanced SIMD): what the neon files share (the vector width, the vector
 * vocabulary the templates are written in, the dot). */
#ifndef SDPA_ARCH_ARM_NEON_H
#define SDPA_ARCH_ARM_NEON_H

#include <arm_neon.h>
#include <stddef.h>

#include "any_address.h"
#include "kernels.h"
#include "neon_tails.h"

#define W 4

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* all ones in lanes [0, len), zero in the others */
static inline uint32x4_t lanes_below(size_t len) {
    const uint32x4_t index = {0, 1, 2, 3};
    return vcltq_u32(index, vdupq_n_u32((uint32_t)len));
}

static inline float32x4_t zero_where_not(uint32x4_t keep, float32x4_t v) {
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), keep));
}

/* ---- the vector vocabulary (docs/porting.md; arch/x86/avx512.h says why macros) ---- */
typedef float32x4_t vf;
typedef size_t vpart;              /* the length of a partial vector, < W */
#define VF_MASKED                0 /* lane by lane (neon_tails.h) */
#define vf_load(p)               vld1q_f32(p)
#define vf_store(p, v)           vst1q_f32(p, v)
#define vf_set1(a)               vdupq_n_f32(a)
#define vf_first(v)              vgetq_lane_f32(v, 0)
#define vf_max(a, b)             vmaxq_f32(a, b) /* NaN where either is */
#define vf_min(a, b)             vminq_f32(a, b)
#define vf_hsum(v)               vaddvq_f32(v)
#define vf_hmax(v)               vmaxvq_f32(v)
#define vpart_first(len)         (len) /* the first len floats, len < W, lane by lane */
#define vf_load_part(p, len)     load_partial(p, len)
#define vf_store_part(p, len, v) store_partial(p, v, len)
#define vf_max_part(acc, len, z)                                                                   \
    vmaxq_f32(acc, vbslq_f32(lanes_below(len), z, vdupq_n_f32(-INFINITY)))
#define vf_add_part(acc, len, e) vaddq_f32(acc, zero_where_not(lanes_below(len), e))
#define vf_lead(p)               ((void)(p), (size_t)0) /* no line-aligned loops */
static inline int rounds_to_nearest(void) {
    uint64_t fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    return !(fpcr & (3u << 22)); /* RMode */
}

/* One vector to and from the 16-bit types (arch/convert_rows.h): ARMv8.0's f16 conversions
 * (FCVTL, FCVTN), the narrowing only where it rounds as convert_portable.h does: under
 * round-to-nearest (it follows FPCR's mode) and with FPCR.FZ16 clear (with it, cores that have
 * it flush f16 subnormal results); bf16 is the upper half of a float, rounded in integers. */
static inline int narrow_f16_in_vectors(void) {
    uint64_t fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    return !(fpcr & (3u << 22 | 1u << 19)); /* RMode, FZ16 */
}
#define vf_widen_f16(p)     vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)))
#define vf_narrow_f16(p, x) vst1_u16(p, vreinterpret_u16_f16(vcvt_f16_f32(x)))
#define vf_narrow_f16_ok()  narrow_f16_in_vectors()
#define vf_widen_f16_ok()   narrow_f16_in_vectors() /* FZ16 would flush its inputs too */
static inline float32x4_t vf_widen_bf16(const uint16_t *p) {
    const uint32x4_t b = vshll_n_u16(vld1_u16(p), 16);
    const uint32x4_t nan = vmvnq_u32(vceqq_f32(vreinterpretq_f32_u32(b), vreinterpretq_f32_u32(b)));
    return vreinterpretq_f32_u32(vorrq_u32(b, vandq_u32(nan, vdupq_n_u32(0x00400000))));
}
static inline void vf_narrow_bf16(uint16_t *p, float32x4_t x) {
    const uint32x4_t b = vreinterpretq_u32_f32(x), high = vshrq_n_u32(b, 16);
    const uint32x4_t odd = vandq_u32(high, vdupq_n_u32(1));
    const uint32x4_t r = vshrq_n_u32(vaddq_u32(b, vaddq_u32(odd, vdupq_n_u32(0x7fff))), 16);
    const uint32x4_t nan = vmvnq_u32(vceqq_f32(x, x));
    vst1_u16(p, vmovn_u32(vbslq_u32(nan, vorrq_u32(high, vdupq_n_u32(0x0040)), r)));
}

/* ---- the vector vocabulary, continued: what the attention templates add ---- */
ALWAYS_INLINE vf vf_zero(void) { return vdupq_n_f32(0.0f); }
ALWAYS_INLINE vf vf_bcast(const float *p) { return vdupq_n_f32(load_f32(p)); }
ALWAYS_INLINE vf vf_madd(vf a, vf b, vf c) { return vfmaq_f32(c, a, b); }
ALWAYS_INLINE void vf_pin(vf *x) { (void)x; }

/* lane i: the sum of the lanes of a[i], for i < W (two pairwise adds) */
ALWAYS_INLINE vf vf_hsums(const vf *a) {
    return vpaddq_f32(vpaddq_f32(a[0], a[1]), vpaddq_f32(a[2], a[3]));
}
ALWAYS_INLINE void vf_store4(float *p, vf x, int c) {
    (void)c;
    vst1q_f32(p, x);
}

#include "dot_lanes.h"
static inline float dot_neon(const float *a, const float *b, size_t n) {
    return dot_lanes(a, b, n);
}

#endif
