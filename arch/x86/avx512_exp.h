/* AVX-512F: the exps ("fast" and SLEEF's), their tables and the row forms softmax runs, shared by
 * the softmax kernels (avx512.c) and the attention microkernels (avx512_attention.c). */
#ifndef SDPA_ARCH_X86_AVX512_EXP_H
#define SDPA_ARCH_X86_AVX512_EXP_H

#include "avx512.h"

/* w where it is >= FLT_MIN or NaN (the compare is unordered), else exactly 0: no subnormal
 * results or weights */
ALWAYS_INLINE __m512 keep_normal(__m512 w) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(w, _mm512_set1_ps(FLT_MIN), _CMP_NLT_UQ), w);
}

/* The table of the "fast" exp (exp_constants.h), 2^(j/16) for lane j, with j << 19 taken off its
 * bits: t's bits are 1.5 * 2^23 + N, so adding t << 19 adds (N div 16) << 23, 2^(N div 16) in the
 * exponent, and puts j << 19 back for j = N mod 16, the lane vpermps picks with t's low bits. */
static const float EXP2_SIXTEENTHS[16] = {SDPA_EXP2_SIXTEENTHS};
static inline __m512 exp_table_avx512(void) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_castsi512_ps(_mm512_sub_epi32(
        _mm512_castps_si512(_mm512_loadu_ps(EXP2_SIXTEENTHS)), _mm512_slli_epi32(lane, 19)));
}

/* The shared "fast" exp (exp_constants.h). full = 0, for exp_sum and exp_tile, whose arguments are
 * <= 0 (kernels.h): no upper clamp; results below FLT_MIN may stay below it, but an argument
 * below the clamp (a score of -inf, a mask's -1e30) gives exactly 0, as it must: its key weighs
 * nothing, however large its v. full = 1, the exp entry: the whole float range, where 2^(N div 16)
 * can reach 2^128: positive x take one power of two off T and multiply it back at the end (to +inf
 * on overflow), and subnormal results become 0. max/min return their second operand when either is
 * NaN, so NaN passes the clamps; the FMA that forms N rounds to nearest whatever MXCSR says. */
static inline __m512 exp_fast_avx512(__m512 x, __m512 table, int full) {
    const __m512 magic = _mm512_set1_ps(0x1.8p23f), lo = _mm512_set1_ps(SDPA_EXP_X_CLAMP_LO);
    const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ); /* NaN too */
    x = _mm512_max_ps(lo, x);
    if (full) x = _mm512_min_ps(_mm512_set1_ps(SDPA_EXP_X_CLAMP_HI), x);
    __m512 t = _mm512_fmadd_round_ps(x, _mm512_set1_ps(SDPA_EXP16_SCALE), magic,
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 n = _mm512_sub_ps(t, magic);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(SDPA_EXP16_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(SDPA_EXP16_LN2_LO), r);
    __m512i ti = _mm512_castps_si512(t);
    __m512i tbits = _mm512_add_epi32(_mm512_castps_si512(_mm512_permutexvar_ps(ti, table)),
                                     _mm512_slli_epi32(ti, 19));
    __mmask16 positive = 0;
    if (full) {
        positive = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ);
        tbits = _mm512_mask_sub_epi32(tbits, positive, tbits, _mm512_set1_epi32(1 << 23));
    }
    __m512 T = _mm512_castsi512_ps(tbits);
    /* T p(r), not T + (r T) q(r): r T underflows for T near 2^-126, and with FTZ set it
       vanishes (tests/test_fpenv.c caught 1.4% off at 2e-37) */
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(SDPA_EXP16_C3), r, _mm512_set1_ps(SDPA_EXP16_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512 e = _mm512_maskz_mul_ps(keep, p, T);
    if (!full) return e;
    e = _mm512_mask_mul_ps(e, positive, e, _mm512_set1_ps(2.0f));
    return keep_normal(e);
}

static inline __m512 exp_sleef_avx512(__m512 x, __m512 table, int full) {
    (void)table;
    __m512 e = Sleef_expf16_u10avx512f(x);
    if (!full) return e;
    return keep_normal(e);
}

/* exp(z - shift) for a row's z <= shift, the exp of exp_sum and softmax_short, with the shift
 * folded into the fast exp's rounding step (exp_constants.h, "A row's shift"): N = round(z K / ln2)
 * against a magic number that already holds -round(shift K / ln2), and r from z itself, so the
 * subtraction z - shift is never formed (one operation fewer, and no rounding of it), and e^r's
 * polynomial carries the constant factor that the rounded shift leaves. `folded` = 0 is the
 * plain form (z - shift first), for shifts beyond 2^16 and for SLEEF's exp. */
