/* NEON's exps (the shared fast exp and SLEEF's) and the row exps of the templates, for
 * arch/arm/neon.c's row kernels and arch/arm/neon_attention.c's exp_keymajor, so that both
 * take the same exps. */
#ifndef SDPA_ARCH_ARM_NEON_EXP_H
#define SDPA_ARCH_ARM_NEON_EXP_H

#include <arm_neon.h>
#include <float.h>
#include <math.h>
#include <sleef.h>
#include <stdint.h>

#include "exp_constants.h"
#include "neon.h"

/* weights below FLT_MIN become exactly 0 (NaN stays: the ordered compare is false for it) */
static inline float32x4_t flush_below_min(float32x4_t w) {
    uint32x4_t tiny = vcltq_f32(w, vdupq_n_f32(FLT_MIN));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(w), tiny));
}

/* The shared "fast" exp (exp_constants.h): 2^n goes into p's exponent bits. */
static inline float32x4_t exp_fast_neon(float32x4_t x) {
    /* FMAX/FMIN return NaN when either operand is NaN: NaN passes through the clamp */
    x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(SDPA_EXP_X_CLAMP_LO)), vdupq_n_f32(SDPA_EXP_X_CLAMP_HI));
    /* FCVTNS: round to nearest, ties to even, straight to an integer */
    int32x4_t ni = vcvtnq_s32_f32(vmulq_n_f32(x, SDPA_EXP_LOG2E));
    float32x4_t n = vcvtq_f32_s32(ni);
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(SDPA_EXP_LN2_HI));
    r = vfmsq_f32(r, n, vdupq_n_f32(SDPA_EXP_LN2_LO));
    float32x4_t p = vfmaq_f32(vdupq_n_f32(SDPA_EXP_C4), vdupq_n_f32(SDPA_EXP_C5), r);
    p = vfmaq_f32(vdupq_n_f32(SDPA_EXP_C3), p, r);
    p = vfmaq_f32(vdupq_n_f32(SDPA_EXP_C2), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    /* a NaN x gave ni = 0 and p = NaN, so e stays NaN */
    float32x4_t e = vreinterpretq_f32_s32(vaddq_s32(vreinterpretq_s32_f32(p), vshlq_n_s32(ni, 23)));
    e = flush_below_min(e);
    return vbslq_f32(vcgeq_f32(x, vdupq_n_f32(SDPA_EXP_X_OVERFLOW)), vdupq_n_f32(INFINITY), e);
}

static inline float32x4_t exp_sleef_neon(float32x4_t x) {
    return flush_below_min(Sleef_expf4_u10advsimd(x));
}

/* ---- the row exps and weights of the templates ---- */
/* exp_sum runs the whole-range exps, two side by side */
#include "row_exp_plain.h"
#define ROW_EXPS 2
#define ROW_SUMS 2
ALWAYS_INLINE int row_sums_after(int kind) { return (void)kind, 0; }
ALWAYS_INLINE float32x4_t exp_whole(float32x4_t x, const row_exp *c, int kind) {
    (void)c;
    return kind == SDPA_EXP_FAST ? exp_fast_neon(x) : exp_sleef_neon(x);
}
ALWAYS_INLINE void row_exps(float32x4_t *z, int count, const row_exp *c, int kind) {
    for (int u = 0; u < count; u++) z[u] = exp_whole(z[u], c, kind);
}
ALWAYS_INLINE float32x4_t row_weight(float32x4_t e, float32x4_t factor, float32x4_t keep_from,
                                     int from_e) {
    (void)keep_from, (void)from_e;
    return flush_below_min(vmulq_f32(e, factor));
}

#endif
