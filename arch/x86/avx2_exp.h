/* AVX2 + FMA: the exps ("fast" and SLEEF's), their tables and the row forms softmax runs, shared by
 * the softmax kernels (avx2.c) and the attention microkernels (avx2_attention.c). */
#ifndef SDPA_ARCH_X86_AVX2_EXP_H
#define SDPA_ARCH_X86_AVX2_EXP_H

#include "avx2.h"

/* The table of the "fast" exp (exp_constants.h), 2^(j/8) for lane j, with j << 20 taken off its
 * bits: adding N << 20 then adds (N div 8) << 23, 2^(N div 8) in the exponent, and puts j << 20
 * back for j = N mod 8, the lane vpermps picks with N's low bits. */
static const float EXP2_EIGHTHS[8] = {SDPA_EXP2_EIGHTHS};
static inline __m256 exp_table_avx2(void) {
    return _mm256_castsi256_ps(
        _mm256_sub_epi32(_mm256_castps_si256(_mm256_loadu_ps(EXP2_EIGHTHS)),
                         _mm256_slli_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), 20)));
}

/* The shared "fast" exp (exp_constants.h). full = 0, for exp_sum, exp_tile and exp_pv, whose
 * arguments are <= 0 (kernels.h): no upper clamp; results below FLT_MIN may stay below it, but an
 * argument below the clamp (a score of -inf, a mask's -1e30) gives exactly 0. full = 1, the exp
 * entry: the whole float range, where 2^(N div 8) can reach 2^128: positive x take one power of two
 * off T and multiply it back at the end (to +inf on overflow), and subnormal results become 0.
 * max/min return their second operand when either is NaN, so NaN passes the clamps (and becomes
 * INT_MIN in N, an index like any other). N is rounded with an explicit mode: the caller's MXCSR
 * must not move it (tests/test_fpenv.c); it is integral, so the conversion is exact in any mode. */
static inline __m256 exp_fast_avx2(__m256 x, __m256 table, int full) {
    const __m256 lo = _mm256_set1_ps(SDPA_EXP_X_CLAMP_LO);
    const __m256 below = _mm256_cmp_ps(x, lo, _CMP_LT_OQ); /* not NaN */
    x = _mm256_max_ps(lo, x);
    if (full) x = _mm256_min_ps(_mm256_set1_ps(SDPA_EXP_X_CLAMP_HI), x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(SDPA_EXP8_SCALE)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(SDPA_EXP8_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(SDPA_EXP8_LN2_LO), r);
    __m256i tbits = _mm256_add_epi32(_mm256_castps_si256(_mm256_permutevar8x32_ps(table, ni)),
                                     _mm256_slli_epi32(ni, 20));
    __m256 positive = _mm256_setzero_ps();
    if (full) {
        positive = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GT_OQ);
        tbits = _mm256_sub_epi32(
            tbits, _mm256_and_si256(_mm256_castps_si256(positive), _mm256_set1_epi32(1 << 23)));
    }
    /* T p(r), so that nothing underflows before the last multiply (exp_constants.h) */
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(SDPA_EXP8_C3), r, _mm256_set1_ps(SDPA_EXP8_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(tbits));
    if (!full) return _mm256_andnot_ps(below, e);
    e = _mm256_mul_ps(e, _mm256_blendv_ps(_mm256_set1_ps(1.0f), _mm256_set1_ps(2.0f), positive));
    /* drop results below FLT_MIN (not NaN: the ordered compare is false for it) */
    return _mm256_andnot_ps(_mm256_cmp_ps(e, _mm256_set1_ps(FLT_MIN), _CMP_LT_OQ), e);
}

static inline __m256 exp_sleef_avx2(__m256 x, __m256 table, int full) {
    (void)table;
    __m256 e = Sleef_expf8_u10avx2(x);
    if (!full) return e;
    return _mm256_andnot_ps(_mm256_cmp_ps(e, _mm256_set1_ps(FLT_MIN), _CMP_LT_OQ), e);
}

