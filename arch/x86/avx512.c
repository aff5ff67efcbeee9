/* AVX-512F backend: 16 floats a vector; tails use masked loads and stores, which never touch
 * the masked-off bytes, so no kernel reads or writes past its arrays. */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <sleef.h>
#include <stdint.h>

#include "kernels.h"

#define W 16

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* lanes [0, remaining) set, for remaining <= W */
static inline __mmask16 tail_mask(size_t remaining) { return (__mmask16)((1u << remaining) - 1u); }

/* Floats from p to the next 64-byte boundary (0 when aligned). A 64-byte load or store that
 * straddles two cache lines costs two of the ports' slots, so the long loops take a masked head
 * of this many first: the stream they align (and any other misaligned alike, as buffers from
 * malloc are) then never straddles. */
static inline size_t lead_to_line(const float *p) {
    return (64 - ((uintptr_t)p & 63)) % 64 / sizeof(float);
}

/* sum of the 16 lanes: halves folded in three steps, then the last pair */
static inline float hsum_avx512(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

static float dot_avx512(const float *a, const float *b, size_t n) {
    /* short rows (the head dimensions of attention) first, without the four-way setup */
    if (__builtin_expect(n <= W, 1)) { /* straight through, with no taken branch */
        __mmask16 m = tail_mask(n);
        return hsum_avx512(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, a), _mm512_maskz_loadu_ps(m, b)));
    }
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    size_t i = 0;
    if (n >= 4 * W) {
        /* a to a line boundary, b with it when misaligned alike: no load straddles two lines */
        size_t lead = lead_to_line(a);
        if (lead) {
            __mmask16 m = tail_mask(lead);
            acc1 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a), _mm512_maskz_loadu_ps(m, b));
            a += lead, b += lead, n -= lead;
        }
        /* two loads feed each FMA, so two load ports allow one FMA per cycle, which four
           independent chains of 4-cycle FMAs sustain; eight measured slower for n <= 1024 */
        __m512 acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();
        for (; i + 4 * W <= n; i += 4 * W) {
            acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
            acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + W), _mm512_loadu_ps(b + i + W), acc1);
            acc2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 2 * W), _mm512_loadu_ps(b + i + 2 * W),
                                   acc2);
            acc3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 3 * W), _mm512_loadu_ps(b + i + 3 * W),
                                   acc3);
        }
        acc0 = _mm512_add_ps(acc0, acc2);
        acc1 = _mm512_add_ps(acc1, acc3);
    }
    for (; i + 2 * W <= n; i += 2 * W) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + W), _mm512_loadu_ps(b + i + W), acc1);
    }
    if (i < n) {
        /* one or two vectors left, the last one partial */
        if (n - i > W) {
            acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
            i += W;
        }
        __mmask16 m = tail_mask(n - i);
        acc1 =
            _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc1);
    }
    return hsum_avx512(_mm512_add_ps(acc0, acc1));
}
SDPA_DOT_TO(dot_avx512)

static void scale_avx512(float *y, const float *x, size_t n, float alpha) {
    const __m512 va = _mm512_set1_ps(alpha);
    size_t i = 0;
    if (n >= 4 * W && lead_to_line(y)) { /* the stores to a line boundary (and x with them) */
        i = lead_to_line(y);
        __mmask16 m = tail_mask(i);
        _mm512_mask_storeu_ps(y, m, _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, x)));
    }
    for (; i + 4 * W <= n; i += 4 * W) {
        __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + W);
        __m512 x2 = _mm512_loadu_ps(x + i + 2 * W), x3 = _mm512_loadu_ps(x + i + 3 * W);
        _mm512_storeu_ps(y + i, _mm512_mul_ps(va, x0));
        _mm512_storeu_ps(y + i + W, _mm512_mul_ps(va, x1));
        _mm512_storeu_ps(y + i + 2 * W, _mm512_mul_ps(va, x2));
        _mm512_storeu_ps(y + i + 3 * W, _mm512_mul_ps(va, x3));
    }
    for (; i + W <= n; i += W) _mm512_storeu_ps(y + i, _mm512_mul_ps(va, _mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, x + i)));
    }
}

static float max_scaled_avx512(const float *x, size_t n, float scale) {
    const __m512 vs = _mm512_set1_ps(scale);
    __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    size_t i = 0;
    if (n >= 4 * W && lead_to_line(x)) {
        i = lead_to_line(x);
        __mmask16 m = tail_mask(i);
        m1 = _mm512_mask_max_ps(m1, m, _mm512_mul_ps(vs, _mm512_maskz_loadu_ps(m, x)), m1);
    }
    for (; i + 4 * W <= n; i += 4 * W) {
        m0 = _mm512_max_ps(_mm512_mul_ps(vs, _mm512_loadu_ps(x + i)), m0);
        m1 = _mm512_max_ps(_mm512_mul_ps(vs, _mm512_loadu_ps(x + i + W)), m1);
        m2 = _mm512_max_ps(_mm512_mul_ps(vs, _mm512_loadu_ps(x + i + 2 * W)), m2);
        m3 = _mm512_max_ps(_mm512_mul_ps(vs, _mm512_loadu_ps(x + i + 3 * W)), m3);
    }
    for (; i + W <= n; i += W) m0 = _mm512_max_ps(_mm512_mul_ps(vs, _mm512_loadu_ps(x + i)), m0);
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        m1 = _mm512_mask_max_ps(m1, m, _mm512_mul_ps(vs, _mm512_maskz_loadu_ps(m, x + i)), m1);
    }
    return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
}

/* w where it is >= FLT_MIN or NaN (the compare is unordered), else exactly 0: no subnormal
 * results or weights */
ALWAYS_INLINE __m512 keep_normal(__m512 w) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(w, _mm512_set1_ps(FLT_MIN), _CMP_NLT_UQ), w);
}

/* The table of the "fast" exp (kernels.h), 2^(j/16) for lane j, with j << 19 taken off its bits:
 * t's bits are 1.5 * 2^23 + N, so adding t << 19 adds (N div 16) << 23, 2^(N div 16) in the
 * exponent, and puts j << 19 back for j = N mod 16, the lane vpermps picks with t's low bits. */
static const float EXP2_SIXTEENTHS[16] = {SDPA_EXP2_SIXTEENTHS};
static inline __m512 exp_table_avx512(void) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_castsi512_ps(_mm512_sub_epi32(
        _mm512_castps_si512(_mm512_loadu_ps(EXP2_SIXTEENTHS)), _mm512_slli_epi32(lane, 19)));
}

/* The shared "fast" exp (kernels.h). full = 0, for exp_sum and exp_tile, whose arguments are
 * <= 0 (kernels.h): no upper clamp, and results below FLT_MIN are left below it for the callers'
 * flush. full = 1, the exp entry: the whole float range, where 2^(N div 16) can reach 2^128:
 * positive x take one power of two off T and multiply it back at the end (to +inf on overflow),
 * and subnormal results become 0. max/min return their second operand when either is NaN, so
 * NaN passes the clamps; the FMA that forms N rounds to nearest whatever MXCSR says. */
