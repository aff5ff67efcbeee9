/* NEON (AArch64 Advanced SIMD): what the neon files share (the vector width and the vector
 * operations the attention templates are written in). */
#ifndef SDPA_ARCH_ARM_NEON_H
#define SDPA_ARCH_ARM_NEON_H

#include <arm_neon.h>
#include <stddef.h>

#include "kernels.h"
#include "neon_tails.h"

#define W 4

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* ---- vector operations for the attention templates ---- */
/* The vocabulary that arch/attention_tiles.h is written in (arch/x86/avx512.h says what each
 * operation does). A partial vector's lanes are a count, loaded and stored lane by lane
 * (neon_tails.h), and only for fewer than W of them. */
typedef float32x4_t fv;
typedef size_t fv_lanes;
#define FV_MASKED 0
ALWAYS_INLINE fv fv_zero(void) { return vdupq_n_f32(0.0f); }
ALWAYS_INLINE fv fv_set1(float x) { return vdupq_n_f32(x); }
ALWAYS_INLINE fv fv_bcast(const float *p) { return vdupq_n_f32(*p); }
ALWAYS_INLINE fv fv_load(const float *p) { return vld1q_f32(p); }
ALWAYS_INLINE void fv_store(float *p, fv x) { vst1q_f32(p, x); }
ALWAYS_INLINE fv fv_add(fv a, fv b) { return vaddq_f32(a, b); }
ALWAYS_INLINE fv fv_mul(fv a, fv b) { return vmulq_f32(a, b); }
ALWAYS_INLINE fv fv_madd(fv a, fv b, fv c) { return vfmaq_f32(c, a, b); }
ALWAYS_INLINE void fv_pin(fv *x) { (void)x; }

ALWAYS_INLINE fv_lanes fv_first(size_t n) { return n; }
ALWAYS_INLINE fv fv_load_part(const float *p, fv_lanes n) { return load_partial(p, n); }
ALWAYS_INLINE void fv_store_part(float *p, fv x, fv_lanes n) { store_partial(p, x, n); }

/* lane i: the sum of the lanes of a[i], for i < W (two pairwise adds) */
ALWAYS_INLINE fv fv_hsums(const fv *a) {
    return vpaddq_f32(vpaddq_f32(a[0], a[1]), vpaddq_f32(a[2], a[3]));
}
ALWAYS_INLINE void fv_store4(float *p, fv x, int c) {
    (void)c;
    vst1q_f32(p, x);
}

#endif
