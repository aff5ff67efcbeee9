/* SSE4.1: the exps ("fast" and SLEEF's), full-range and light (arguments <= 0), shared by
 * the softmax kernels (sse41.c) and the attention microkernels (sse41_attention.c). */
#ifndef SDPA_ARCH_X86_SSE41_EXP_H
#define SDPA_ARCH_X86_SSE41_EXP_H

#include "sse41.h"

/* The shared "fast" exp (exp_constants.h) without FMA: the 15-bit ln 2 split keeps n * LN2_HI
 * exact. x[u] = exp(x[u]) for u < count (at most 4), each step for all of them before the next: one
 * exp is a chain of some fifty cycles, and only exps side by side in the instruction stream
 * keep the pipes busy (four fill them where one or two leave them waiting on the chain).
 * full = 1 (the exp entry): the whole float range. full = 0, for exp_sum and exp_pv, whose
 * arguments are s - max <= 0: no upper clamp, no overflow case, and results below FLT_MIN may
 * stay below it (as exp_sum's contract allows), three operations of about twenty fewer; the
 * lower clamp stays, it keeps n, and so 2^n's exponent bits, in range, and an argument at or
 * below it (a score of -inf, a mask's -1e30) gives exactly 0. */
ALWAYS_INLINE void exp_fast_body(__m128 *x, int count, int full) {
    __m128 n[4], r[4], p[4];
    for (int u = 0; u < count; u++) {
        /* max/min return their second operand when either is NaN: NaN passes through */
        x[u] = _mm_max_ps(_mm_set1_ps(SDPA_EXP_X_CLAMP_LO), x[u]);
        if (full) x[u] = _mm_min_ps(_mm_set1_ps(SDPA_EXP_X_CLAMP_HI), x[u]);
    }
    for (int u = 0; u < count; u++)
        n[u] = _mm_round_ps(_mm_mul_ps(x[u], _mm_set1_ps(SDPA_EXP_LOG2E)),
                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    for (int u = 0; u < count; u++)
        r[u] = _mm_sub_ps(x[u], _mm_mul_ps(n[u], _mm_set1_ps(SDPA_EXP_LN2_HI_NOFMA)));
    for (int u = 0; u < count; u++)
        r[u] = _mm_sub_ps(r[u], _mm_mul_ps(n[u], _mm_set1_ps(SDPA_EXP_LN2_LO_NOFMA)));
    for (int u = 0; u < count; u++)
        p[u] = _mm_add_ps(_mm_mul_ps(_mm_set1_ps(SDPA_EXP_C5), r[u]), _mm_set1_ps(SDPA_EXP_C4));
    for (int u = 0; u < count; u++)
        p[u] = _mm_add_ps(_mm_mul_ps(p[u], r[u]), _mm_set1_ps(SDPA_EXP_C3));
    for (int u = 0; u < count; u++)
        p[u] = _mm_add_ps(_mm_mul_ps(p[u], r[u]), _mm_set1_ps(SDPA_EXP_C2));
    for (int u = 0; u < count; u++) p[u] = _mm_add_ps(_mm_mul_ps(p[u], r[u]), _mm_set1_ps(1.0f));
    for (int u = 0; u < count; u++) p[u] = _mm_add_ps(_mm_mul_ps(p[u], r[u]), _mm_set1_ps(1.0f));
    for (int u = 0; u < count; u++) {
        __m128i bits =
            _mm_add_epi32(_mm_castps_si128(p[u]), _mm_slli_epi32(_mm_cvtps_epi32(n[u]), 23));
        __m128 e = _mm_castsi128_ps(bits);
        if (full) {
            /* drop results below FLT_MIN (not NaN: the ordered compare is false for it) */
            e = _mm_andnot_ps(_mm_cmplt_ps(e, _mm_set1_ps(FLT_MIN)), e);
            e = _mm_blendv_ps(e, _mm_set1_ps(INFINITY),
                              _mm_cmpge_ps(x[u], _mm_set1_ps(SDPA_EXP_X_OVERFLOW)));
        } else {
            /* x was clamped: at the clamp, it was at or below it */
            e = _mm_andnot_ps(_mm_cmple_ps(x[u], _mm_set1_ps(SDPA_EXP_X_CLAMP_LO)), e);
        }
        x[u] = e;
    }
}

static inline __m128 exp_fast_sse41(__m128 x) {
    exp_fast_body(&x, 1, 1);
    return x;
}

static inline __m128 exp_sleef_sse41(__m128 x) {
    __m128 e = Sleef_expf4_u10sse4(x);
    return _mm_andnot_ps(_mm_cmplt_ps(e, _mm_set1_ps(FLT_MIN)), e);
}

/* exp_sum's and exp_pv's exps, whose arguments are <= 0: the fast one without the full range's
 * cases (exp_fast_body), four side by side; SLEEF's without the flush. */
static inline __m128 exp_light_sse41(__m128 x) {
    exp_fast_body(&x, 1, 0);
    return x;
}
ALWAYS_INLINE void exp_light4_sse41(__m128 x[4]) { exp_fast_body(x, 4, 0); }
static inline __m128 exp_sleef_light_sse41(__m128 x) { return Sleef_expf4_u10sse4(x); }
ALWAYS_INLINE void exp_sleef_light4_sse41(__m128 x[4]) {
    for (int u = 0; u < 4; u++) x[u] = Sleef_expf4_u10sse4(x[u]);
}

/* ---- the row exps of the templates (arch/row_kernels.h) ---- */
/* exp_sum's exps are the light ones (arguments <= 0), four side by side (exp_fast_body) */
#include "row_exp_plain.h"
#define ROW_EXPS 4
#define ROW_SUMS 2 /* beside four exps, 16 registers hold two sums without a spill */
ALWAYS_INLINE int row_sums_after(int kind) { return kind == SDPA_EXP_SLEEF; } /* a call */
ALWAYS_INLINE void row_exps(__m128 *z, int count, const row_exp *c, int kind) {
    (void)c;
    if (kind == SDPA_EXP_FAST)
        exp_fast_body(z, count, 0);
    else
        for (int u = 0; u < count; u++) z[u] = Sleef_expf4_u10sse4(z[u]);
}
ALWAYS_INLINE __m128 exp_whole(__m128 x, const row_exp *c, int kind) {
    (void)c;
    return kind == SDPA_EXP_FAST ? exp_fast_sse41(x) : exp_sleef_sse41(x);
}

#endif