static inline __m512 exp_fast_avx512(__m512 x, __m512 table, int full) {
    const __m512 magic = _mm512_set1_ps(0x1.8p23f);
    x = _mm512_max_ps(_mm512_set1_ps(SDPA_EXP_X_CLAMP_LO), x);
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
    __m512 e = _mm512_mul_ps(p, T);
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
 * folded into the fast exp's rounding step (kernels.h, "A row's shift"): N = round(z K / ln2)
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

/* softmax_short's exp (kernels.h, K = 32): the table's 2^(j/32) with j << 18 taken off, in
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

/* softmax_short's guessed shift (kernels.h, "A guessed shift"): the max of the row's two ends,
 * z[0] and z[n - 1], from two broadcast loads, so that the exps wait for neither the max nor its
 * cross-lane reduction */
ALWAYS_INLINE __m512 ends_guess(const float *x, size_t n, __m512 vs, int unit) {
    __m512 first = _mm512_set1_ps(x[0]), last = _mm512_set1_ps(x[n - 1]);
    if (!unit) first = _mm512_mul_ps(first, vs), last = _mm512_mul_ps(last, vs);
    return _mm512_max_ps(first, last);
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

/* SLEEF's exp against a guessed shift: z - g, unfolded */
ALWAYS_INLINE row_exp row_exp_sleef_guess(__m512 g) { return row_exp_fast_lanes(g, 0); }

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

/* the fast exp of exp_fast_avx512 (full = 0), with c's b, lo and polynomial */
ALWAYS_INLINE __m512 exp_row_fast(__m512 z, const row_exp *c) {
    __m512i ti;
    __m512 r = reduce_row(z, c, SDPA_EXP16_SCALE, SDPA_EXP16_LN2_HI, SDPA_EXP16_LN2_LO, &ti);
    __m512 T = _mm512_castsi512_ps(_mm512_add_epi32(
        _mm512_castps_si512(_mm512_permutexvar_ps(ti, c->table)), _mm512_slli_epi32(ti, 19)));
    __m512 p = _mm512_fmadd_ps(c->c3, r, c->c2);
    p = _mm512_fmadd_ps(p, r, c->c0);
    p = _mm512_fmadd_ps(p, r, c->c0);
    return _mm512_mul_ps(p, T);
}

ALWAYS_INLINE __m512 exp_row_sleef(__m512 z, const row_exp *c) {
    (void)c;
    return Sleef_expf16_u10avx512f(z);
}

/* z = scale * x is rounded before the shift is subtracted, as sdpa.h defines z (no fused
 * multiply-subtract): a fused one gets exp of its product's rounding error, inf or 0 once
 * |z| > ~1e9, and a NaN row (tests/test_regressions.c). With scale 1 (rows already scaled,
 * attention's tiles) z = x and the multiply is skipped. One body for both exp kinds: the fast
 * exp is inlined, four independent exps per iteration keeping both FMA pipes busy through its
 * dependency chain; SLEEF's is a call (CALLS), which takes the loop below. */
#define SCALED_(z) (unit ? (z) : _mm512_mul_ps((z), vs))
#define EXP_SUM_LANES_AVX512(NAME, EXP, CALLS)                                                     \
    /* the loop itself, the lane sums left unreduced (softmax_short reduces them in registers);    \
       with vmax (not NULL), also the lane maxima of z (exp_sum_max) */                            \
    ALWAYS_INLINE __m512 NAME##_lanes(float *y, const float *x, size_t n, __m512 vs,               \
                                      const row_exp *c, int unit, int folded, __m512 *vmax) {      \
        __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(),       \
               s3 = _mm512_setzero_ps();                                                           \
        __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0;                                            \
        size_t i = 0;                                                                              \
        if (CALLS) {                                                                               \
            /* an exp that is a call clobbers every vector register: nothing stays live across it  \
               (four lane sums and four arguments were spilled and reloaded around each call),     \
               and the sums come from a second pass over y, in L1 */                               \
            for (; i < n; i += W) {                                                                \
                __mmask16 m = n - i >= W ? (__mmask16)0xFFFF : tail_mask(n - i);                   \
                __m512 xi = _mm512_maskz_loadu_ps(m, x + i);                                       \
                if (!unit) xi = _mm512_mul_ps(xi, vs);                                             \
                if (!folded) xi = _mm512_sub_ps(xi, c->shift);                                     \
                _mm512_mask_storeu_ps(y + i, m, EXP(xi, c));                                       \
            }                                                                                      \
            for (i = 0; i + 4 * W <= n; i += 4 * W) {                                              \
                s0 = _mm512_add_ps(s0, _mm512_loadu_ps(y + i));                                    \
                s1 = _mm512_add_ps(s1, _mm512_loadu_ps(y + i + W));                                \
                s2 = _mm512_add_ps(s2, _mm512_loadu_ps(y + i + 2 * W));                            \
                s3 = _mm512_add_ps(s3, _mm512_loadu_ps(y + i + 3 * W));                            \
                if (vmax) {                                                                        \
                    m0 = _mm512_max_ps(SCALED_(_mm512_loadu_ps(x + i)), m0);                       \
                    m1 = _mm512_max_ps(SCALED_(_mm512_loadu_ps(x + i + W)), m1);                   \
                    m0 = _mm512_max_ps(SCALED_(_mm512_loadu_ps(x + i + 2 * W)), m0);               \
                    m1 = _mm512_max_ps(SCALED_(_mm512_loadu_ps(x + i + 3 * W)), m1);               \
                }                                                                                  \
            }                                                                                      \
            for (; i < n; i += W) {                                                                \
                __mmask16 m = n - i >= W ? (__mmask16)0xFFFF : tail_mask(n - i);                   \
                s0 = _mm512_add_ps(s0, _mm512_maskz_loadu_ps(m, y + i));                           \
                if (vmax)                                                                          \
                    m0 = _mm512_mask_max_ps(m0, m, SCALED_(_mm512_maskz_loadu_ps(m, x + i)), m0);  \
            }                                                                                      \
            if (vmax) *vmax = _mm512_max_ps(m0, m1);                                               \
            return _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3));                    \
        }                                                                                          \
        for (; i + 4 * W <= n; i += 4 * W) {                                                       \
            __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + W);                   \
            __m512 x2 = _mm512_loadu_ps(x + i + 2 * W), x3 = _mm512_loadu_ps(x + i + 3 * W);       \
            if (!unit) {                                                                           \
                x0 = _mm512_mul_ps(x0, vs), x1 = _mm512_mul_ps(x1, vs);                            \
                x2 = _mm512_mul_ps(x2, vs), x3 = _mm512_mul_ps(x3, vs);                            \
            }                                                                                      \
            if (vmax) {                                                                            \
                m0 = _mm512_max_ps(_mm512_max_ps(x0, x2), m0);                                     \
                m1 = _mm512_max_ps(_mm512_max_ps(x1, x3), m1);                                     \
            }                                                                                      \
            if (!folded) {                                                                         \
                x0 = _mm512_sub_ps(x0, c->shift), x1 = _mm512_sub_ps(x1, c->shift);                \
                x2 = _mm512_sub_ps(x2, c->shift), x3 = _mm512_sub_ps(x3, c->shift);                \
            }                                                                                      \
            __m512 e0 = EXP(x0, c), e1 = EXP(x1, c), e2 = EXP(x2, c), e3 = EXP(x3, c);             \
            _mm512_storeu_ps(y + i, e0);                                                           \
            _mm512_storeu_ps(y + i + W, e1);                                                       \
            _mm512_storeu_ps(y + i + 2 * W, e2);                                                   \
            _mm512_storeu_ps(y + i + 3 * W, e3);                                                   \
            s0 = _mm512_add_ps(s0, e0);                                                            \
            s1 = _mm512_add_ps(s1, e1);                                                            \
            s2 = _mm512_add_ps(s2, e2);                                                            \
            s3 = _mm512_add_ps(s3, e3);                                                            \
        }                                                                                          \
        for (; i < n; i += W) {                                                                    \
            __mmask16 m = n - i >= W ? (__mmask16)0xFFFF : tail_mask(n - i);                       \
            __m512 xi = _mm512_maskz_loadu_ps(m, x + i);                                           \
            if (!unit) xi = _mm512_mul_ps(xi, vs);                                                 \
            if (vmax) m0 = _mm512_mask_max_ps(m0, m, xi, m0);                                      \
            if (!folded) xi = _mm512_sub_ps(xi, c->shift);                                         \
            __m512 e = EXP(xi, c);                                                                 \
            _mm512_mask_storeu_ps(y + i, m, e);                                                    \
            s0 = _mm512_mask_add_ps(s0, m, s0, e);                                                 \
        }                                                                                          \
        if (vmax) *vmax = _mm512_max_ps(m0, m1);                                                   \
        return _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3));                        \
    }
#define EXP_SUM_AVX512(NAME, EXP, FOLDS, CALLS)                                                    \
    EXP_SUM_LANES_AVX512(NAME, EXP, CALLS)                                                         \
    ALWAYS_INLINE float NAME##_inline(float *y, const float *x, size_t n, float scale,             \
                                      float shift, __m512 *vmax) {                                 \
        const __m512 vs = _mm512_set1_ps(scale);                                                   \
        const int folded = FOLDS && fabsf(shift) <= SDPA_EXP_FOLD_MAX;                             \
        const row_exp c = row_exp_fast(shift, folded, 1);                                          \
        __m512 s;                                                                                  \
        if (folded)                                                                                \
            s = scale == 1.0f ? NAME##_lanes(y, x, n, vs, &c, 1, 1, vmax)                          \
                              : NAME##_lanes(y, x, n, vs, &c, 0, 1, vmax);                         \
        else                                                                                       \
            s = scale == 1.0f ? NAME##_lanes(y, x, n, vs, &c, 1, 0, vmax)                          \
                              : NAME##_lanes(y, x, n, vs, &c, 0, 0, vmax);                         \
        return _mm512_reduce_add_ps(s);                                                            \
    }                                                                                              \
    static float NAME(float *y, const float *x, size_t n, float scale, float shift) {              \
        return NAME##_inline(y, x, n, scale, shift, NULL);                                         \
    }                                                                                              \
    static float NAME##_max(float *y, const float *x, size_t n, float scale, float shift,          \
                            float *max) {                                                          \
        __m512 vmax;                                                                               \
        const float sum = NAME##_inline(y, x, n, scale, shift, &vmax);                             \
        *max = _mm512_reduce_max_ps(vmax);                                                         \
        return sum;                                                                                \
    }
EXP_SUM_AVX512(exp_sum_fast_avx512, exp_row_fast, 1, 0)
EXP_SUM_AVX512(exp_sum_sleef_avx512, exp_row_sleef, 0, 1)
EXP_SUM_LANES_AVX512(exp_sum_fast32_avx512, exp_row_fast32, 0)
#undef SCALED_

/* w = e * factor for rows held in registers, with keep_normal's flush decided from e, beside the
 * division, rather than from w after it: a compare into a mask register and the masked move take
 * 8 cycles on Zen 5, at the end of the row's chain. `keep_from` is the row's sum times
 * SDPA_KEEP_FLOOR, FLT_MIN (1 + 2^-18): a weight kept (e >= keep_from) is then >= FLT_MIN through
 * the three roundings of keep_from, factor and w, and one flushed is below 2 FLT_MIN, which sdpa.h
 * lets be 0. NaN is kept. The factor and w round to nearest whatever MXCSR says (embedded
 * rounding, at no cost): e <= sum then gives e * fl(1 / sum) <= 1 + 2^-24, which rounds to at
 * most 1, where under FE_UPWARD both would round up, and a dominant weight to 1 + 2^-23. */
#define SDPA_KEEP_FLOOR 0x1.00004p-126f
#define NEAREST_        (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
ALWAYS_INLINE __m512 weights_avx512(__m512 e, __m512 factor, __m512 keep_from) {
    return _mm512_maskz_mul_round_ps(_mm512_cmp_ps_mask(e, keep_from, _CMP_NLT_UQ), e, factor,
                                     NEAREST_);
}
/* 1 / total for weights_avx512, and its keep_from, from a row's sum in every lane */
ALWAYS_INLINE __m512 row_factor_avx512(__m512 total, __m512 *keep_from) {
    *keep_from = _mm512_mul_ps(total, _mm512_set1_ps(SDPA_KEEP_FLOOR));
    return _mm512_div_round_ps(_mm512_set1_ps(1.0f), total, NEAREST_);
}
#undef NEAREST_
/* weights_avx512 for one vector: e / total, one division where 1 / total takes one too, and no
 * multiply after it. Each weight is its quotient rounded once, so e <= total gives at most 1 in
 * every rounding mode, and a row of one entry exactly 1, where e * fl(1 / e) may be 1 - 2^-24. */
ALWAYS_INLINE __m512 quotients_avx512(__m512 e, __m512 total) {
    const __m512 keep_from = _mm512_mul_ps(total, _mm512_set1_ps(SDPA_KEEP_FLOOR));
    return _mm512_maskz_div_ps(_mm512_cmp_ps_mask(e, keep_from, _CMP_NLT_UQ), e, total);
}