typedef struct row_exp {
    __m512 table, table_hi, shift, b, lo, c0, c2, c3;
} row_exp;

ALWAYS_INLINE row_exp row_exp_fast(float shift, int folded, int exact) {
    row_exp c;
    c.table = exp_table_avx512();
    c.shift = _mm512_set1_ps(shift);
    float mi = 0.0f;
    double e = 1.0;
    if (folded) {
        mi = rintf(shift * SDPA_EXP16_SCALE);
        if (exact) e = sdpa_exp_small((double)mi * SDPA_EXP16_LN2 - shift);
    }
    c.b = _mm512_set1_ps(0x1.8p23f - mi);
    c.lo = _mm512_set1_ps(folded ? shift + SDPA_EXP_X_CLAMP_LO : SDPA_EXP_X_CLAMP_LO);
    c.c0 = _mm512_set1_ps((float)e);
    c.c2 = _mm512_set1_ps((float)(e * SDPA_EXP16_C2));
    c.c3 = _mm512_set1_ps((float)(e * SDPA_EXP16_C3));
    return c;
}

/* The shift of row_exp_fast(shift, folded, 0) from a shift already in every lane
 * (softmax_short), for a table of K entries (k_over_ln2 = K / ln2): vector operations only, a
 * shorter chain from the max to the first exp than a scalar round trip. */
ALWAYS_INLINE void fold_lanes(row_exp *c, __m512 shift, float k_over_ln2, int folded) {
    c->shift = shift;
    const __m512 magic = _mm512_set1_ps(0x1.8p23f);
    c->b = folded ? _mm512_sub_ps(magic, _mm512_roundscale_ps(
                                             _mm512_mul_ps(shift, _mm512_set1_ps(k_over_ln2)),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
                  : magic;
    c->lo = folded ? _mm512_add_ps(shift, _mm512_set1_ps(SDPA_EXP_X_CLAMP_LO))
                   : _mm512_set1_ps(SDPA_EXP_X_CLAMP_LO);
}

ALWAYS_INLINE row_exp row_exp_fast_lanes(__m512 shift, int folded) {
    row_exp c;
    c.table = exp_table_avx512();
    fold_lanes(&c, shift, SDPA_EXP16_SCALE, folded);
    c.c0 = _mm512_set1_ps(1.0f);
    c.c2 = _mm512_set1_ps(SDPA_EXP16_C2);
    c.c3 = _mm512_set1_ps(SDPA_EXP16_C3);
    return c;
}

/* softmax_short's exp (exp_constants.h, K = 32): the table's 2^(j/32) with j << 18 taken off, in
 * two registers for vpermt2ps; the shift folded as above, with no correction for its rounding,
 * which the weights' normalisation takes out */
static const float EXP2_THIRTYSECONDS[32] = {SDPA_EXP2_THIRTYSECONDS};
ALWAYS_INLINE void exp32_tables(row_exp *c) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    c->table = _mm512_castsi512_ps(_mm512_sub_epi32(
        _mm512_castps_si512(_mm512_loadu_ps(EXP2_THIRTYSECONDS)), _mm512_slli_epi32(lane, 18)));
    c->table_hi = _mm512_castsi512_ps(
        _mm512_sub_epi32(_mm512_castps_si512(_mm512_loadu_ps(EXP2_THIRTYSECONDS + 16)),
                         _mm512_slli_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(16)), 18)));
}
ALWAYS_INLINE row_exp row_exp_fast32_lanes(__m512 shift, int folded) {
    row_exp c;
    exp32_tables(&c);
    fold_lanes(&c, shift, SDPA_EXP32_SCALE, folded);
    return c;
}

/* the 32-entry exp against a guessed shift g, folded as k ln2 for k = floor(g / ln2): the weights
 * carry the factor 2^-k exactly, which the normalisation takes out exactly (a row whose max is 0
 * keeps weights that are its exps rounded once: tests/test_exp.c reads them in ULP). The clamp
 * stays g - 87.5: below it, weights are below FLT_MIN e^(g - max) whatever k is. */
ALWAYS_INLINE row_exp row_exp_fast32_guess(__m512 g) {
    row_exp c;
    exp32_tables(&c);
    c.shift = g;
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(g, _mm512_set1_ps(0x1.715476p+0f)),
                                          _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    c.b = _mm512_fnmadd_ps(k, _mm512_set1_ps(32.0f), _mm512_set1_ps(0x1.8p23f));
    c.lo = _mm512_add_ps(g, _mm512_set1_ps(SDPA_EXP_X_CLAMP_LO));
    return c;
}

/* the folded reduction of both row exps: z clamped at c's lo, t = round(z K / ln2) against c's
 * b (N in its low bits, returned in ti), and r = z - N ln2 / K in two steps */
