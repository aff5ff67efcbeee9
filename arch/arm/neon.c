/* AArch64 Advanced SIMD (NEON) backend: 4 floats a vector, fused multiply-add. Advanced SIMD
 * is part of the AArch64 baseline, so this file needs no extra compiler flags. Tails are
 * loaded and stored lane by lane (neon_tails.h), so no load or store ever reaches past the end
 * of an array. */
#include <arm_neon.h>
#include <float.h>
#include <math.h>
#include <sleef.h>

#include "exp_constants.h"
#include "kernels.h"
#include "neon_tails.h"

#define W 4

/* all ones in lanes [0, len), zero in the others */
static inline uint32x4_t lanes_below(size_t len) {
    const uint32x4_t index = {0, 1, 2, 3};
    return vcltq_u32(index, vdupq_n_u32((uint32_t)len));
}

static inline float32x4_t zero_where_not(uint32x4_t keep, float32x4_t v) {
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), keep));
}

static float dot_neon(const float *a, const float *b, size_t n) {
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
SDPA_DOT_TO(dot_neon)

static void scale_neon(float *y, const float *x, size_t n, float alpha) {
    const float32x4_t va = vdupq_n_f32(alpha);
    size_t i = 0;
    for (; i + 4 * W <= n; i += 4 * W) {
        float32x4_t x0 = vld1q_f32(x + i), x1 = vld1q_f32(x + i + W);
        float32x4_t x2 = vld1q_f32(x + i + 2 * W), x3 = vld1q_f32(x + i + 3 * W);
        vst1q_f32(y + i, vmulq_f32(va, x0));
        vst1q_f32(y + i + W, vmulq_f32(va, x1));
        vst1q_f32(y + i + 2 * W, vmulq_f32(va, x2));
        vst1q_f32(y + i + 3 * W, vmulq_f32(va, x3));
    }
    for (; i + W <= n; i += W) vst1q_f32(y + i, vmulq_f32(va, vld1q_f32(x + i)));
    if (i < n) store_partial(y + i, vmulq_f32(va, load_partial(x + i, n - i)), n - i);
}

static float max_scaled_neon(const float *x, size_t n, float scale) {
    const float32x4_t vs = vdupq_n_f32(scale), ninf = vdupq_n_f32(-INFINITY);
    float32x4_t m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
    size_t i = 0;
    for (; i + 4 * W <= n; i += 4 * W) {
        m0 = vmaxq_f32(m0, vmulq_f32(vs, vld1q_f32(x + i)));
        m1 = vmaxq_f32(m1, vmulq_f32(vs, vld1q_f32(x + i + W)));
        m2 = vmaxq_f32(m2, vmulq_f32(vs, vld1q_f32(x + i + 2 * W)));
        m3 = vmaxq_f32(m3, vmulq_f32(vs, vld1q_f32(x + i + 3 * W)));
    }
    for (; i + W <= n; i += W) m0 = vmaxq_f32(m0, vmulq_f32(vs, vld1q_f32(x + i)));
    if (i < n) {
        /* the padding lanes become -inf after scaling, whatever the sign of scale */
        float32x4_t z = vmulq_f32(vs, load_partial(x + i, n - i));
        m1 = vmaxq_f32(m1, vbslq_f32(lanes_below(n - i), z, ninf));
    }
    return vmaxvq_f32(vmaxq_f32(vmaxq_f32(m0, m1), vmaxq_f32(m2, m3)));
}

/* weights below FLT_MIN become exactly 0 (NaN stays: the ordered compare is false for it) */
static inline float32x4_t flush_below_min(float32x4_t w) {
    uint32x4_t tiny = vcltq_f32(w, vdupq_n_f32(FLT_MIN));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(w), tiny));
}

/* The shared "fast" exp (kernels.h): 2^n goes into p's exponent bits. */
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

/* z = scale * x - shift with one rounding, as the FMA backends on x86 do. The tail's padding
 * lanes are left out of the sum, whatever exp makes of them. */
/* z = scale * x is rounded before the max is subtracted, as sdpa.h defines z (no fused
 * multiply-subtract): the largest entry then gets exp(0) = 1 exactly, where a fused one gets
 * exp of its product's rounding error, inf or 0 once |z| > ~1e9 (tests/test_regressions.c). */