/* y[i] *= factor; weights below FLT_MIN become exactly 0: decided from y[i] before the multiply
 * against keep_from (weights_avx512, one operation fewer a vector) when `from_e`, for rows whose
 * factor is 1 / total and keep_from is row_factor_avx512's; else by keep_normal after it */
ALWAYS_INLINE __m512 weight_of(__m512 e, __m512 vf, __m512 keep_from, int from_e) {
    return from_e ? weights_avx512(e, vf, keep_from) : keep_normal(_mm512_mul_ps(e, vf));
}
ALWAYS_INLINE void normalize_avx512_inline(float *y, size_t n, __m512 vf, __m512 keep_from,
                                           int from_e) {
    size_t i = 0;
    if (n >= 4 * W && lead_to_line(y)) {
        i = lead_to_line(y);
        __mmask16 m = tail_mask(i);
        _mm512_mask_storeu_ps(y, m, weight_of(_mm512_maskz_loadu_ps(m, y), vf, keep_from, from_e));
    }
    for (; i + 2 * W <= n; i += 2 * W) {
        __m512 w0 = weight_of(_mm512_loadu_ps(y + i), vf, keep_from, from_e);
        __m512 w1 = weight_of(_mm512_loadu_ps(y + i + W), vf, keep_from, from_e);
        _mm512_storeu_ps(y + i, w0);
        _mm512_storeu_ps(y + i + W, w1);
    }
    for (; i < n; i += W) {
        __mmask16 m = n - i >= W ? (__mmask16)0xFFFF : tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m,
                              weight_of(_mm512_maskz_loadu_ps(m, y + i), vf, keep_from, from_e));
    }
}

static void normalize_avx512(float *y, size_t n, float factor) {
    normalize_avx512_inline(y, n, _mm512_set1_ps(factor), _mm512_setzero_ps(), 0);
}

/* Lane-wise max and sum of all 16 lanes, in every lane, with no trip through a scalar register
 * (the result feeds vector code at once): inside each 128-bit chunk, then across the four chunks,
 * each as three exchanges side by side (the partners i ^ 1, i ^ 2 and i ^ 3), not two in turn. A
 * 512-bit shuffle across chunks takes 5 cycles on Zen 5: the reduction's chain is one such
 * shuffle, not two, and a short row's time includes that chain. */
#define ALL_OF_4(OP, v, SHUFFLE, i1, i2, i3)                                                       \
    OP(OP(v, SHUFFLE(v, i1)), OP(SHUFFLE(v, i2), SHUFFLE(v, i3)))
#define IN_CHUNKS_(v, imm)     _mm512_permute_ps(v, imm)
#define ACROSS_CHUNKS_(v, imm) _mm512_shuffle_f32x4(v, v, imm)
ALWAYS_INLINE __m512 allmax_avx512(__m512 v) {
    v = ALL_OF_4(_mm512_max_ps, v, IN_CHUNKS_, 0xB1, 0x4E, 0x1B);
    return ALL_OF_4(_mm512_max_ps, v, ACROSS_CHUNKS_, 0xB1, 0x4E, 0x1B);
}
ALWAYS_INLINE __m512 allsum_avx512(__m512 v) {
    v = ALL_OF_4(_mm512_add_ps, v, IN_CHUNKS_, 0xB1, 0x4E, 0x1B);
    return ALL_OF_4(_mm512_add_ps, v, ACROSS_CHUNKS_, 0xB1, 0x4E, 0x1B);
}
#undef IN_CHUNKS_
#undef ACROSS_CHUNKS_
#undef ALL_OF_4

/* the weights of a row whose exps are in y[0, head) and, for the `last` lanes of a partial
 * vector past them, in e, from the row's lane sums */
ALWAYS_INLINE void weights_of_row_avx512(float *y, size_t head, __m512 e, __mmask16 last,
                                         __m512 sums) {
    __m512 keep_from;
    const __m512 factor = row_factor_avx512(allsum_avx512(sums), &keep_from);
    normalize_avx512_inline(y, head, factor, keep_from, 1);
    if (last) _mm512_mask_storeu_ps(y + head, last, weights_avx512(e, factor, keep_from));
}

/* A row of up to 4096 floats in one call (kernels.h, softmax_short): the three passes of the long
 * path without the calls between them, the max and the sum reduced in registers, and 1 / sum in
 * float: the sum comes from 64 partial sums of at most 64 weights each, as exp_sum's 4096-float
 * blocks do. The exp pass is exp_sum's own loop, with the 32-entry exp (kernels.h: one FMA
 * fewer, in a pass bound by its operation count); z = scale * x is rounded before the max is
 * subtracted, as there. Up to 4096 floats the calls between the driver's passes and the latency
 * from one pass to the next are a visible part of the row's time.
 * The exps first run against a guessed shift (kernels.h, "A guessed shift"). One vector, or a
 * row in registers, checks the guess against the max before it stores. A longer row finds the
 * max beside its exps and checks it after its stores; such a row takes the guess only when y
 * and x are apart, so that x is still there to start again from. */
#define SOFTMAX_SHORT_AVX512(NAME, EXP_SUM_LANES, ROW_EXP, GUESS_EXP, EXP, FOLDS)                  \
    /* the exps of one vector of z's lanes in `valid` (z - shift, up to the shift's constant       \
       factor), 0 in the others */                                                                 \
    ALWAYS_INLINE __m512 NAME##_exps(__m512 z, __mmask16 valid, __m512 shift, const row_exp *c,    \
                                     int folded) {                                                 \
        return _mm512_maskz_mov_ps(valid, EXP(folded ? z : _mm512_sub_ps(z, shift), c));           \
    }                                                                                              \
    /* the weights of one vector of exps e (lanes outside `valid` 0) whose sum is in every lane of \
       total */                                                                                    \
    ALWAYS_INLINE void NAME##_vector_store(float *y, __m512 e, __m512 total, __mmask16 valid) {    \
        _mm512_mask_storeu_ps(y, valid, quotients_avx512(e, total));                               \
    }                                                                                              \
    /* a row of one vector, in a register from the load to the store, where longer rows store      \
       their weights and load them again (a store and reload on the chain of a row this short);    \
       its guess is checked by the sum, with no max (kernels.h, "A capped guess") */               \
    ALWAYS_INLINE float NAME##_vector(float *y, const float *x, size_t n, __m512 vs, int unit) {   \
        const __mmask16 valid = tail_mask(n);                                                      \
        __m512 z = _mm512_maskz_loadu_ps(valid, x);                                                \
        if (!unit) z = _mm512_mul_ps(z, vs);                                                       \
        const __m512 g = ends_guess(x, n, vs, unit);                                               \
        const float gs = _mm512_cvtss_f32(g);                                                      \
        if (sdpa_guess_usable(gs)) {                                                               \
            const row_exp c = GUESS_EXP(g);                                                        \
            const __m512 cap = _mm512_add_ps(g, _mm512_set1_ps(SDPA_GUESS_CAP));                   \
            const __m512 e = NAME##_exps(_mm512_min_ps(cap, z), valid, g, &c, FOLDS);              \
            const __m512 total = allsum_avx512(e);                                                 \
            if (_mm512_cvtss_f32(total) <= SDPA_GUESS_SUM_MAX) {                                   \
                NAME##_vector_store(y, e, total, valid);                                           \
                return gs;                                                                         \
            }                                                                                      \
        }                                                                                          \
        const __m512 vmax =                                                                        \
            allmax_avx512(_mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), valid, z));                \
        const float max = _mm512_cvtss_f32(vmax);                                                  \
        if (!isfinite(max)) return max;                                                            \
        const int folded = FOLDS && fabsf(max) <= SDPA_EXP_FOLD_MAX;                               \
        const row_exp c = ROW_EXP(vmax, folded);                                                   \
        const __m512 e = NAME##_exps(z, valid, vmax, &c, folded);                                  \
        NAME##_vector_store(y, e, allsum_avx512(e), valid);                                        \
        return max;                                                                                \
    }                                                                                              \
    /* the exp pass and the normalisation against a guessed shift g, for y apart from x: the max   \
       of z, found beside the exps; the caller checks g against it */                              \
    ALWAYS_INLINE float NAME##_guessed(float *y, const float *x, size_t n, __m512 vs, int unit,    \
                                       __m512 g) {                                                 \
        const row_exp c = GUESS_EXP(g);                                                            \
        const size_t head = n & ~(size_t)(W - 1);                                                  \
        const __mmask16 last = tail_mask(n - head);                                                \
        __m512 vmax;                                                                               \
        __m512 sum = EXP_SUM_LANES(y, x, head, vs, &c, unit, FOLDS, &vmax);                        \
        __m512 e = _mm512_setzero_ps(), z = _mm512_set1_ps(-INFINITY);                             \
        if (last) {                                                                                \
            z = _mm512_maskz_loadu_ps(last, x + head);                                             \
            if (!unit) z = _mm512_mul_ps(z, vs);                                                   \
            e = NAME##_exps(z, last, g, &c, FOLDS);                                                \
            sum = _mm512_add_ps(sum, e);                                                           \
            z = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), last, z);                            \
        }                                                                                          \
        weights_of_row_avx512(y, head, e, last, sum);                                              \
        return _mm512_reduce_max_ps(_mm512_max_ps(z, vmax));                                       \
    }                                                                                              \
    ALWAYS_INLINE float NAME##_body(float *y, const float *x, size_t n, float scale, int unit) {   \
        const __m512 vs = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);                 \
        if (n <= W) return NAME##_vector(y, x, n, vs, unit);                                       \
        if (sdpa_apart(y, x, n)) {                                                                 \
            const __m512 g = ends_guess(x, n, vs, unit);                                           \
            const float gs = _mm512_cvtss_f32(g);                                                  \
            if (sdpa_guess_usable(gs)) {                                                           \
                const float max = NAME##_guessed(y, x, n, vs, unit, g);                            \
                if (sdpa_guess_fits(gs, max)) return max;                                          \
            }                                                                                      \
        }                                                                                          \
        __m512 m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;                                         \
        size_t i = 0;                                                                              \
        if (n >= 4 * W && lead_to_line(x)) { /* x to a line boundary, as in max_scaled */          \
            i = lead_to_line(x);                                                                   \
            __m512 z = _mm512_maskz_loadu_ps(tail_mask(i), x);                                     \
            if (!unit) z = _mm512_mul_ps(z, vs);                                                   \
            m2 = _mm512_mask_max_ps(m2, tail_mask(i), z, m2);                                      \
        }                                                                                          \
        for (; i + 4 * W <= n; i += 4 * W) {                                                       \
            __m512 z0 = _mm512_loadu_ps(x + i), z1 = _mm512_loadu_ps(x + i + W);                   \
            __m512 z2 = _mm512_loadu_ps(x + i + 2 * W), z3 = _mm512_loadu_ps(x + i + 3 * W);       \
            if (!unit) z0 = _mm512_mul_ps(z0, vs), z1 = _mm512_mul_ps(z1, vs);                     \
            if (!unit) z2 = _mm512_mul_ps(z2, vs), z3 = _mm512_mul_ps(z3, vs);                     \
            m0 = _mm512_max_ps(z0, m0), m1 = _mm512_max_ps(z1, m1);                                \
            m2 = _mm512_max_ps(z2, m2), m3 = _mm512_max_ps(z3, m3);                                \
        }                                                                                          \
        m0 = _mm512_max_ps(m0, m2), m1 = _mm512_max_ps(m1, m3);                                    \
        for (; i + 2 * W <= n; i += 2 * W) {                                                       \
            __m512 z0 = _mm512_loadu_ps(x + i), z1 = _mm512_loadu_ps(x + i + W);                   \
            if (!unit) z0 = _mm512_mul_ps(z0, vs), z1 = _mm512_mul_ps(z1, vs);                     \
            m0 = _mm512_max_ps(z0, m0), m1 = _mm512_max_ps(z1, m1);                                \
        }                                                                                          \
        if (i < n) {                                                                               \
            __mmask16 m = n - i >= W ? (__mmask16)0xFFFF : tail_mask(n - i);                       \
            __m512 z = _mm512_maskz_loadu_ps(m, x + i);                                            \
            if (!unit) z = _mm512_mul_ps(z, vs);                                                   \
            m0 = _mm512_mask_max_ps(m0, m, z, m0);                                                 \
            if (n - i > W) {                                                                       \
                m = tail_mask(n - i - W);                                                          \
                z = _mm512_maskz_loadu_ps(m, x + i + W);                                           \
                if (!unit) z = _mm512_mul_ps(z, vs);                                               \
                m1 = _mm512_mask_max_ps(m1, m, z, m1);                                             \
            }                                                                                      \
        }                                                                                          \
        const __m512 vmax = allmax_avx512(_mm512_max_ps(m0, m1));                                  \
        const float max = _mm512_cvtss_f32(vmax);                                                  \
        if (!isfinite(max)) return max;                                                            \
        /* the weights are exp(z - max) times one constant factor near 1, which the division by    \
           their sum takes out: so the exp needs no correction for its rounded shift. The sum is   \
           > 0.9 (the max gives about exp(0)), or NaN when x holds a NaN: so is every y. */        \
        const int folded = FOLDS && fabsf(max) <= SDPA_EXP_FOLD_MAX;                               \
        const row_exp c = ROW_EXP(vmax, folded);                                                   \
        /* a partial last vector stays in a register from its exp to its store: a masked store     \
           followed by a masked load of the same bytes is not forwarded cheaply, and a short row   \
           would pay for it */                                                                     \
        const size_t head = n & ~(size_t)(W - 1);                                                  \
        const __mmask16 last = tail_mask(n - head);                                                \
        __m512 sum = folded ? EXP_SUM_LANES(y, x, head, vs, &c, unit, 1, NULL)                     \
                            : EXP_SUM_LANES(y, x, head, vs, &c, unit, 0, NULL);                    \
        __m512 e = _mm512_setzero_ps();                                                            \
        if (last) {                                                                                \
            __m512 z = _mm512_maskz_loadu_ps(last, x + head);                                      \
            if (!unit) z = _mm512_mul_ps(z, vs);                                                   \
            e = NAME##_exps(z, last, vmax, &c, folded);                                            \
            sum = _mm512_add_ps(sum, e);                                                           \
        }                                                                                          \
        weights_of_row_avx512(y, head, e, last, sum);                                              \
        return max;                                                                                \
    }                                                                                              \
    static float NAME(float *y, const float *x, size_t n, float scale) {                           \
        return scale == 1.0f ? NAME##_body(y, x, n, 1.0f, 1) : NAME##_body(y, x, n, scale, 0);     \
    }