ALWAYS_INLINE __m512 reduce_row(__m512 z, const row_exp *c, float k_over_ln2, float ln2_hi,
                                float ln2_lo, __m512i *ti) {
    z = _mm512_max_ps(c->lo, z);
    __m512 t = _mm512_fmadd_round_ps(z, _mm512_set1_ps(k_over_ln2), c->b,
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 n = _mm512_sub_ps(t, c->b);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(ln2_hi), z);
    *ti = _mm512_castps_si512(t);
    return _mm512_fnmadd_ps(n, _mm512_set1_ps(ln2_lo), r);
}

ALWAYS_INLINE __m512 exp_row_fast32(__m512 z, const row_exp *c) {
    __m512i ti;
    __m512 r = reduce_row(z, c, SDPA_EXP32_SCALE, SDPA_EXP32_LN2_HI, SDPA_EXP32_LN2_LO, &ti);
    __m512 T = _mm512_castsi512_ps(
        _mm512_add_epi32(_mm512_castps_si512(_mm512_permutex2var_ps(c->table, ti, c->table_hi)),
                         _mm512_slli_epi32(ti, 18)));
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(SDPA_EXP32_C2), r, _mm512_set1_ps(SDPA_EXP32_C1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_mul_ps(p, T);
}

/* the fast exp of exp_fast_avx512 (full = 0), with c's b, lo and polynomial: 0 below lo */
ALWAYS_INLINE __m512 exp_row_fast(__m512 z, const row_exp *c) {
    const __mmask16 keep = _mm512_cmp_ps_mask(z, c->lo, _CMP_NLT_UQ); /* NaN too */
    __m512i ti;
    __m512 r = reduce_row(z, c, SDPA_EXP16_SCALE, SDPA_EXP16_LN2_HI, SDPA_EXP16_LN2_LO, &ti);
    __m512 T = _mm512_castsi512_ps(_mm512_add_epi32(
        _mm512_castps_si512(_mm512_permutexvar_ps(ti, c->table)), _mm512_slli_epi32(ti, 19)));
    __m512 p = _mm512_fmadd_ps(c->c3, r, c->c2);
    p = _mm512_fmadd_ps(p, r, c->c0);
    p = _mm512_fmadd_ps(p, r, c->c0);
    return _mm512_maskz_mul_ps(keep, p, T);
}

ALWAYS_INLINE __m512 exp_row_sleef(__m512 z, const row_exp *c) {
    (void)c;
    return Sleef_expf16_u10avx512f(z);
}

/* ---- the row exps of the templates (arch/row_kernels.h, arch/softmax_passes.h) ---- */
enum { EXP_FAST32 = SDPA_EXP_KINDS }; /* softmax_short's fast exp, K = 32 */
#define ROW_EXPS 4
#define ROW_SUMS 4
ALWAYS_INLINE int row_exp_folds(int kind) { return kind != SDPA_EXP_SLEEF; }
ALWAYS_INLINE int row_sums_after(int kind) { return kind == SDPA_EXP_SLEEF; } /* a call */
/* N rounds to nearest whatever MXCSR says, at no cost (embedded rounding) */
ALWAYS_INLINE int row_exp_nearest(int kind) { return kind; }
ALWAYS_INLINE row_exp row_exp_shift(float shift, int folded) {
    return row_exp_fast(shift, folded, 1);
}
/* softmax_short's, against the row's max in every lane: no correction of the fold's factor */
ALWAYS_INLINE row_exp row_exp_max(__m512 max, int folded, int kind) {
    return kind == EXP_FAST32 ? row_exp_fast32_lanes(max, folded) : row_exp_fast_lanes(max, folded);
}
/* ... and against a guessed shift */
ALWAYS_INLINE row_exp row_exp_guess(__m512 g, int kind) {
    return kind == EXP_FAST32 ? row_exp_fast32_guess(g)
                              : row_exp_fast_lanes(g, row_exp_folds(kind));
}
ALWAYS_INLINE void row_exps(__m512 *z, int count, const row_exp *c, int kind) {
    _Pragma("GCC unroll 8") for (int u = 0; u < count; u++) z[u] =
        kind == SDPA_EXP_SLEEF ? exp_row_sleef(z[u], c)
        : kind == EXP_FAST32   ? exp_row_fast32(z[u], c)
                               : exp_row_fast(z[u], c);
}
ALWAYS_INLINE __m512 exp_whole(__m512 x, const row_exp *c, int kind) {
    return kind == SDPA_EXP_SLEEF ? exp_sleef_avx512(x, c->table, 1)
                                  : exp_fast_avx512(x, c->table, 1);
}

#endif