#define EXP_SUM_NEON(NAME, EXP)                                                                    \
    static float NAME(float *y, const float *x, size_t n, float scale, float shift) {              \
        const float32x4_t vs = vdupq_n_f32(scale), vshift = vdupq_n_f32(shift);                    \
        float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0;                                               \
        size_t i = 0;                                                                              \
        for (; i + 2 * W <= n; i += 2 * W) {                                                       \
            float32x4_t e0 = EXP(vsubq_f32(vmulq_f32(vld1q_f32(x + i), vs), vshift));              \
            float32x4_t e1 = EXP(vsubq_f32(vmulq_f32(vld1q_f32(x + i + W), vs), vshift));          \
            vst1q_f32(y + i, e0);                                                                  \
            vst1q_f32(y + i + W, e1);                                                              \
            s0 = vaddq_f32(s0, e0);                                                                \
            s1 = vaddq_f32(s1, e1);                                                                \
        }                                                                                          \
        if (i + W <= n) {                                                                          \
            float32x4_t e = EXP(vsubq_f32(vmulq_f32(vld1q_f32(x + i), vs), vshift));               \
            vst1q_f32(y + i, e);                                                                   \
            s0 = vaddq_f32(s0, e);                                                                 \
            i += W;                                                                                \
        }                                                                                          \
        if (i < n) {                                                                               \
            float32x4_t e = EXP(vsubq_f32(vmulq_f32(load_partial(x + i, n - i), vs), vshift));     \
            store_partial(y + i, e, n - i);                                                        \
            s1 = vaddq_f32(s1, zero_where_not(lanes_below(n - i), e));                             \
        }                                                                                          \
        return vaddvq_f32(vaddq_f32(s0, s1));                                                      \
    }
EXP_SUM_NEON(exp_sum_fast_neon, exp_fast_neon)
EXP_SUM_NEON(exp_sum_sleef_neon, exp_sleef_neon)

#define EXP_ARRAY_NEON(NAME, EXP)                                                                  \
    static void NAME(float *y, const float *x, size_t n) {                                         \
        size_t i = 0;                                                                              \
        for (; i + W <= n; i += W) vst1q_f32(y + i, EXP(vld1q_f32(x + i)));                        \
        if (i < n) store_partial(y + i, EXP(load_partial(x + i, n - i)), n - i);                   \
    }
EXP_ARRAY_NEON(exp_fast_array_neon, exp_fast_neon)
EXP_ARRAY_NEON(exp_sleef_array_neon, exp_sleef_neon)

static void normalize_neon(float *y, size_t n, float factor) {
    const float32x4_t vf = vdupq_n_f32(factor);
    size_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
        vst1q_f32(y + i, flush_below_min(vmulq_f32(vld1q_f32(y + i), vf)));
        vst1q_f32(y + i + W, flush_below_min(vmulq_f32(vld1q_f32(y + i + W), vf)));
    }
    for (; i + W <= n; i += W) vst1q_f32(y + i, flush_below_min(vmulq_f32(vld1q_f32(y + i), vf)));
    if (i < n)
        store_partial(y + i, flush_below_min(vmulq_f32(load_partial(y + i, n - i), vf)), n - i);
}

static void softmax_backward_neon(float *dx, const float *y, const float *dy, size_t n, float scale,
                                  float y_dot_dy) {
    const float32x4_t vs = vdupq_n_f32(scale), vd = vdupq_n_f32(y_dot_dy);
    size_t i = 0;
    for (; i + W <= n; i += W) {
        float32x4_t t = vsubq_f32(vld1q_f32(dy + i), vd);
        vst1q_f32(dx + i, vmulq_f32(vmulq_f32(vs, vld1q_f32(y + i)), t));
    }
    if (i < n) {
        float32x4_t t = vsubq_f32(load_partial(dy + i, n - i), vd);
        store_partial(dx + i, vmulq_f32(vmulq_f32(vs, load_partial(y + i, n - i)), t), n - i);
    }
}

const sdpa_kernels sdpa_kernels_neon = {
    .name = SDPA_BACKEND_NAME,
    .dot = dot_neon,
    .dot_to = dot_neon_to,
    .scale = scale_neon,
    .max_scaled = max_scaled_neon,
    .exp_sum = {exp_sum_fast_neon, exp_sum_sleef_neon},
    .exp_sum_block = 512,
    .normalize = normalize_neon,
    .softmax_backward = softmax_backward_neon,
    .exp = {exp_fast_array_neon, exp_sleef_array_neon},
    .attention = &sdpa_attention_kernels_neon,
};