SOFTMAX_SHORT_AVX512(softmax_short_fast32_avx512, exp_sum_fast32_avx512_lanes, row_exp_fast32_lanes,
                     row_exp_fast32_guess, exp_row_fast32, 1)
SOFTMAX_SHORT_AVX512(softmax_short_sleef_avx512, exp_sum_sleef_avx512_lanes, row_exp_fast_lanes,
                     row_exp_sleef_guess, exp_row_sleef, 0)

/* Rows of 17 to 128 floats with the fast exp, in V = 2, 4 or 8 vectors that stay in registers
 * from their loads to their stores, where the three-pass body stores the weights and loads them
 * again: the store and the reload are a large part of a row this short. Vectors past the row's
 * end are skipped by a branch, not loaded with an empty mask: such a load still takes a slow
 * fault-suppression assist when its bytes lie on an unmapped page. Named variables, not arrays:
 * gcc kept the arrays on the stack. SLEEF's exp is a call, across which nothing stays in a
 * register: that kind keeps the three passes. */
#define EACH_OF_8(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7)
#define TREE_OF_8(OP, a)                                                                           \
    if (V > 4)                                                                                     \
        a##0 = OP(a##0, a##4), a##1 = OP(a##1, a##5), a##2 = OP(a##2, a##6),                       \
        a##3 = OP(a##3, a##7);                                                                     \
    if (V > 2) a##0 = OP(a##0, a##2), a##1 = OP(a##1, a##3);                                       \
    a##0 = OP(a##0, a##1);
ALWAYS_INLINE float softmax_regs_fast_avx512(float *y, const float *x, size_t n, __m512 vs,
                                             int unit, const int V, const int full) {
    if (full) n = (size_t)V * W; /* no masks to form and no branches per vector */
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
#define MASK_(k)                                                                                   \
    const __mmask16 m##k = V <= k || n <= (size_t)k * W ? 0                                        \
                           : n >= (size_t)(k + 1) * W   ? (__mmask16)0xFFFF                        \
                                                        : tail_mask(n - (size_t)k * W);              \
    __m512 z##k = ninf;
#define LOAD_(k)                                                                                   \
    if (m##k) {                                                                                    \
        z##k = _mm512_maskz_loadu_ps(m##k, x + k * W);                                             \
        if (!unit) z##k = _mm512_mul_ps(z##k, vs);                                                 \
    }
    /* the exps of z (capped at `cap`) against `shift`, their sum in every lane of `total` */
#define EXP_(k)                                                                                    \
    __m512 e##k = _mm512_setzero_ps(), a##k = e##k;                                                \
    if (V > k && m##k) {                                                                           \
        e##k = _mm512_maskz_mov_ps(m##k, exp_row_fast32(!folded  ? _mm512_sub_ps(z##k, shift)      \
                                                        : capped ? _mm512_min_ps(cap, z##k)        \
                                                                 : z##k,                           \
                                                        &c));                                      \
        a##k = e##k;                                                                               \
    }