/* exp(z - shift) for a row's z <= shift, the exp of exp_sum, with the shift folded in
 * (exp_constants.h, "A row's shift"): N = round(z 8 / ln2) and r = z - N ln2 / 8 come from z
 * itself, never from z - shift (one operation fewer, and no rounding of the difference), and the
 * table takes Mi off: its entry j holds 2^((j - Mi) / 8) with j << 20 taken off, so that N's low
 * bits pick entry N mod 8 and N << 20 adds the rest, 2^((N - Mi) / 8) in all (exact modulo 2^32,
 * and the result's exponent is in range because N - Mi >= -1016 after the clamp). exp_sum's clamp
 * (exact) is the z whose N - Mi is -1016 exactly, where the entry is a power of two and the
 * exponent bits come to 0: T, and so the exp, is +0 for every z at or below it (a score of -inf,
 * a mask's -1e30, in attention, which flushes no weights), at no cost, and a result below FLT_MIN
 * between it and ln FLT_MIN above the shift (-88.03 to -87.34); softmax_short's, whose weights
 * its normalisation flushes, stays at shift - 87.5, off the chain from the shift to the first
 * exp. e^(M' - shift) scales the cubic's coefficients. `folded` = 0 is the plain form, for shifts
 * beyond 2^16 and for SLEEF's exp. */
typedef struct row_exp {
    __m256 table, shift, lo, c0, c2, c3;
} row_exp;

/* the fold at the integer mi (round(shift 8 / ln2) in row_exp_fast) */
ALWAYS_INLINE row_exp row_exp_at(float shift, float mi, int folded, int exact) {
    row_exp c;
    c.shift = _mm256_set1_ps(shift);
    double e = 1.0;
    if (folded) {
        if (exact) e = sdpa_exp_small((double)mi * SDPA_EXP8_LN2 - shift);
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i d = _mm256_sub_epi32(lane, _mm256_set1_epi32((int)mi));
        const __m256 base = _mm256_loadu_ps(EXP2_EIGHTHS);
        __m256i t = _mm256_castps_si256(
            _mm256_permutevar8x32_ps(base, _mm256_and_si256(d, _mm256_set1_epi32(7))));
        t = _mm256_add_epi32(t, _mm256_slli_epi32(_mm256_srai_epi32(d, 3), 23));
        c.table = _mm256_castsi256_ps(_mm256_sub_epi32(t, _mm256_slli_epi32(lane, 20)));
    } else {
        c.table = exp_table_avx2();
    }
    /* mi - 1016 is exact, and N is within 0.1 of it at lo, far from a rounding boundary, while
       |shift| <= 2^16 */
    if (exact)
        c.lo = _mm256_set1_ps((float)((mi - 1016.0) * SDPA_EXP8_LN2));
    else
        c.lo = _mm256_set1_ps(folded ? shift + SDPA_EXP_X_CLAMP_LO : SDPA_EXP_X_CLAMP_LO);
    c.c0 = _mm256_set1_ps((float)e);
    c.c2 = _mm256_set1_ps((float)(e * SDPA_EXP8_C2));
    c.c3 = _mm256_set1_ps((float)(e * SDPA_EXP8_C3));
    return c;
}
ALWAYS_INLINE row_exp row_exp_fast(float shift, int folded, int exact) {
    return row_exp_at(shift, folded ? rintf(shift * SDPA_EXP8_SCALE) : 0.0f, folded, exact);
}

/* exp_fast_avx2 (full = 0) with c's table, clamp and polynomial. `magic`: N rounded by adding
 * 1.5 * 2^23 in the FMA that scales z (N then sits in its low bits), where exp_fast_avx2 takes a
 * multiply, roundps and cvtps2dq: one operation fewer, in a loop bound by its operation count. That
 * FMA rounds as MXCSR says, so its callers run it only when the caller rounds to nearest
 * (rounds_to_nearest): a directed mode would take r to ln2 / 8, twice the cubic's interval, and
 * the exp to about 20 ULP (tests/test_exp.c, sum_fast_directed). */
