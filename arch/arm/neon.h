/* NEON (AArch64 Advanced SIMD): what the neon files share (the vector width, the dot, and the
 * vector operations the attention templates are written in). */
#ifndef SDPA_ARCH_ARM_NEON_H
#define SDPA_ARCH_ARM_NEON_H

#include <arm_neon.h>
#include <stddef.h>

#include "any_address.h"
#include "kernels.h"
#include "neon_tails.h"

#define W 4

#define ALWAYS_INLINE static inline __attribute__((always_inline))

static inline float dot_neon(const float *a, const float *b, size_t n) {
    /* eight accumulators: enough independent FMA chains for cores with four 4-cycle FMA
       pipes fed by two loads each */
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0, acc2 = acc0, acc3 = acc0, acc4 = acc0,
                acc5 = acc0, acc6 = acc0, acc7 = acc0;
    size_t i = 0;
    for (; i + 8 * W <= n; i += 8 * W) {
        acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), vld1q_f32(b + i));
        acc1 = vfmaq_f32(acc1, vld1q_f32(a + i + W), vld1q_f32(b + i + W));
        acc2 = vfmaq_f32(acc2, vld1q_f32(a + i + 2 * W), vld1q_f32(b + i + 2 * W));
        acc3 = vfmaq_f32(acc3, vld1q_f32(a + i + 3 * W), vld1q_f32(b + i + 3 * W));
        acc4 = vfmaq_f32(acc4, vld1q_f32(a + i + 4 * W), vld1q_f32(b + i + 4 * W));
        acc5 = vfmaq_f32(acc5, vld1q_f32(a + i + 5 * W), vld1q_f32(b + i + 5 * W));
        acc6 = vfmaq_f32(acc6, vld1q_f32(a + i + 6 * W), vld1q_f32(b + i + 6 * W));
        acc7 = vfmaq_f32(acc7, vld1q_f32(a + i + 7 * W), vld1q_f32(b + i + 7 * W));
    }
    for (; i + W <= n; i += W) acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), vld1q_f32(b + i));
    if (i < n) acc1 = vfmaq_f32(acc1, load_partial(a + i, n - i), load_partial(b + i, n - i));
    acc0 = vaddq_f32(vaddq_f32(acc0, acc1), vaddq_f32(acc2, acc3));
    acc4 = vaddq_f32(vaddq_f32(acc4, acc5), vaddq_f32(acc6, acc7));
    return vaddvq_f32(vaddq_f32(acc0, acc4));
}

/* ---- vector operations for the attention templates ---- */
/* The vocabulary that arch/attention_tiles.h is written in (arch/x86/avx512.h says what each
 * operation does). A partial vector's lanes are a count, loaded and stored lane by lane
 * (neon_tails.h), and only for fewer than W of them. */
typedef float32x4_t fv;
typedef size_t fv_lanes;
#define FV_MASKED 0
ALWAYS_INLINE fv fv_zero(void) { return vdupq_n_f32(0.0f); }
ALWAYS_INLINE fv fv_set1(float x) { return vdupq_n_f32(x); }
ALWAYS_INLINE fv fv_bcast(const float *p) { return vdupq_n_f32(load_f32(p)); }
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