#define STORE_(k)                                                                                  \
    if (V > k && m##k)                                                                             \
        _mm512_mask_storeu_ps(y + k * W, m##k, weights_avx512(e##k, factor, keep_from));
#define WEIGHTS_(total)                                                                            \
    do {                                                                                           \
        __m512 keep_from;                                                                          \
        const __m512 factor = row_factor_avx512(total, &keep_from);                                \
        EACH_OF_8(STORE_)                                                                          \
    } while (0)
    EACH_OF_8(MASK_)
    EACH_OF_8(LOAD_)
    const __m512 g = ends_guess(x, n, vs, unit);
    const float gs = _mm512_cvtss_f32(g);
    if (sdpa_guess_usable(gs)) {
        /* no max: the sum checks the guess (kernels.h, "A capped guess") */
        const int folded = 1, capped = 1;
        const __m512 shift = g, cap = _mm512_add_ps(g, _mm512_set1_ps(SDPA_GUESS_CAP));
        const row_exp c = row_exp_fast32_guess(g);
        EACH_OF_8(EXP_)
        TREE_OF_8(_mm512_add_ps, a)
        const __m512 total = allsum_avx512(a0);
        if (_mm512_cvtss_f32(total) <= SDPA_GUESS_SUM_MAX) {
            WEIGHTS_(total);
            return gs;
        }
        /* nothing is stored yet, so x is whole: z is loaded again rather than kept in registers
           through the exps, where it crowded them into spills (the barrier stops gcc reusing the
           first loads) */
        __asm__ volatile("" ::: "memory");
        EACH_OF_8(LOAD_)
    }
#define MAX_(k) __m512 a##k = _mm512_mask_mov_ps(ninf, m##k, z##k);
    EACH_OF_8(MAX_)
#undef MAX_
    TREE_OF_8(_mm512_max_ps, a)
    const __m512 vmax = allmax_avx512(a0);
    const float max = _mm512_cvtss_f32(vmax);
    if (!isfinite(max)) return max;
    {
        const int folded = fabsf(max) <= SDPA_EXP_FOLD_MAX, capped = 0;
        const __m512 shift = vmax, cap = ninf;
        const row_exp c = row_exp_fast32_lanes(vmax, folded);
        EACH_OF_8(EXP_)
        TREE_OF_8(_mm512_add_ps, a)
        WEIGHTS_(allsum_avx512(a0));
    }
#undef WEIGHTS_
#undef STORE_
#undef EXP_
#undef LOAD_
#undef MASK_
    return max;
}

/* a row of 17 to 128 floats: in V = 2, 4 or 8 vectors, with no masks when it fills them */
#define REGS_(V)                                                                                   \
    (n == (V)*W ? (unit ? softmax_regs_fast_avx512(y, x, n, vs, 1, V, 1)                           \
                        : softmax_regs_fast_avx512(y, x, n, vs, 0, V, 1))                          \
     : unit     ? softmax_regs_fast_avx512(y, x, n, vs, 1, V, 0)                                   \
                : softmax_regs_fast_avx512(y, x, n, vs, 0, V, 0))
SDPA_SHORT_ENTRY(softmax_short_fast32_avx512)
SDPA_SHORT_ENTRY(softmax_short_sleef_avx512)
/* rows of up to 128 floats here, in registers; longer ones jump to the three passes, whose
 * loops' registers and frame stay there */
static int softmax_short_fast_avx512(float *y, const float *x, size_t n, float scale) {
    if (n > 8 * W) return softmax_short_fast32_avx512_entry(y, x, n, scale);
    const __m512 vs = _mm512_set1_ps(scale);
    const int unit = scale == 1.0f;
    float got;
    if (n <= W)
        got = unit ? softmax_short_fast32_avx512_vector(y, x, n, vs, 1)
                   : softmax_short_fast32_avx512_vector(y, x, n, vs, 0);
    else
        got = n <= 2 * W ? REGS_(2) : n <= 4 * W ? REGS_(4) : REGS_(8);
    return sdpa_short_done(got, y, x, n, scale);
}
#undef REGS_
#undef EACH_OF_8
#undef TREE_OF_8

#define EXP_ARRAY_AVX512(NAME, EXP)                                                                \
    static void NAME(float *y, const float *x, size_t n) {                                         \
        const __m512 table = exp_table_avx512();                                                   \
        for (size_t i = 0; i < n; i += W) {                                                        \
            __mmask16 m = n - i >= W ? (__mmask16)0xFFFF : tail_mask(n - i);                       \
            _mm512_mask_storeu_ps(y + i, m, EXP(_mm512_maskz_loadu_ps(m, x + i), table, 1));       \
        }                                                                                          \
    }
EXP_ARRAY_AVX512(exp_fast_array_avx512, exp_fast_avx512)
EXP_ARRAY_AVX512(exp_sleef_array_avx512, exp_sleef_avx512)

static void softmax_backward_avx512(float *dx, const float *y, const float *dy, size_t n,
                                    float scale, float y_dot_dy) {
    const __m512 vs = _mm512_set1_ps(scale), vd = _mm512_set1_ps(y_dot_dy);
    for (size_t i = 0; i < n; i += W) {
        __mmask16 m = n - i >= W ? (__mmask16)0xFFFF : tail_mask(n - i);
        __m512 t = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, dy + i), vd);
        _mm512_mask_storeu_ps(dx + i, m,
                              _mm512_mul_ps(_mm512_mul_ps(vs, _mm512_maskz_loadu_ps(m, y + i)), t));
    }
}

/* ---- Attention microkernels (the tiling driver is src/attention.c) ---- */

/* Two 128-bit-chunked partial sums of four vectors: chunk k of the result holds, in lane i,
 * the sum over chunk k of the lanes of the i-th input. */
ALWAYS_INLINE __m512 hsum4_chunks_avx512(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    return _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));
}

/* Lane i of the result is the sum of the lanes of the i-th argument: a transpose-and-add tree,
 * 15 adds for 16 sums instead of 16 separate reductions. */
ALWAYS_INLINE __m512 hsum16_avx512(__m512 a0, __m512 a1, __m512 a2, __m512 a3, __m512 a4, __m512 a5,
                                   __m512 a6, __m512 a7, __m512 a8, __m512 a9, __m512 a10,
                                   __m512 a11, __m512 a12, __m512 a13, __m512 a14, __m512 a15) {
    __m512 x0 = hsum4_chunks_avx512(a0, a1, a2, a3), x1 = hsum4_chunks_avx512(a4, a5, a6, a7);
    __m512 x2 = hsum4_chunks_avx512(a8, a9, a10, a11);
    __m512 x3 = hsum4_chunks_avx512(a12, a13, a14, a15);
    __m512 y01 =
        _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, 0x44), _mm512_shuffle_f32x4(x0, x1, 0xEE));
    __m512 y23 =
        _mm512_add_ps(_mm512_shuffle_f32x4(x2, x3, 0x44), _mm512_shuffle_f32x4(x2, x3, 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(y01, y23, 0x88),
                         _mm512_shuffle_f32x4(y01, y23, 0xDD));
}

/* One step of a 4 x 4 block: 8 loads feed 16 FMAs. LOAD is a full or a masked load. */
#define SCORES_4X4_STEP(LOAD)                                                                      \
    do {                                                                                           \
        __m512 q0 = LOAD(q + p), q1 = LOAD(q + q_stride + p), q2 = LOAD(q + 2 * q_stride + p),     \
               q3 = LOAD(q + 3 * q_stride + p);                                                    \
        __m512 k0 = LOAD(k + p), k1 = LOAD(k + k_stride + p), k2 = LOAD(k + 2 * k_stride + p),     \
               k3 = LOAD(k + 3 * k_stride + p);                                                    \
        a00 = _mm512_fmadd_ps(q0, k0, a00), a01 = _mm512_fmadd_ps(q0, k1, a01);                    \
        a02 = _mm512_fmadd_ps(q0, k2, a02), a03 = _mm512_fmadd_ps(q0, k3, a03);                    \
        a10 = _mm512_fmadd_ps(q1, k0, a10), a11 = _mm512_fmadd_ps(q1, k1, a11);                    \
        a12 = _mm512_fmadd_ps(q1, k2, a12), a13 = _mm512_fmadd_ps(q1, k3, a13);                    \
        a20 = _mm512_fmadd_ps(q2, k0, a20), a21 = _mm512_fmadd_ps(q2, k1, a21);                    \
        a22 = _mm512_fmadd_ps(q2, k2, a22), a23 = _mm512_fmadd_ps(q2, k3, a23);                    \
        a30 = _mm512_fmadd_ps(q3, k0, a30), a31 = _mm512_fmadd_ps(q3, k1, a31);                    \
        a32 = _mm512_fmadd_ps(q3, k2, a32), a33 = _mm512_fmadd_ps(q3, k3, a33);                    \
    } while (0)
#define LOAD_FULL(ptr) _mm512_loadu_ps(ptr)
#define LOAD_TAIL(ptr) _mm512_maskz_loadu_ps(m, ptr)

/* Scores of 4 queries x 4 keys: 16 dot products in 16 registers along d, reduced once. */
ALWAYS_INLINE void scores_4x4_avx512(float *s, size_t ld_s, const float *q, size_t q_stride,
                                     const float *k, size_t k_stride, size_t d, __m512 vscale) {
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00,
           a12 = a00, a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00,
           a32 = a00, a33 = a00;
    size_t p = 0;
    for (; p + W <= d; p += W) SCORES_4X4_STEP(LOAD_FULL);
    if (p < d) {
        __mmask16 m = tail_mask(d - p);
        SCORES_4X4_STEP(LOAD_TAIL);
    }
    __m512 sum = _mm512_mul_ps(hsum16_avx512(a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22,
                                             a23, a30, a31, a32, a33),
                               vscale);
    _mm_storeu_ps(s, _mm512_extractf32x4_ps(sum, 0));
    _mm_storeu_ps(s + ld_s, _mm512_extractf32x4_ps(sum, 1));
    _mm_storeu_ps(s + 2 * ld_s, _mm512_extractf32x4_ps(sum, 2));
    _mm_storeu_ps(s + 3 * ld_s, _mm512_extractf32x4_ps(sum, 3));
}

/* One step of a 1 x 16 block: the query's vector is loaded once for 16 keys. */
#define SCORES_1X16_STEP(LOAD)                                                                     \
    do {                                                                                           \
        __m512 vq = LOAD(q + p);                                                                   \
        a0 = _mm512_fmadd_ps(vq, LOAD(k + p), a0);                                                 \
        a1 = _mm512_fmadd_ps(vq, LOAD(k + k_stride + p), a1);                                      \
        a2 = _mm512_fmadd_ps(vq, LOAD(k + 2 * k_stride + p), a2);                                  \
        a3 = _mm512_fmadd_ps(vq, LOAD(k + 3 * k_stride + p), a3);                                  \
        a4 = _mm512_fmadd_ps(vq, LOAD(k + 4 * k_stride + p), a4);                                  \
        a5 = _mm512_fmadd_ps(vq, LOAD(k + 5 * k_stride + p), a5);                                  \
        a6 = _mm512_fmadd_ps(vq, LOAD(k + 6 * k_stride + p), a6);                                  \
        a7 = _mm512_fmadd_ps(vq, LOAD(k + 7 * k_stride + p), a7);                                  \
        a8 = _mm512_fmadd_ps(vq, LOAD(k + 8 * k_stride + p), a8);                                  \
        a9 = _mm512_fmadd_ps(vq, LOAD(k + 9 * k_stride + p), a9);                                  \
        a10 = _mm512_fmadd_ps(vq, LOAD(k + 10 * k_stride + p), a10);                               \
        a11 = _mm512_fmadd_ps(vq, LOAD(k + 11 * k_stride + p), a11);                               \
        a12 = _mm512_fmadd_ps(vq, LOAD(k + 12 * k_stride + p), a12);                               \
        a13 = _mm512_fmadd_ps(vq, LOAD(k + 13 * k_stride + p), a13);                               \
        a14 = _mm512_fmadd_ps(vq, LOAD(k + 14 * k_stride + p), a14);                               \
        a15 = _mm512_fmadd_ps(vq, LOAD(k + 15 * k_stride + p), a15);                               \
    } while (0)

/* Scores of one query x 16 keys (decode). */
ALWAYS_INLINE void scores_1x16_avx512(float *s, const float *q, const float *k, size_t k_stride,
                                      size_t d, __m512 vscale) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,
           a8 = a0, a9 = a0, a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0, a15 = a0;
    size_t p = 0;
    for (; p + W <= d; p += W) SCORES_1X16_STEP(LOAD_FULL);
    if (p < d) {
        __mmask16 m = tail_mask(d - p);
        SCORES_1X16_STEP(LOAD_TAIL);
    }
    _mm512_storeu_ps(s, _mm512_mul_ps(hsum16_avx512(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10,
                                                    a11, a12, a13, a14, a15),
                                      vscale));
}