ALWAYS_INLINE __m256 exp_row(__m256 z, const row_exp *c, int magic) {
    z = _mm256_max_ps(c->lo, z); /* exp_sum's: at lo, T is +0 (row_exp_at) */
    __m256 n;
    __m256i ni;
    if (magic) {
        const __m256 big = _mm256_set1_ps(0x1.8p23f);
        const __m256 t = _mm256_fmadd_ps(z, _mm256_set1_ps(SDPA_EXP8_SCALE), big);
        n = _mm256_sub_ps(t, big);
        ni = _mm256_castps_si256(t);
    } else {
        n = _mm256_round_ps(_mm256_mul_ps(z, _mm256_set1_ps(SDPA_EXP8_SCALE)),
                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        ni = _mm256_cvtps_epi32(n);
    }
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(SDPA_EXP8_LN2_HI), z);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(SDPA_EXP8_LN2_LO), r);
    __m256i tbits = _mm256_add_epi32(_mm256_castps_si256(_mm256_permutevar8x32_ps(c->table, ni)),
                                     _mm256_slli_epi32(ni, 20));
    __m256 p = _mm256_fmadd_ps(c->c3, r, c->c2);
    p = _mm256_fmadd_ps(p, r, c->c0);
    p = _mm256_fmadd_ps(p, r, c->c0);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(tbits));
}

/* ---- the row exps of the templates (arch/row_kernels.h, arch/softmax_passes.h) ---- */
/* The fast exp with exp_row's magic-number rounding, which rounds as MXCSR says: the entries
 * take it only when MXCSR's RC bits say round-to-nearest (row_exp_nearest); in a directed mode
 * they take roundps, and every operation keeps the caller's mode. Switching to round-to-nearest
 * for the call instead would round z = scale * x in another mode than max_scaled did for the
 * shift the driver passes: a z one ULP above that max (exp gives +inf, the row NaN), or a z that
 * overflows where the caller's mode stops at FLT_MAX (tests/test_fpenv.c). */
enum { EXP_MAGIC = SDPA_EXP_KINDS };
#define ROW_EXPS 4
#define ROW_SUMS 4
ALWAYS_INLINE int row_exp_folds(int kind) { return kind != SDPA_EXP_SLEEF; }
/* SLEEF's exp is a call, but here a second pass for the sums costs more than the spills it
 * saves around the calls */
ALWAYS_INLINE int row_sums_after(int kind) { return (void)kind, 0; }
ALWAYS_INLINE int row_exp_nearest(int kind) { return kind == SDPA_EXP_FAST ? EXP_MAGIC : kind; }
ALWAYS_INLINE row_exp row_exp_shift(float shift, int folded) {
    return row_exp_fast(shift, folded, 1);
}
/* softmax_short's, against the row's max in every lane: no correction of the fold's factor */
ALWAYS_INLINE row_exp row_exp_max(__m256 max, int folded, int kind) {
    (void)kind;
    return row_exp_fast(_mm256_cvtss_f32(max), folded, 0);
}
/* ... and against a guessed shift g (shift_guess.h, "A guessed shift"), folded as k ln2 for
 * k = floor(g / ln2): the weights carry the factor 2^-k exactly, which the normalisation takes out
 * exactly (tests/test_exp.c reads them in ULP); the clamp stays at g - 87.5 */
ALWAYS_INLINE row_exp row_exp_guess(__m256 g, int kind) {
    const float gs = _mm256_cvtss_f32(g);
    if (!row_exp_folds(kind)) return row_exp_fast(gs, 0, 0);
    return row_exp_at(gs, 8.0f * floorf(gs * 0x1.715476p+0f), 1, 0);
}
ALWAYS_INLINE void row_exps(__m256 *z, int count, const row_exp *c, int kind) {
    _Pragma("GCC unroll 8") for (int u = 0; u < count; u++) z[u] =
        kind == SDPA_EXP_SLEEF ? Sleef_expf8_u10avx2(z[u]) : exp_row(z[u], c, kind == EXP_MAGIC);
}
ALWAYS_INLINE __m256 exp_whole(__m256 x, const row_exp *c, int kind) {
    return kind == SDPA_EXP_SLEEF ? exp_sleef_avx2(x, c->table, 1) : exp_fast_avx2(x, c->table, 1);
}

#endif