static void scores_tile_avx512(float *s, size_t ld_s, const float *q, size_t q_stride, size_t nq,
                               const float *k, size_t k_stride, size_t nk, size_t d, float scale) {
    const __m512 vscale = _mm512_set1_ps(scale);
    size_t i = 0;
    for (; i + 4 <= nq; i += 4) {
        const float *qi = q + i * q_stride;
        float *si = s + i * ld_s;
        size_t j = 0;
        for (; j + 4 <= nk; j += 4)
            scores_4x4_avx512(si + j, ld_s, qi, q_stride, k + j * k_stride, k_stride, d, vscale);
        for (; j < nk; j++)
            for (size_t r = 0; r < 4; r++)
                si[r * ld_s + j] = scale * dot_avx512(qi + r * q_stride, k + j * k_stride, d);
    }
    for (; i < nq; i++) {
        const float *qi = q + i * q_stride;
        float *si = s + i * ld_s;
        size_t j = 0;
        for (; j + 16 <= nk; j += 16)
            scores_1x16_avx512(si + j, qi, k + j * k_stride, k_stride, d, vscale);
        for (; j < nk; j++) si[j] = scale * dot_avx512(qi, k + j * k_stride, d);
    }
}

/* The P V microkernels: acc[i][c] = acc[i][c] alpha[i] + sum_j P(i, j) v[j][c], with the weight
 * P(i, j) at p[i * p_row + j * p_key] (row-major tiles: p_row = ld_p, p_key = 1; the key-major
 * tiles of exp_pv: p_row = 1, p_key = SDPA_ATTN_MAX_BLOCK_Q) and alpha = NULL for 1 (so that
 * rescaling a row for a new max costs a multiply at the load, not a pass over the row). Inlined
 * into each caller with its constants. */
ALWAYS_INLINE __m512 pv_load_acc(const float *o, __mmask16 m, const float *alpha) {
    __m512 c = _mm512_maskz_loadu_ps(m, o);
    return alpha ? _mm512_mul_ps(c, _mm512_set1_ps(*alpha)) : c;
}

/* acc[4 rows][64 columns]: the block of acc stays in 16 registers for all nk keys; each key
 * costs 4 loads of v and 4 broadcasts for 16 FMAs. */
ALWAYS_INLINE void pv_4x64_avx512(float *acc, size_t ld_acc, const float *p, size_t p_row,
                                  size_t p_key, const float *alpha, size_t nk, const float *v,
                                  size_t v_stride) {
    float *o0 = acc, *o1 = acc + ld_acc, *o2 = acc + 2 * ld_acc, *o3 = acc + 3 * ld_acc;
    const __mmask16 all = 0xFFFF;
    const float *a0 = alpha, *a1 = alpha ? alpha + 1 : NULL, *a2 = alpha ? alpha + 2 : NULL,
                *a3 = alpha ? alpha + 3 : NULL;
    __m512 c00 = pv_load_acc(o0, all, a0), c01 = pv_load_acc(o0 + W, all, a0),
           c02 = pv_load_acc(o0 + 2 * W, all, a0), c03 = pv_load_acc(o0 + 3 * W, all, a0);
    __m512 c10 = pv_load_acc(o1, all, a1), c11 = pv_load_acc(o1 + W, all, a1),
           c12 = pv_load_acc(o1 + 2 * W, all, a1), c13 = pv_load_acc(o1 + 3 * W, all, a1);
    __m512 c20 = pv_load_acc(o2, all, a2), c21 = pv_load_acc(o2 + W, all, a2),
           c22 = pv_load_acc(o2 + 2 * W, all, a2), c23 = pv_load_acc(o2 + 3 * W, all, a2);
    __m512 c30 = pv_load_acc(o3, all, a3), c31 = pv_load_acc(o3 + W, all, a3),
           c32 = pv_load_acc(o3 + 2 * W, all, a3), c33 = pv_load_acc(o3 + 3 * W, all, a3);
    for (size_t j = 0; j < nk; j++) {
        const float *vj = v + j * v_stride, *pj = p + j * p_key;
        __m512 v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + W),
               v2 = _mm512_loadu_ps(vj + 2 * W), v3 = _mm512_loadu_ps(vj + 3 * W);
        __m512 w = _mm512_set1_ps(pj[0]);
        c00 = _mm512_fmadd_ps(w, v0, c00), c01 = _mm512_fmadd_ps(w, v1, c01);
        c02 = _mm512_fmadd_ps(w, v2, c02), c03 = _mm512_fmadd_ps(w, v3, c03);
        w = _mm512_set1_ps(pj[p_row]);
        c10 = _mm512_fmadd_ps(w, v0, c10), c11 = _mm512_fmadd_ps(w, v1, c11);
        c12 = _mm512_fmadd_ps(w, v2, c12), c13 = _mm512_fmadd_ps(w, v3, c13);
        w = _mm512_set1_ps(pj[2 * p_row]);
        c20 = _mm512_fmadd_ps(w, v0, c20), c21 = _mm512_fmadd_ps(w, v1, c21);
        c22 = _mm512_fmadd_ps(w, v2, c22), c23 = _mm512_fmadd_ps(w, v3, c23);
        w = _mm512_set1_ps(pj[3 * p_row]);
        c30 = _mm512_fmadd_ps(w, v0, c30), c31 = _mm512_fmadd_ps(w, v1, c31);
        c32 = _mm512_fmadd_ps(w, v2, c32), c33 = _mm512_fmadd_ps(w, v3, c33);
    }
    _mm512_storeu_ps(o0, c00), _mm512_storeu_ps(o0 + W, c01);
    _mm512_storeu_ps(o0 + 2 * W, c02), _mm512_storeu_ps(o0 + 3 * W, c03);
    _mm512_storeu_ps(o1, c10), _mm512_storeu_ps(o1 + W, c11);
    _mm512_storeu_ps(o1 + 2 * W, c12), _mm512_storeu_ps(o1 + 3 * W, c13);
    _mm512_storeu_ps(o2, c20), _mm512_storeu_ps(o2 + W, c21);
    _mm512_storeu_ps(o2 + 2 * W, c22), _mm512_storeu_ps(o2 + 3 * W, c23);
    _mm512_storeu_ps(o3, c30), _mm512_storeu_ps(o3 + W, c31);
    _mm512_storeu_ps(o3 + 2 * W, c32), _mm512_storeu_ps(o3 + 3 * W, c33);
}

/* acc[4 rows][16 columns, masked by m]; two keys per step keep eight independent FMA chains. */
ALWAYS_INLINE void pv_4x16_avx512(float *acc, size_t ld_acc, const float *p, size_t p_row,
                                  size_t p_key, const float *alpha, size_t nk, const float *v,
                                  size_t v_stride, __mmask16 m) {
    __m512 c0 = pv_load_acc(acc, m, alpha),
           c1 = pv_load_acc(acc + ld_acc, m, alpha ? alpha + 1 : NULL);
    __m512 c2 = pv_load_acc(acc + 2 * ld_acc, m, alpha ? alpha + 2 : NULL);
    __m512 c3 = pv_load_acc(acc + 3 * ld_acc, m, alpha ? alpha + 3 : NULL);
    __m512 e0 = _mm512_setzero_ps(), e1 = e0, e2 = e0, e3 = e0;
    size_t j = 0;
    for (; j + 2 <= nk; j += 2) {
        const float *p0 = p + j * p_key, *p1 = p0 + p_key;
        __m512 v0 = _mm512_maskz_loadu_ps(m, v + j * v_stride);
        __m512 v1 = _mm512_maskz_loadu_ps(m, v + (j + 1) * v_stride);
        c0 = _mm512_fmadd_ps(_mm512_set1_ps(p0[0]), v0, c0);
        c1 = _mm512_fmadd_ps(_mm512_set1_ps(p0[p_row]), v0, c1);
        c2 = _mm512_fmadd_ps(_mm512_set1_ps(p0[2 * p_row]), v0, c2);
        c3 = _mm512_fmadd_ps(_mm512_set1_ps(p0[3 * p_row]), v0, c3);
        e0 = _mm512_fmadd_ps(_mm512_set1_ps(p1[0]), v1, e0);
        e1 = _mm512_fmadd_ps(_mm512_set1_ps(p1[p_row]), v1, e1);
        e2 = _mm512_fmadd_ps(_mm512_set1_ps(p1[2 * p_row]), v1, e2);
        e3 = _mm512_fmadd_ps(_mm512_set1_ps(p1[3 * p_row]), v1, e3);
    }
    if (j < nk) {
        const float *p0 = p + j * p_key;
        __m512 v0 = _mm512_maskz_loadu_ps(m, v + j * v_stride);
        c0 = _mm512_fmadd_ps(_mm512_set1_ps(p0[0]), v0, c0);
        c1 = _mm512_fmadd_ps(_mm512_set1_ps(p0[p_row]), v0, c1);
        c2 = _mm512_fmadd_ps(_mm512_set1_ps(p0[2 * p_row]), v0, c2);
        c3 = _mm512_fmadd_ps(_mm512_set1_ps(p0[3 * p_row]), v0, c3);
    }
    _mm512_mask_storeu_ps(acc, m, _mm512_add_ps(c0, e0));
    _mm512_mask_storeu_ps(acc + ld_acc, m, _mm512_add_ps(c1, e1));
    _mm512_mask_storeu_ps(acc + 2 * ld_acc, m, _mm512_add_ps(c2, e2));
    _mm512_mask_storeu_ps(acc + 3 * ld_acc, m, _mm512_add_ps(c3, e3));
}

/* One row (decode, and the rows left over): 64 columns, two keys per step for eight chains. */
ALWAYS_INLINE void pv_1x64_avx512(float *acc, const float *p, size_t p_key, const float *alpha,
                                  size_t nk, const float *v, size_t v_stride) {
    const __mmask16 all = 0xFFFF;
    __m512 c0 = pv_load_acc(acc, all, alpha), c1 = pv_load_acc(acc + W, all, alpha),
           c2 = pv_load_acc(acc + 2 * W, all, alpha), c3 = pv_load_acc(acc + 3 * W, all, alpha);
    __m512 e0 = _mm512_setzero_ps(), e1 = e0, e2 = e0, e3 = e0;
    size_t j = 0;
    for (; j + 2 <= nk; j += 2) {
        const float *v0 = v + j * v_stride, *v1 = v0 + v_stride;
        __m512 w0 = _mm512_set1_ps(p[j * p_key]), w1 = _mm512_set1_ps(p[(j + 1) * p_key]);
        c0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0), c0);
        c1 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0 + W), c1);
        c2 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0 + 2 * W), c2);
        c3 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0 + 3 * W), c3);
        e0 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(v1), e0);
        e1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(v1 + W), e1);
        e2 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(v1 + 2 * W), e2);
        e3 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(v1 + 3 * W), e3);
    }
    if (j < nk) {
        const float *v0 = v + j * v_stride;
        __m512 w0 = _mm512_set1_ps(p[j * p_key]);
        c0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0), c0);
        c1 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0 + W), c1);
        c2 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0 + 2 * W), c2);
        c3 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0 + 3 * W), c3);
    }
    _mm512_storeu_ps(acc, _mm512_add_ps(c0, e0));
    _mm512_storeu_ps(acc + W, _mm512_add_ps(c1, e1));
    _mm512_storeu_ps(acc + 2 * W, _mm512_add_ps(c2, e2));
    _mm512_storeu_ps(acc + 3 * W, _mm512_add_ps(c3, e3));
}

ALWAYS_INLINE void pv_1x16_avx512(float *acc, const float *p, size_t p_key, const float *alpha,
                                  size_t nk, const float *v, size_t v_stride, __mmask16 m) {
    __m512 c0 = pv_load_acc(acc, m, alpha), c1 = _mm512_setzero_ps(), c2 = c1, c3 = c1;
    size_t j = 0;
    for (; j + 4 <= nk; j += 4) {
        const float *v0 = v + j * v_stride, *p0 = p + j * p_key;
        c0 = _mm512_fmadd_ps(_mm512_set1_ps(p0[0]), _mm512_maskz_loadu_ps(m, v0), c0);
        c1 =
            _mm512_fmadd_ps(_mm512_set1_ps(p0[p_key]), _mm512_maskz_loadu_ps(m, v0 + v_stride), c1);
        c2 = _mm512_fmadd_ps(_mm512_set1_ps(p0[2 * p_key]),
                             _mm512_maskz_loadu_ps(m, v0 + 2 * v_stride), c2);
        c3 = _mm512_fmadd_ps(_mm512_set1_ps(p0[3 * p_key]),
                             _mm512_maskz_loadu_ps(m, v0 + 3 * v_stride), c3);
    }
    for (; j < nk; j++)
        c0 = _mm512_fmadd_ps(_mm512_set1_ps(p[j * p_key]),
                             _mm512_maskz_loadu_ps(m, v + j * v_stride), c0);
    _mm512_mask_storeu_ps(acc, m, _mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)));
}

/* A whole tile: rows of four, then the rows left over; 64 columns at a time, then 16. */
ALWAYS_INLINE void pv_tile_body(float *acc, size_t ld_acc, const float *p, size_t p_row,
                                size_t p_key, const float *alpha, size_t nq, size_t nk,
                                const float *v, size_t v_stride, size_t d_v) {
    size_t i = 0;
    for (; i + 4 <= nq; i += 4) {
        float *a = acc + i * ld_acc;
        const float *pi = p + i * p_row, *ai = alpha ? alpha + i : NULL;
        size_t c = 0;
        for (; c + 4 * W <= d_v; c += 4 * W)
            pv_4x64_avx512(a + c, ld_acc, pi, p_row, p_key, ai, nk, v + c, v_stride);
        for (; c < d_v; c += W) {
            __mmask16 m = d_v - c >= W ? (__mmask16)0xFFFF : tail_mask(d_v - c);
            pv_4x16_avx512(a + c, ld_acc, pi, p_row, p_key, ai, nk, v + c, v_stride, m);
        }
    }
    for (; i < nq; i++) {
        float *a = acc + i * ld_acc;
        const float *pi = p + i * p_row, *ai = alpha ? alpha + i : NULL;
        size_t c = 0;
        for (; c + 4 * W <= d_v; c += 4 * W)
            pv_1x64_avx512(a + c, pi, p_key, ai, nk, v + c, v_stride);
        for (; c < d_v; c += W) {
            __mmask16 m = d_v - c >= W ? (__mmask16)0xFFFF : tail_mask(d_v - c);
            pv_1x16_avx512(a + c, pi, p_key, ai, nk, v + c, v_stride, m);
        }
    }
}

static void pv_tile_avx512(float *acc, size_t ld_acc, const float *p, size_t ld_p, size_t nq,
                           size_t nk, const float *v, size_t v_stride, size_t d_v) {
    pv_tile_body(acc, ld_acc, p, ld_p, 1, NULL, nq, nk, v, v_stride, d_v);
}

/* exp of a whole tile of scores minus each row's shift, with the row sums: four vectors per
 * step so that the exp's dependency chains overlap. */
#define EXP_TILE_AVX512(NAME, EXP)                                                                 \
    static void NAME(float *s, size_t ld_s, size_t nq, size_t nk, const float *shift,              \
                     float *sums) {                                                                \
        const __m512 table = exp_table_avx512();                                                   \
        for (size_t i = 0; i < nq; i++) {                                                          \
            float *row = s + i * ld_s;                                                             \
            const __m512 vshift = _mm512_set1_ps(shift[i]);                                        \
            __m512 t0 = _mm512_setzero_ps(), t1 = t0, t2 = t0, t3 = t0;                            \
            size_t j = 0;                                                                          \
            for (; j + 4 * W <= nk; j += 4 * W) {                                                  \
                __m512 e0 = EXP(_mm512_sub_ps(_mm512_loadu_ps(row + j), vshift), table);           \
                __m512 e1 = EXP(_mm512_sub_ps(_mm512_loadu_ps(row + j + W), vshift), table);       \
                __m512 e2 = EXP(_mm512_sub_ps(_mm512_loadu_ps(row + j + 2 * W), vshift), table);   \
                __m512 e3 = EXP(_mm512_sub_ps(_mm512_loadu_ps(row + j + 3 * W), vshift), table);   \
                _mm512_storeu_ps(row + j, e0);                                                     \
                _mm512_storeu_ps(row + j + W, e1);                                                 \
                _mm512_storeu_ps(row + j + 2 * W, e2);                                             \
                _mm512_storeu_ps(row + j + 3 * W, e3);                                             \
                t0 = _mm512_add_ps(t0, e0), t1 = _mm512_add_ps(t1, e1);                            \
                t2 = _mm512_add_ps(t2, e2), t3 = _mm512_add_ps(t3, e3);                            \
            }                                                                                      \
            for (; j < nk; j += W) {                                                               \
                __mmask16 m = nk - j >= W ? (__mmask16)0xFFFF : tail_mask(nk - j);                 \
                __m512 e = EXP(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + j), vshift), table);   \
                _mm512_mask_storeu_ps(row + j, m, e);                                              \
                t0 = _mm512_mask_add_ps(t0, m, t0, e);                                             \
            }                                                                                      \
            sums[i] =                                                                              \
                _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(t0, t1), _mm512_add_ps(t2, t3))); \
        }                                                                                          \
    }
/* a tile's arguments are <= 0 (scores minus their row's max): the light exp of exp_sum */
static inline __m512 exp_tile_fast_arg(__m512 x, __m512 table) {
    return exp_fast_avx512(x, table, 0);
}
static inline __m512 exp_tile_sleef_arg(__m512 x, __m512 table) {
    return exp_sleef_avx512(x, table, 0);
}
EXP_TILE_AVX512(exp_tile_fast_avx512, exp_tile_fast_arg)
EXP_TILE_AVX512(exp_tile_sleef_avx512, exp_tile_sleef_arg)

/* In-register transpose of 16 rows of 16 floats: three rounds of unpack and lane shuffles. */
ALWAYS_INLINE void transpose16_avx512(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* u[4g + m], 128-bit chunk c: rows 4g..4g+3 of column 4c + m */
    for (int g = 0; g < 4; g++) {
        __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 1]);
        __m512d c = _mm512_castps_pd(t[4 * g + 2]), e = _mm512_castps_pd(t[4 * g + 3]);
        u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, e));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, e));
    }
    for (int m = 0; m < 4; m++) {
        __m512 a = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x88);
        __m512 b = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xDD);
        __m512 c = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x88);
        __m512 e = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xDD);
        r[m] = _mm512_shuffle_f32x4(a, c, 0x88);
        r[8 + m] = _mm512_shuffle_f32x4(a, c, 0xDD);
        r[4 + m] = _mm512_shuffle_f32x4(b, e, 0x88);
        r[12 + m] = _mm512_shuffle_f32x4(b, e, 0xDD);
    }
}

/* qt[p][i] = q[i][p], padded with zero queries up to SDPA_ATTN_MAX_BLOCK_Q: 16 x 16 blocks
 * through the register transpose (masked loads for the d tail and the missing rows). */
static void pack_q_avx512(float *qt, const float *q, size_t q_stride, size_t nq, size_t d) {
    const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;
    for (size_t p0 = 0; p0 < d; p0 += W) {
        const size_t np = d - p0 < W ? d - p0 : W;
        const __mmask16 m = np == W ? (__mmask16)0xFFFF : tail_mask(np);
        for (size_t i0 = 0; i0 < ld; i0 += W) {
            __m512 r[16];
            for (size_t t = 0; t < W; t++)
                r[t] = i0 + t < nq ? _mm512_maskz_loadu_ps(m, q + (i0 + t) * q_stride + p0)
                                   : _mm512_setzero_ps();
            transpose16_avx512(r);
            for (size_t t = 0; t < np; t++) _mm512_storeu_ps(qt + (p0 + t) * ld + i0, r[t]);
        }
    }
}

/* One step of 8 keys x 32 queries: 2 loads of qt and 8 broadcasts of k feed 16 FMAs. */
#define PACKED_8X32_STEP(R)                                                                        \
    do {                                                                                           \
        __m512 w = _mm512_set1_ps(k[(R)*k_stride + p]);                                            \
        a##R##0 = _mm512_fmadd_ps(w, q0, a##R##0);                                                 \
        a##R##1 = _mm512_fmadd_ps(w, q1, a##R##1);                                                 \
    } while (0)

/* Key R's two vectors of scores, scaled as they leave the registers. */
#define PACKED_8X32_STORE(R)                                                                       \
    do {                                                                                           \
        _mm512_storeu_ps(st + (R)*ld, _mm512_mul_ps(a##R##0, vscale));                             \
        _mm512_storeu_ps(st + (R)*ld + W, _mm512_mul_ps(a##R##1, vscale));                         \
    } while (0)

/* st[j][i] = scale * sum_p k[j][p] * qt[p][i] for 8 keys and 32 queries */
static inline void packed_8x32_avx512(float *st, const float *qt, const float *k, size_t k_stride,
                                      size_t d, __m512 vscale) {
    const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,
           a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00, a60 = a00, a61 = a00,
           a70 = a00, a71 = a00;
    for (size_t p = 0; p < d; p++) {
        __m512 q0 = _mm512_loadu_ps(qt + p * ld), q1 = _mm512_loadu_ps(qt + p * ld + W);
        PACKED_8X32_STEP(0);
        PACKED_8X32_STEP(1);
        PACKED_8X32_STEP(2);
        PACKED_8X32_STEP(3);
        PACKED_8X32_STEP(4);
        PACKED_8X32_STEP(5);
        PACKED_8X32_STEP(6);
        PACKED_8X32_STEP(7);
    }
    PACKED_8X32_STORE(0);
    PACKED_8X32_STORE(1);
    PACKED_8X32_STORE(2);
    PACKED_8X32_STORE(3);
    PACKED_8X32_STORE(4);
    PACKED_8X32_STORE(5);
    PACKED_8X32_STORE(6);
    PACKED_8X32_STORE(7);
}

/* st[key][query] = scale * sum_p k[key][p] qt[p][query] for nk keys and all
 * SDPA_ATTN_MAX_BLOCK_Q (zero-padded) queries: broadcasts of k, vector loads of qt, no horizontal
 * sums. The scale multiplies the finished dots, as in scores_tile: scaling q first could
 * overflow or underflow where the dot does not. */
static void scores_keymajor_avx512(float *st, const float *qt, const float *k, size_t k_stride,
                                   size_t nk, size_t d, float scale) {
    const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;
    const __m512 vscale = _mm512_set1_ps(scale);
    size_t j = 0;
    for (; j + 8 <= nk; j += 8)
        packed_8x32_avx512(st + j * ld, qt, k + j * k_stride, k_stride, d, vscale);
    for (; j < nk; j++) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0;
        const float *kj = k + j * k_stride;
        for (size_t p = 0; p < d; p++) {
            __m512 w = _mm512_set1_ps(kj[p]);
            a0 = _mm512_fmadd_ps(w, _mm512_loadu_ps(qt + p * ld), a0);
            a1 = _mm512_fmadd_ps(w, _mm512_loadu_ps(qt + p * ld + W), a1);
        }
        _mm512_storeu_ps(st + j * ld, _mm512_mul_ps(a0, vscale));
        _mm512_storeu_ps(st + j * ld + W, _mm512_mul_ps(a1, vscale));
    }
}

/* The scores tile from the packed queries: the key-major tile, then 16 x 16 in-register
 * transposes into s[query][key]. */
static void scores_packed_avx512(float *s, size_t ld_s, const float *qt, size_t nq, const float *k,
                                 size_t k_stride, size_t nk, size_t d, float scale) {
    const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;
    float st[SDPA_ATTN_MAX_BLOCK_KV * SDPA_ATTN_MAX_BLOCK_Q];
    scores_keymajor_avx512(st, qt, k, k_stride, nk, d, scale);
    for (size_t j0 = 0; j0 < nk; j0 += W) {
        const size_t nj = nk - j0 < W ? nk - j0 : W;
        const __mmask16 m = nj == W ? (__mmask16)0xFFFF : tail_mask(nj);
        for (size_t i0 = 0; i0 < nq; i0 += W) {
            __m512 r[16];
            for (size_t t = 0; t < W; t++)
                r[t] = t < nj ? _mm512_loadu_ps(st + (j0 + t) * ld + i0) : _mm512_setzero_ps();
            transpose16_avx512(r);
            for (size_t t = 0; t < W && i0 + t < nq; t++)
                _mm512_mask_storeu_ps(s + (i0 + t) * ld_s + j0, m, r[t]);
        }
    }
}

/* The online softmax's step for a whole tile, in two halves around the driver's bookkeeping
 * (kernels.h, scores_max and exp_pv). The scores stay key-major, as the packed GEMM leaves them,
 * so the row maxima, the exps and the row sums are vector operations across 16 queries at a
 * time (no transposes, no horizontal sums, no call per row), and the P V step reads the weights
 * in that layout and rescales each accumulator row as it loads it. */
static void scores_max_avx512(float *st, float *tile_max, const float *qt, size_t nq,
                              const float *k, size_t k_stride, size_t nk, size_t d_k, float scale) {
    const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    scores_keymajor_avx512(st, qt, k, k_stride, nk, d_k, scale);
    for (size_t h = 0; h * W < nq; h++) {
        __m512 mx0 = ninf, mx1 = ninf;
        size_t j = 0;
        for (; j + 2 <= nk; j += 2) {
            mx0 = _mm512_max_ps(_mm512_load_ps(st + j * ld + h * W), mx0);
            mx1 = _mm512_max_ps(_mm512_load_ps(st + (j + 1) * ld + h * W), mx1);
        }
        if (j < nk) mx0 = _mm512_max_ps(_mm512_load_ps(st + j * ld + h * W), mx0);
        _mm512_storeu_ps(tile_max + h * W, _mm512_max_ps(mx0, mx1));
    }
}

#define EXP_PV_AVX512(NAME, EXP)                                                                   \
    static void NAME(float *acc, size_t ld_acc, float *st, const float *m, const float *m_new,     \
                     float *alpha, float *sums, size_t nq, size_t nk, const float *v,              \
                     size_t v_stride, size_t d_v) {                                                \
        const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;                                                   \
        const __m512 table = exp_table_avx512();                                                   \
        for (size_t h = 0; h * W < nq; h++) {                                                      \
            const __mmask16 valid = nq - h * W >= W ? (__mmask16)0xFFFF : tail_mask(nq - h * W);   \
            /* rows past nq (zero queries, scores 0): shift 0, alpha exp(-inf) = 0, both unused */ \
            const __m512 mx = _mm512_maskz_loadu_ps(valid, m_new + h * W);                         \
            const __m512 old = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), valid, m + h * W);  \
            /* exp(0) is exactly 1: a row whose max did not move is not rescaled at all */         \
            _mm512_storeu_ps(alpha + h * W, EXP(_mm512_sub_ps(old, mx), table, 0));                \
            __m512 s0 = _mm512_setzero_ps(), s1 = s0;                                              \
            size_t j = 0;                                                                          \
            for (; j + 2 <= nk; j += 2) {                                                          \
                float *p0 = st + j * ld + h * W, *p1 = p0 + ld;                                    \
                __m512 e0 = EXP(_mm512_sub_ps(_mm512_load_ps(p0), mx), table, 0);                  \
                __m512 e1 = EXP(_mm512_sub_ps(_mm512_load_ps(p1), mx), table, 0);                  \
                _mm512_store_ps(p0, e0), _mm512_store_ps(p1, e1);                                  \
                s0 = _mm512_add_ps(s0, e0), s1 = _mm512_add_ps(s1, e1);                            \
            }                                                                                      \
            if (j < nk) {                                                                          \
                float *p0 = st + j * ld + h * W;                                                   \
                __m512 e0 = EXP(_mm512_sub_ps(_mm512_load_ps(p0), mx), table, 0);                  \
                _mm512_store_ps(p0, e0);                                                           \
                s0 = _mm512_add_ps(s0, e0);                                                        \
            }                                                                                      \
            _mm512_storeu_ps(sums + h * W, _mm512_add_ps(s0, s1));                                 \
        }                                                                                          \
        pv_tile_body(acc, ld_acc, st, 1, ld, alpha, nq, nk, v, v_stride, d_v);                     \
    }
EXP_PV_AVX512(exp_pv_fast_avx512, exp_fast_avx512)
EXP_PV_AVX512(exp_pv_sleef_avx512, exp_sleef_avx512)

static const sdpa_attention_kernels attention_avx512 = {
    .block_q = 32,
    .block_kv = 64,
    .scores_tile = scores_tile_avx512,
    .pv_tile = pv_tile_avx512,
    .exp_tile = {exp_tile_fast_avx512, exp_tile_sleef_avx512},
    .pack_q = pack_q_avx512,
    .scores_packed = scores_packed_avx512,
    .scores_max = scores_max_avx512,
    .exp_pv = {exp_pv_fast_avx512, exp_pv_sleef_avx512},
};

const sdpa_kernels sdpa_kernels_avx512 = {
    .name = SDPA_BACKEND_NAME,
    .dot = dot_avx512,
    .dot_to = dot_avx512_to,
    .scale = scale_avx512,
    .max_scaled = max_scaled_avx512,
    .exp_sum = {exp_sum_fast_avx512, exp_sum_sleef_avx512},
    .exp_sum_block = 4096,
    .exp_sum_max = {exp_sum_fast_avx512_max, exp_sum_sleef_avx512_max},
    .normalize = normalize_avx512,
    .softmax_backward = softmax_backward_avx512,
    .softmax_short = {softmax_short_fast_avx512, softmax_short_sleef_avx512_entry},
    .exp = {exp_fast_array_avx512, exp_sleef_array_avx512},
    .attention = &attention_avx512,
};
