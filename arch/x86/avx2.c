/* AVX2 + FMA backend: 8 floats a vector; tails use vmaskmovps, whose masked-off lanes are
 * neither read nor written (no fault past the end of an array). */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <sleef.h>
#include <stdint.h>

#include "kernels.h"

#define W 8

/* lanes [0, remaining) set, for remaining <= W (W sets them all) */
static inline __m256i tail_mask(size_t remaining) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)remaining),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static float dot_avx2(const float *a, const float *b, size_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
           acc3 = _mm256_setzero_ps(), acc4 = _mm256_setzero_ps(), acc5 = _mm256_setzero_ps(),
           acc6 = _mm256_setzero_ps(), acc7 = _mm256_setzero_ps();
    size_t i = 0;
    if (n >= 8 * W) {
        /* A load that straddles two cache lines costs two of the load ports' slots: a masked
           head brings a to a 32-byte boundary (no 32-byte load then crosses a line), and b with
           it when they are misaligned alike (buffers from malloc, in place). */
        size_t lead = (32 - ((uintptr_t)a & 31)) % 32 / sizeof(float);
        if (lead) {
            __m256i m = tail_mask(lead);
            acc1 = _mm256_mul_ps(_mm256_maskload_ps(a, m), _mm256_maskload_ps(b, m));
            a += lead, b += lead, n -= lead;
        }
    }
    for (; i + 8 * W <= n; i += 8 * W) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + W), _mm256_loadu_ps(b + i + W), acc1);
        acc2 =
            _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 2 * W), _mm256_loadu_ps(b + i + 2 * W), acc2);
        acc3 =
            _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 3 * W), _mm256_loadu_ps(b + i + 3 * W), acc3);
        acc4 =
            _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 4 * W), _mm256_loadu_ps(b + i + 4 * W), acc4);
        acc5 =
            _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 5 * W), _mm256_loadu_ps(b + i + 5 * W), acc5);
        acc6 =
            _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 6 * W), _mm256_loadu_ps(b + i + 6 * W), acc6);
        acc7 =
            _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 7 * W), _mm256_loadu_ps(b + i + 7 * W), acc7);
    }
    for (; i + W <= n; i += W)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    if (i < n) {
        __m256i m = tail_mask(n - i);
        acc1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), acc1);
    }
    acc0 = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
    acc4 = _mm256_add_ps(_mm256_add_ps(acc4, acc5), _mm256_add_ps(acc6, acc7));
    return hsum(_mm256_add_ps(acc0, acc4));
}
SDPA_DOT_TO(dot_avx2)

static void scale_avx2(float *y, const float *x, size_t n, float alpha) {
    const __m256 va = _mm256_set1_ps(alpha);
    size_t i = 0;
    for (; i + 4 * W <= n; i += 4 * W) {
        __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + W);
        __m256 x2 = _mm256_loadu_ps(x + i + 2 * W), x3 = _mm256_loadu_ps(x + i + 3 * W);
        _mm256_storeu_ps(y + i, _mm256_mul_ps(va, x0));
        _mm256_storeu_ps(y + i + W, _mm256_mul_ps(va, x1));
        _mm256_storeu_ps(y + i + 2 * W, _mm256_mul_ps(va, x2));
        _mm256_storeu_ps(y + i + 3 * W, _mm256_mul_ps(va, x3));
    }
    for (; i + W <= n; i += W) _mm256_storeu_ps(y + i, _mm256_mul_ps(va, _mm256_loadu_ps(x + i)));
    if (i < n) {
        __m256i m = tail_mask(n - i);
        _mm256_maskstore_ps(y + i, m, _mm256_mul_ps(va, _mm256_maskload_ps(x + i, m)));
    }
}

static float max_scaled_avx2(const float *x, size_t n, float scale) {
    const __m256 vs = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
    __m256 m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
    size_t i = 0;
    for (; i + 4 * W <= n; i += 4 * W) {
        m0 = _mm256_max_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(x + i)), m0);
        m1 = _mm256_max_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(x + i + W)), m1);
        m2 = _mm256_max_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(x + i + 2 * W)), m2);
        m3 = _mm256_max_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(x + i + 3 * W)), m3);
    }
    for (; i + W <= n; i += W) m0 = _mm256_max_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(x + i)), m0);
    if (i < n) {
        __m256i m = tail_mask(n - i);
        __m256 z = _mm256_mul_ps(vs, _mm256_maskload_ps(x + i, m));
        m1 = _mm256_max_ps(_mm256_blendv_ps(ninf, z, _mm256_castsi256_ps(m)), m1);
    }
    return hmax(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
}

/* The table of the "fast" exp (kernels.h), 2^(j/8) for lane j, with j << 20 taken off its bits:
 * adding N << 20 then adds (N div 8) << 23, 2^(N div 8) in the exponent, and puts j << 20 back
 * for j = N mod 8, the lane vpermps picks with N's low bits. */
static const float EXP2_EIGHTHS[8] = {SDPA_EXP2_EIGHTHS};
static inline __m256 exp_table_avx2(void) {
    return _mm256_castsi256_ps(
        _mm256_sub_epi32(_mm256_castps_si256(_mm256_loadu_ps(EXP2_EIGHTHS)),
                         _mm256_slli_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), 20)));
}

/* The shared "fast" exp (kernels.h). full = 0, for exp_sum, whose arguments are <= 0
 * (kernels.h): no upper clamp, and results below FLT_MIN are left below it for normalize's
 * flush. full = 1, the exp entry: the whole float range, where 2^(N div 8) can reach 2^128:
 * positive x take one power of two off T and multiply it back at the end (to +inf on overflow),
 * and subnormal results become 0. max/min return their second operand when either is NaN, so
 * NaN passes the clamps (and becomes INT_MIN in N, an index like any other). N is rounded with
 * an explicit mode: the caller's MXCSR must not move it (tests/test_fpenv.c); it is integral,
 * so the conversion is exact in any mode. */
static inline __m256 exp_fast_avx2(__m256 x, __m256 table, int full) {
    x = _mm256_max_ps(_mm256_set1_ps(SDPA_EXP_X_CLAMP_LO), x);
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
    /* T p(r), so that nothing underflows before the last multiply (kernels.h) */
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(SDPA_EXP8_C3), r, _mm256_set1_ps(SDPA_EXP8_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(tbits));
    if (!full) return e;
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
 * (kernels.h, "A row's shift"): N = round(z 8 / ln2) and r = z - N ln2 / 8 come from z itself,
 * never from z - shift (one operation fewer, and no rounding of the difference), and the table
 * takes Mi off: its entry j holds 2^((j - Mi) / 8) with j << 20 taken off, so that N's low bits
 * pick entry N mod 8 and N << 20 adds the rest, 2^((N - Mi) / 8) in all (exact modulo 2^32, and
 * the result's exponent is in range because N - Mi >= -1016 after the clamp). e^(M' - shift)
 * scales the cubic's coefficients. `folded` = 0 is the plain form, for shifts beyond 2^16 and
 * for SLEEF's exp. */
typedef struct row_exp {
    __m256 table, shift, lo, c0, c2, c3;
} row_exp;

/* the fold at the integer mi (round(shift 8 / ln2) in row_exp_fast) */
static inline __attribute__((always_inline)) row_exp row_exp_at(float shift, float mi, int folded,
                                                                int exact) {
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
    c.lo = _mm256_set1_ps(folded ? shift + SDPA_EXP_X_CLAMP_LO : SDPA_EXP_X_CLAMP_LO);
    c.c0 = _mm256_set1_ps((float)e);
    c.c2 = _mm256_set1_ps((float)(e * SDPA_EXP8_C2));
    c.c3 = _mm256_set1_ps((float)(e * SDPA_EXP8_C3));
    return c;
}
static inline __attribute__((always_inline)) row_exp row_exp_fast(float shift, int folded,
                                                                  int exact) {
    return row_exp_at(shift, folded ? rintf(shift * SDPA_EXP8_SCALE) : 0.0f, folded, exact);
}
/* softmax_short's guessed shift g (kernels.h, "A guessed shift"), folded as k ln2 for
 * k = floor(g / ln2): the weights carry the factor 2^-k exactly, which the normalisation takes out
 * exactly (tests/test_exp.c reads them in ULP); the clamp stays at g - 87.5 */
static inline __attribute__((always_inline)) row_exp row_exp_guess(float g) {
    return row_exp_at(g, 8.0f * floorf(g * 0x1.715476p+0f), 1, 0);
}
static inline __attribute__((always_inline)) row_exp row_exp_sleef_guess(float g) {
    return row_exp_fast(g, 0, 0);
}

/* exp_fast_avx2 (full = 0) with c's table, clamp and polynomial. `magic`: N rounded by adding
 * 1.5 * 2^23 in the FMA that scales z (N then sits in its low bits), where exp_fast_avx2 takes a
 * multiply, roundps and cvtps2dq: one operation fewer, in a loop bound by its operation count. That
 * FMA rounds as MXCSR says, so its callers run it only when the caller rounds to nearest
 * (rounds_to_nearest): a directed mode would take r to ln2 / 8, twice the cubic's interval, and
 * the exp to about 20 ULP (tests/test_exp.c, sum_fast_directed). */
static inline __attribute__((always_inline)) __m256 exp_row(__m256 z, const row_exp *c, int magic) {
    z = _mm256_max_ps(c->lo, z);
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
static inline __attribute__((always_inline)) __m256 exp_row_fast(__m256 z, const row_exp *c) {
    return exp_row(z, c, 0);
}
static inline __attribute__((always_inline)) __m256 exp_row_magic(__m256 z, const row_exp *c) {
    return exp_row(z, c, 1);
}

static inline __attribute__((always_inline)) __m256 exp_row_sleef(__m256 z, const row_exp *c) {
    (void)c;
    return Sleef_expf8_u10avx2(z);
}

/* z = scale * x is rounded before the shift is subtracted, as sdpa.h defines z (no fused
 * multiply-subtract): a fused one gets exp of its product's rounding error, inf or 0 once
 * |z| > ~1e9, and a NaN row (tests/test_regressions.c). With scale 1 z = x and the multiply is
 * skipped. One body for both exp kinds; the exp is inlined. Four independent exps per iteration
 * keep both FMA pipes busy through the exp's dependency chain. */
#define EXP_SUM_LANES_AVX2(NAME, EXP)                                                              \
    /* the loop itself, the lane sums left unreduced (softmax_short reduces them in registers);    \
       with vmax (not NULL), also the lane maxima of z (exp_sum_max) */                            \
    static inline __attribute__((always_inline))                                                   \
    __m256 NAME##_lanes(float *y, const float *x, size_t n, float scale, const row_exp *c,         \
                        int unit, int folded, __m256 *vmax) {                                      \
        const __m256 vs = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);                 \
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(),       \
               s3 = _mm256_setzero_ps(), m0 = ninf, m1 = ninf;                                     \
        size_t i = 0;                                                                              \
        for (; i + 4 * W <= n; i += 4 * W) {                                                       \
            __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + W);                   \
            __m256 x2 = _mm256_loadu_ps(x + i + 2 * W), x3 = _mm256_loadu_ps(x + i + 3 * W);       \
            if (!unit) {                                                                           \
                x0 = _mm256_mul_ps(x0, vs), x1 = _mm256_mul_ps(x1, vs);                            \
                x2 = _mm256_mul_ps(x2, vs), x3 = _mm256_mul_ps(x3, vs);                            \
            }                                                                                      \
            if (vmax) {                                                                            \
                m0 = _mm256_max_ps(_mm256_max_ps(x0, x2), m0);                                     \
                m1 = _mm256_max_ps(_mm256_max_ps(x1, x3), m1);                                     \
            }                                                                                      \
            if (!folded) {                                                                         \
                x0 = _mm256_sub_ps(x0, c->shift), x1 = _mm256_sub_ps(x1, c->shift);                \
                x2 = _mm256_sub_ps(x2, c->shift), x3 = _mm256_sub_ps(x3, c->shift);                \
            }                                                                                      \
            __m256 e0 = EXP(x0, c), e1 = EXP(x1, c), e2 = EXP(x2, c), e3 = EXP(x3, c);             \
            _mm256_storeu_ps(y + i, e0);                                                           \
            _mm256_storeu_ps(y + i + W, e1);                                                       \
            _mm256_storeu_ps(y + i + 2 * W, e2);                                                   \
            _mm256_storeu_ps(y + i + 3 * W, e3);                                                   \
            s0 = _mm256_add_ps(s0, e0);                                                            \
            s1 = _mm256_add_ps(s1, e1);                                                            \
            s2 = _mm256_add_ps(s2, e2);                                                            \
            s3 = _mm256_add_ps(s3, e3);                                                            \
        }                                                                                          \
        for (; i < n; i += W) {                                                                    \
            __m256i m = tail_mask(n - i < W ? n - i : W);                                          \
            __m256 xi = _mm256_maskload_ps(x + i, m);                                              \
            if (!unit) xi = _mm256_mul_ps(xi, vs);                                                 \
            if (vmax) m0 = _mm256_max_ps(_mm256_blendv_ps(ninf, xi, _mm256_castsi256_ps(m)), m0);  \
            if (!folded) xi = _mm256_sub_ps(xi, c->shift);                                         \
            __m256 e = EXP(xi, c);                                                                 \
            _mm256_maskstore_ps(y + i, m, e);                                                      \
            s0 = _mm256_add_ps(s0, _mm256_and_ps(e, _mm256_castsi256_ps(m)));                      \
        }                                                                                          \
        if (vmax) *vmax = _mm256_max_ps(m0, m1);                                                   \
        return _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));                        \
    }
#define EXP_SUM_AVX2(NAME, EXP, FOLDS)                                                             \
    EXP_SUM_LANES_AVX2(NAME, EXP)                                                                  \
    static inline __attribute__((always_inline)) float NAME##_inline(                              \
        float *y, const float *x, size_t n, float scale, float shift, __m256 *vmax) {              \
        const int folded = FOLDS && fabsf(shift) <= SDPA_EXP_FOLD_MAX;                             \
        const row_exp c = row_exp_fast(shift, folded, 1);                                          \
        __m256 s;                                                                                  \
        if (folded)                                                                                \
            s = scale == 1.0f ? NAME##_lanes(y, x, n, 1.0f, &c, 1, 1, vmax)                        \
                              : NAME##_lanes(y, x, n, scale, &c, 0, 1, vmax);                      \
        else                                                                                       \
            s = scale == 1.0f ? NAME##_lanes(y, x, n, 1.0f, &c, 1, 0, vmax)                        \
                              : NAME##_lanes(y, x, n, scale, &c, 0, 0, vmax);                      \
        return hsum(s);                                                                            \
    }                                                                                              \
    static float NAME(float *y, const float *x, size_t n, float scale, float shift) {              \
        return NAME##_inline(y, x, n, scale, shift, NULL);                                         \
    }                                                                                              \
    static float NAME##_max(float *y, const float *x, size_t n, float scale, float shift,          \
                            float *max) {                                                          \
        __m256 vmax;                                                                               \
        const float sum = NAME##_inline(y, x, n, scale, shift, &vmax);                             \
        *max = hmax(vmax);                                                                         \
        return sum;                                                                                \
    }
/* The entries that reach exp_row_magic take it only when MXCSR's RC bits say round-to-nearest;
 * in a directed mode they take roundps, and every operation keeps the caller's mode. Switching
 * to round-to-nearest for the call instead would round z = scale * x in another mode than
 * max_scaled did for the shift the driver passes: a z one ULP above that max (exp gives +inf, the
 * row NaN), or a z that overflows where the caller's mode stops at FLT_MAX (tests/test_fpenv.c). */
#define MXCSR_RC 0x6000u
static inline int rounds_to_nearest(void) { return !(_mm_getcsr() & MXCSR_RC); }
/* Reading MXCSR waits for the floating-point work before it (its flags), which costs a short row
 * its overlap with the call before, more than the operation saved: rows shorter than this keep
 * roundps and read nothing. */
#define SHORT_MAGIC_FROM 256

EXP_SUM_AVX2(exp_sum_roundps_avx2, exp_row_fast, 1)
EXP_SUM_AVX2(exp_sum_nearest_avx2, exp_row_magic, 1)
EXP_SUM_AVX2(exp_sum_sleef_avx2, exp_row_sleef, 0)
static float exp_sum_fast_avx2(float *y, const float *x, size_t n, float scale, float shift) {
    return rounds_to_nearest() ? exp_sum_nearest_avx2(y, x, n, scale, shift)
                               : exp_sum_roundps_avx2(y, x, n, scale, shift);
}
static float exp_sum_fast_avx2_max(float *y, const float *x, size_t n, float scale, float shift,
                                   float *max) {
    return rounds_to_nearest() ? exp_sum_nearest_avx2_max(y, x, n, scale, shift, max)
                               : exp_sum_roundps_avx2_max(y, x, n, scale, shift, max);
}

#define EXP_ARRAY_AVX2(NAME, EXP)                                                                  \
    static void NAME(float *y, const float *x, size_t n) {                                         \
        const __m256 table = exp_table_avx2();                                                     \
        for (size_t i = 0; i < n; i += W) {                                                        \
            __m256i m = tail_mask(n - i < W ? n - i : W);                                          \
            _mm256_maskstore_ps(y + i, m, EXP(_mm256_maskload_ps(x + i, m), table, 1));            \
        }                                                                                          \
    }
EXP_ARRAY_AVX2(exp_fast_array_avx2, exp_fast_avx2)
EXP_ARRAY_AVX2(exp_sleef_array_avx2, exp_sleef_avx2)

static inline __m256 flush_below_min(__m256 w) {
    return _mm256_andnot_ps(_mm256_cmp_ps(w, _mm256_set1_ps(FLT_MIN), _CMP_LT_OQ), w);
}

static inline __attribute__((always_inline)) void normalize_avx2_inline(float *y, size_t n,
                                                                        __m256 vf) {
    size_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
        _mm256_storeu_ps(y + i, flush_below_min(_mm256_mul_ps(_mm256_loadu_ps(y + i), vf)));
        _mm256_storeu_ps(y + i + W, flush_below_min(_mm256_mul_ps(_mm256_loadu_ps(y + i + W), vf)));
    }
    for (; i < n; i += W) {
        __m256i m = tail_mask(n - i < W ? n - i : W);
        _mm256_maskstore_ps(y + i, m,
                            flush_below_min(_mm256_mul_ps(_mm256_maskload_ps(y + i, m), vf)));
    }
}

static void normalize_avx2(float *y, size_t n, float factor) {
    normalize_avx2_inline(y, n, _mm256_set1_ps(factor));
}

/* lane-wise max and sum of all 8 lanes, in every lane, without a trip through a scalar register */
static inline __attribute__((always_inline)) __m256 allmax_avx2(__m256 v) {
    v = _mm256_max_ps(v, _mm256_permute2f128_ps(v, v, 1));
    v = _mm256_max_ps(v, _mm256_permute_ps(v, 0x4E));
    return _mm256_max_ps(v, _mm256_permute_ps(v, 0xB1));
}
static inline __attribute__((always_inline)) __m256 allsum_avx2(__m256 v) {
    v = _mm256_add_ps(v, _mm256_permute2f128_ps(v, v, 1));
    v = _mm256_add_ps(v, _mm256_permute_ps(v, 0x4E));
    return _mm256_add_ps(v, _mm256_permute_ps(v, 0xB1));
}

/* The factor 1 / sum for a row's weights e * factor, from its sum in every lane, such that no
 * weight exceeds 1 whatever the caller's rounding mode: -1 / sum, negated, is rounded the
 * mirror way of the mode (down where it rounds up, and up where it rounds down, where the
 * weight's own rounding then takes e * factor < 1 + 2^-23 down to at most 1), so e <= sum gives
 * weights <= 1; under round-to-nearest it is 1 / sum. One operation a row, where a min with 1
 * would take one a vector. */
static inline __attribute__((always_inline)) __m256 row_factor_avx2(__m256 sum) {
    __m256 q = _mm256_div_ps(_mm256_set1_ps(-1.0f), sum);
    /* opaque: the compiler assumes round-to-nearest, and would fold -(-1 / sum) to 1 / sum */
    __asm__("" : "+x"(q));
    return _mm256_xor_ps(q, _mm256_set1_ps(-0.0f));
}
/* 1 / sum itself, for rows run only under round-to-nearest, where e * fl(1 / sum) <= 1 + 2^-24
 * rounds to at most 1 without the negations (which cost rows of 300 floats measurably more than
 * their one operation) */
static inline __attribute__((always_inline)) __m256 nearest_factor_avx2(__m256 sum) {
    return _mm256_div_ps(_mm256_set1_ps(1.0f), sum);
}

/* A row of up to 4096 floats in one call (kernels.h, softmax_short), as on avx512: the three
 * passes without calls between them, the reductions in registers, 1 / sum in float (32 partial
 * sums of at most 128 weights each, fewer than the scalar backend's 512-float blocks add per
 * lane), and the exp's shift folded without the factor it leaves, which the division by the sum
 * takes out. */
#define SOFTMAX_SHORT_AVX2(NAME, EXP_SUM_LANES, GUESS_EXP, FOLDS, FACTOR)                          \
    static inline __attribute__((always_inline)) float NAME##_body(                                \
        float *y, const float *x, size_t n, float scale, int unit) {                               \
        const __m256 vs = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);                 \
        /* first against a guessed shift (kernels.h), when x survives y's writes: the max comes    \
           with the exps, and a row that fails the check starts again below */                     \
        const float g = sdpa_ends_guess(x, n, scale);                                              \
        if (sdpa_apart(y, x, n) && sdpa_guess_usable(g)) {                                         \
            const row_exp c = GUESS_EXP(g);                                                        \
            __m256 vmax;                                                                           \
            const __m256 sum = allsum_avx2(EXP_SUM_LANES(y, x, n, scale, &c, unit, FOLDS, &vmax)); \
            normalize_avx2_inline(y, n, FACTOR(sum));                                              \
            const float max = hmax(vmax);                                                          \
            if (sdpa_guess_fits(g, max)) return max;                                               \
        }                                                                                          \
        __m256 m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;                                         \
        size_t i = 0;                                                                              \
        for (; i + 4 * W <= n; i += 4 * W) {                                                       \
            __m256 z0 = _mm256_loadu_ps(x + i), z1 = _mm256_loadu_ps(x + i + W);                   \
            __m256 z2 = _mm256_loadu_ps(x + i + 2 * W), z3 = _mm256_loadu_ps(x + i + 3 * W);       \
            if (!unit) z0 = _mm256_mul_ps(z0, vs), z1 = _mm256_mul_ps(z1, vs);                     \
            if (!unit) z2 = _mm256_mul_ps(z2, vs), z3 = _mm256_mul_ps(z3, vs);                     \
            m0 = _mm256_max_ps(z0, m0), m1 = _mm256_max_ps(z1, m1);                                \
            m2 = _mm256_max_ps(z2, m2), m3 = _mm256_max_ps(z3, m3);                                \
        }                                                                                          \
        for (; i < n; i += W) {                                                                    \
            __m256i m = tail_mask(n - i < W ? n - i : W);                                          \
            __m256 z = _mm256_maskload_ps(x + i, m);                                               \
            if (!unit) z = _mm256_mul_ps(z, vs);                                                   \
            m0 = _mm256_max_ps(_mm256_blendv_ps(ninf, z, _mm256_castsi256_ps(m)), m0);             \
        }                                                                                          \
        const __m256 vmax =                                                                        \
            allmax_avx2(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));              \
        const float max = _mm256_cvtss_f32(vmax);                                                  \
        if (!isfinite(max)) return max;                                                            \
        /* the sum is > 0.9 (the max gives about exp(0)), or NaN when x holds a NaN: so is y */    \
        const int folded = FOLDS && fabsf(max) <= SDPA_EXP_FOLD_MAX;                               \
        const row_exp c = row_exp_fast(max, folded, 0);                                            \
        const __m256 sum = allsum_avx2(folded ? EXP_SUM_LANES(y, x, n, scale, &c, unit, 1, NULL)   \
                                              : EXP_SUM_LANES(y, x, n, scale, &c, unit, 0, NULL)); \
        normalize_avx2_inline(y, n, FACTOR(sum));                                                  \
        return max;                                                                                \
    }                                                                                              \
    static float NAME(float *y, const float *x, size_t n, float scale) {                           \
        return scale == 1.0f ? NAME##_body(y, x, n, 1.0f, 1) : NAME##_body(y, x, n, scale, 0);     \
    }
SOFTMAX_SHORT_AVX2(softmax_short_passes_fast_avx2, exp_sum_roundps_avx2_lanes, row_exp_guess, 1,
                   row_factor_avx2)
SOFTMAX_SHORT_AVX2(softmax_short_passes_nearest_avx2, exp_sum_nearest_avx2_lanes, row_exp_guess, 1,
                   nearest_factor_avx2)
SOFTMAX_SHORT_AVX2(softmax_short_sleef_avx2, exp_sum_sleef_avx2_lanes, row_exp_sleef_guess, 0,
                   row_factor_avx2)

/* Rows of up to 32 floats with the fast exp, in V = 1, 2 or 4 vectors that stay in registers
 * from their loads to their stores, where the three-pass body stores the weights and loads them
 * again (as on avx512): in a row this short, that store and reload are a large part of the work.
 * Vectors past the row's end are skipped. SLEEF's exp, a call, keeps the three passes. */
#define EACH_OF_4(OP) OP(0) OP(1) OP(2) OP(3)
static inline __attribute__((always_inline)) float
softmax_regs_fast_avx2(float *y, const float *x, size_t n, __m256 vs, int unit, const int V) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    /* vectors before `last` are whole, `last` has lm's lanes, those after it are skipped: one
       mask register, not one a vector (16 registers are few) */
    const size_t last = (n - 1) / W;
    const __m256i lm = tail_mask(n - last * W);
#define LOAD_(k)                                                                                   \
    __m256 z##k = ninf, a##k = ninf;                                                               \
    if (V > k && k < last + 1) {                                                                   \
        z##k = k < last ? _mm256_loadu_ps(x + k * W) : _mm256_maskload_ps(x + k * W, lm);          \
        if (!unit) z##k = _mm256_mul_ps(z##k, vs);                                                 \
        a##k = k < last ? z##k : _mm256_blendv_ps(ninf, z##k, _mm256_castsi256_ps(lm));            \
    }
    EACH_OF_4(LOAD_)
#undef LOAD_
    if (V > 2) a0 = _mm256_max_ps(a0, a2), a1 = _mm256_max_ps(a1, a3);
    if (V > 1) a0 = _mm256_max_ps(a0, a1);
    const __m256 vmax = allmax_avx2(a0);
    const float max = _mm256_cvtss_f32(vmax);
    const float g = sdpa_ends_guess(x, n, _mm256_cvtss_f32(vs));
    if (!isfinite(max)) return max;
        /* the exps against c's shift, then the sum and the stores: against the guessed shift when
           it holds (kernels.h), else against the max */
#define EXP_(k)                                                                                    \
    a##k = _mm256_setzero_ps();                                                                    \
    if (V > k && k < last + 1) {                                                                   \
        z##k = exp_row_fast(folded ? z##k : _mm256_sub_ps(z##k, c.shift), &c);                     \
        if (k == last) z##k = _mm256_and_ps(z##k, _mm256_castsi256_ps(lm));                        \
        a##k = z##k;                                                                               \
    }
        /* the weights e / sum: a division a vector, no slower here than 1 / sum and a multiply
           a vector (measured at 8 to 32 floats). Each weight is its quotient rounded once, so
           e <= sum gives at most 1 in every rounding mode, and a row of one entry exactly 1,
           where e * fl(1 / e) may be 1 - 2^-24. */
#define STORE_(k)                                                                                  \
    if (V > k && k < last) _mm256_storeu_ps(y + k * W, flush_below_min(_mm256_div_ps(z##k, sum))); \
    if (V > k && k == last)                                                                        \
        _mm256_maskstore_ps(y + k * W, lm, flush_below_min(_mm256_div_ps(z##k, sum)));
#define FINISH_                                                                                    \
    EACH_OF_4(EXP_)                                                                                \
    if (V > 2) a0 = _mm256_add_ps(a0, a2), a1 = _mm256_add_ps(a1, a3);                             \
    if (V > 1) a0 = _mm256_add_ps(a0, a1);                                                         \
    const __m256 sum = allsum_avx2(a0);                                                            \
    EACH_OF_4(STORE_)
    if (sdpa_guess_fits(g, max)) {
        const int folded = 1;
        const row_exp c = row_exp_guess(g);
        FINISH_
        return max;
    }
    const int folded = fabsf(max) <= SDPA_EXP_FOLD_MAX;
    const row_exp c = row_exp_fast(max, folded, 0);
    FINISH_
#undef FINISH_
#undef STORE_
#undef EXP_
    return max;
}
#undef EACH_OF_4

SDPA_SHORT_ENTRY(softmax_short_passes_nearest_avx2)
SDPA_SHORT_ENTRY(softmax_short_passes_fast_avx2)
/* rows of 256 floats and more: the magic-number rounding when the caller rounds to nearest. MXCSR
 * is read here, not in the dispatcher below, where its stack slot would give every row a frame. */
static __attribute__((noinline)) int softmax_short_long_avx2(float *y, const float *x, size_t n,
                                                             float scale) {
    return rounds_to_nearest() ? softmax_short_passes_nearest_avx2_entry(y, x, n, scale)
                               : softmax_short_passes_fast_avx2_entry(y, x, n, scale);
}
static float softmax_short_regs_avx2(float *y, const float *x, size_t n, float scale) {
    const __m256 vs = _mm256_set1_ps(scale);
    const int unit = scale == 1.0f;
    if (n <= W)
        return unit ? softmax_regs_fast_avx2(y, x, n, vs, 1, 1)
                    : softmax_regs_fast_avx2(y, x, n, vs, 0, 1);
    if (n <= 2 * W)
        return unit ? softmax_regs_fast_avx2(y, x, n, vs, 1, 2)
                    : softmax_regs_fast_avx2(y, x, n, vs, 0, 2);
    return unit ? softmax_regs_fast_avx2(y, x, n, vs, 1, 4)
                : softmax_regs_fast_avx2(y, x, n, vs, 0, 4);
}
static int softmax_short_fast_avx2(float *y, const float *x, size_t n, float scale) {
    if (n >= SHORT_MAGIC_FROM) return softmax_short_long_avx2(y, x, n, scale);
    if (n > 4 * W) return softmax_short_passes_fast_avx2_entry(y, x, n, scale);
    return sdpa_short_done(softmax_short_regs_avx2(y, x, n, scale), y, x, n, scale);
}
SDPA_SHORT_ENTRY(softmax_short_sleef_avx2)

static void softmax_backward_avx2(float *dx, const float *y, const float *dy, size_t n, float scale,
                                  float y_dot_dy) {
    const __m256 vs = _mm256_set1_ps(scale), vd = _mm256_set1_ps(y_dot_dy);
    for (size_t i = 0; i < n; i += W) {
        __m256i m = tail_mask(n - i < W ? n - i : W);
        __m256 t = _mm256_sub_ps(_mm256_maskload_ps(dy + i, m), vd);
        _mm256_maskstore_ps(dx + i, m,
                            _mm256_mul_ps(_mm256_mul_ps(vs, _mm256_maskload_ps(y + i, m)), t));
    }
}

/* ---- Attention microkernels (the tiling driver is src/attention.c) ---- */

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Lane i of the result is the sum of the lanes of the i-th argument (a transpose-add tree). */
ALWAYS_INLINE __m256 hsum8_avx2(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5,
                                __m256 a6, __m256 a7) {
    /* hadd twice: each 128-bit half holds the half-sums of four inputs */
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                         _mm256_permute2f128_ps(u0, u1, 0x31));
}

#define LOAD_FULL(ptr) _mm256_loadu_ps(ptr)
#define LOAD_TAIL(ptr) _mm256_maskload_ps(ptr, m)

/* One step of a 2 x 4 block: 6 loads feed 8 FMAs (16 registers hold no more); the empty asm
 * keeps the loaded rows in registers (see pv_2x32_avx2). */
#define SCORES_2X4_STEP(LOAD)                                                                      \
    do {                                                                                           \
        __m256 q0 = LOAD(q + p), q1 = LOAD(q + q_stride + p);                                      \
        __m256 k0 = LOAD(k + p), k1 = LOAD(k + k_stride + p), k2 = LOAD(k + 2 * k_stride + p),     \
               k3 = LOAD(k + 3 * k_stride + p);                                                    \
        __asm__("" : "+x"(q0), "+x"(q1), "+x"(k0), "+x"(k1), "+x"(k2), "+x"(k3));                  \
        a00 = _mm256_fmadd_ps(q0, k0, a00), a01 = _mm256_fmadd_ps(q0, k1, a01);                    \
        a02 = _mm256_fmadd_ps(q0, k2, a02), a03 = _mm256_fmadd_ps(q0, k3, a03);                    \
        a10 = _mm256_fmadd_ps(q1, k0, a10), a11 = _mm256_fmadd_ps(q1, k1, a11);                    \
        a12 = _mm256_fmadd_ps(q1, k2, a12), a13 = _mm256_fmadd_ps(q1, k3, a13);                    \
    } while (0)

ALWAYS_INLINE void scores_2x4_avx2(float *s, size_t ld_s, const float *q, size_t q_stride,
                                   const float *k, size_t k_stride, size_t d, __m256 vscale) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00,
           a12 = a00, a13 = a00;
    size_t p = 0;
    for (; p + W <= d; p += W) SCORES_2X4_STEP(LOAD_FULL);
    if (p < d) {
        __m256i m = tail_mask(d - p);
        SCORES_2X4_STEP(LOAD_TAIL);
    }
    __m256 sum = _mm256_mul_ps(hsum8_avx2(a00, a01, a02, a03, a10, a11, a12, a13), vscale);
    _mm_storeu_ps(s, _mm256_castps256_ps128(sum));
    _mm_storeu_ps(s + ld_s, _mm256_extractf128_ps(sum, 1));
}

#define SCORES_1X8_STEP(LOAD)                                                                      \
    do {                                                                                           \
        __m256 vq = LOAD(q + p);                                                                   \
        a0 = _mm256_fmadd_ps(vq, LOAD(k + p), a0);                                                 \
        a1 = _mm256_fmadd_ps(vq, LOAD(k + k_stride + p), a1);                                      \
        a2 = _mm256_fmadd_ps(vq, LOAD(k + 2 * k_stride + p), a2);                                  \
        a3 = _mm256_fmadd_ps(vq, LOAD(k + 3 * k_stride + p), a3);                                  \
        a4 = _mm256_fmadd_ps(vq, LOAD(k + 4 * k_stride + p), a4);                                  \
        a5 = _mm256_fmadd_ps(vq, LOAD(k + 5 * k_stride + p), a5);                                  \
        a6 = _mm256_fmadd_ps(vq, LOAD(k + 6 * k_stride + p), a6);                                  \
        a7 = _mm256_fmadd_ps(vq, LOAD(k + 7 * k_stride + p), a7);                                  \
    } while (0)

/* One query x 8 keys (decode). */
ALWAYS_INLINE void scores_1x8_avx2(float *s, const float *q, const float *k, size_t k_stride,
                                   size_t d, __m256 vscale) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    size_t p = 0;
    for (; p + W <= d; p += W) SCORES_1X8_STEP(LOAD_FULL);
    if (p < d) {
        __m256i m = tail_mask(d - p);
        SCORES_1X8_STEP(LOAD_TAIL);
    }
    _mm256_storeu_ps(s, _mm256_mul_ps(hsum8_avx2(a0, a1, a2, a3, a4, a5, a6, a7), vscale));
}

static void scores_tile_avx2(float *s, size_t ld_s, const float *q, size_t q_stride, size_t nq,
                             const float *k, size_t k_stride, size_t nk, size_t d, float scale) {
    const __m256 vscale = _mm256_set1_ps(scale);
    size_t i = 0;
    for (; i + 2 <= nq; i += 2) {
        const float *qi = q + i * q_stride;
        float *si = s + i * ld_s;
        size_t j = 0;
        for (; j + 4 <= nk; j += 4)
            scores_2x4_avx2(si + j, ld_s, qi, q_stride, k + j * k_stride, k_stride, d, vscale);
        for (; j < nk; j++) {
            si[j] = scale * dot_avx2(qi, k + j * k_stride, d);
            si[ld_s + j] = scale * dot_avx2(qi + q_stride, k + j * k_stride, d);
        }
    }
    for (; i < nq; i++) {
        const float *qi = q + i * q_stride;
        float *si = s + i * ld_s;
        size_t j = 0;
        for (; j + 8 <= nk; j += 8)
            scores_1x8_avx2(si + j, qi, k + j * k_stride, k_stride, d, vscale);
        for (; j < nk; j++) si[j] = scale * dot_avx2(qi, k + j * k_stride, d);
    }
}

/* The P V microkernels: acc[i][c] = acc[i][c] alpha[i] + sum_j P(i, j) v[j][c], with the weight
 * P(i, j) at p[i * p_row + j * p_key] (row-major tiles: p_row = ld_p, p_key = 1; the key-major
 * tiles of exp_pv: p_row = 1, p_key = SDPA_ATTN_MAX_BLOCK_Q) and alpha = NULL for 1.
 * Inlined into each caller with its constants. */
ALWAYS_INLINE __m256 pv_load_acc(const float *o, const float *alpha) {
    __m256 c = _mm256_loadu_ps(o);
    return alpha ? _mm256_mul_ps(c, _mm256_broadcast_ss(alpha)) : c;
}

/* acc[2 rows][32 columns]: 8 accumulators in registers, 4 loads of v and 2 broadcasts per key
 * for 8 FMAs. */
ALWAYS_INLINE void pv_2x32_avx2(float *acc, size_t ld_acc, const float *p, size_t p_row,
                                size_t p_key, const float *alpha, size_t nk, const float *v,
                                size_t v_stride) {
    float *o0 = acc, *o1 = acc + ld_acc;
    const float *a0 = alpha, *a1 = alpha ? alpha + 1 : NULL;
    __m256 c00 = pv_load_acc(o0, a0), c01 = pv_load_acc(o0 + W, a0),
           c02 = pv_load_acc(o0 + 2 * W, a0), c03 = pv_load_acc(o0 + 3 * W, a0);
    __m256 c10 = pv_load_acc(o1, a1), c11 = pv_load_acc(o1 + W, a1),
           c12 = pv_load_acc(o1 + 2 * W, a1), c13 = pv_load_acc(o1 + 3 * W, a1);
    for (size_t j = 0; j < nk; j++) {
        const float *vj = v + j * v_stride, *pj = p + j * p_key;
        __m256 v0 = _mm256_loadu_ps(vj), v1 = _mm256_loadu_ps(vj + W),
               v2 = _mm256_loadu_ps(vj + 2 * W), v3 = _mm256_loadu_ps(vj + 3 * W);
        /* keep each row of v in a register for both FMAs: folded into them as memory operands
           (what GCC does otherwise) it is loaded twice and the loop becomes load-bound */
        __asm__("" : "+x"(v0), "+x"(v1), "+x"(v2), "+x"(v3));
        __m256 w = _mm256_broadcast_ss(pj);
        c00 = _mm256_fmadd_ps(w, v0, c00), c01 = _mm256_fmadd_ps(w, v1, c01);
        c02 = _mm256_fmadd_ps(w, v2, c02), c03 = _mm256_fmadd_ps(w, v3, c03);
        w = _mm256_broadcast_ss(pj + p_row);
        c10 = _mm256_fmadd_ps(w, v0, c10), c11 = _mm256_fmadd_ps(w, v1, c11);
        c12 = _mm256_fmadd_ps(w, v2, c12), c13 = _mm256_fmadd_ps(w, v3, c13);
    }
    _mm256_storeu_ps(o0, c00), _mm256_storeu_ps(o0 + W, c01);
    _mm256_storeu_ps(o0 + 2 * W, c02), _mm256_storeu_ps(o0 + 3 * W, c03);
    _mm256_storeu_ps(o1, c10), _mm256_storeu_ps(o1 + W, c11);
    _mm256_storeu_ps(o1 + 2 * W, c12), _mm256_storeu_ps(o1 + 3 * W, c13);
}

/* acc[6 rows][16 columns]: 12 accumulators (more chains than the 8 two FMA pipes need), 2 loads
 * of v and 6 broadcasts per key for 12 FMAs. */
ALWAYS_INLINE void pv_6x16_avx2(float *acc, size_t ld_acc, const float *p, size_t p_row,
                                size_t p_key, const float *alpha, size_t nk, const float *v,
                                size_t v_stride) {
    __m256 c[6][2];
    for (int r = 0; r < 6; r++) {
        const float *ar = alpha ? alpha + r : NULL;
        c[r][0] = pv_load_acc(acc + r * ld_acc, ar);
        c[r][1] = pv_load_acc(acc + r * ld_acc + W, ar);
    }
    for (size_t j = 0; j < nk; j++) {
        const float *vj = v + j * v_stride, *pj = p + j * p_key;
        __m256 v0 = _mm256_loadu_ps(vj), v1 = _mm256_loadu_ps(vj + W);
        __asm__("" : "+x"(v0), "+x"(v1)); /* one load for six rows (see pv_2x32_avx2) */
        for (int r = 0; r < 6; r++) {
            __m256 w = _mm256_broadcast_ss(pj + r * p_row);
            c[r][0] = _mm256_fmadd_ps(w, v0, c[r][0]);
            c[r][1] = _mm256_fmadd_ps(w, v1, c[r][1]);
        }
    }
    for (int r = 0; r < 6; r++) {
        _mm256_storeu_ps(acc + r * ld_acc, c[r][0]);
        _mm256_storeu_ps(acc + r * ld_acc + W, c[r][1]);
    }
}

/* One row, 32 columns, two keys per step for eight independent chains. */
ALWAYS_INLINE void pv_1x32_avx2(float *acc, const float *p, size_t p_key, const float *alpha,
                                size_t nk, const float *v, size_t v_stride) {
    __m256 c0 = pv_load_acc(acc, alpha), c1 = pv_load_acc(acc + W, alpha),
           c2 = pv_load_acc(acc + 2 * W, alpha), c3 = pv_load_acc(acc + 3 * W, alpha);
    __m256 e0 = _mm256_setzero_ps(), e1 = e0, e2 = e0, e3 = e0;
    size_t j = 0;
    for (; j + 2 <= nk; j += 2) {
        const float *v0 = v + j * v_stride, *v1 = v0 + v_stride;
        __m256 w0 = _mm256_broadcast_ss(p + j * p_key),
               w1 = _mm256_broadcast_ss(p + (j + 1) * p_key);
        c0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0), c0);
        c1 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0 + W), c1);
        c2 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0 + 2 * W), c2);
        c3 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0 + 3 * W), c3);
        e0 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(v1), e0);
        e1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(v1 + W), e1);
        e2 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(v1 + 2 * W), e2);
        e3 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(v1 + 3 * W), e3);
    }
    if (j < nk) {
        const float *v0 = v + j * v_stride;
        __m256 w0 = _mm256_broadcast_ss(p + j * p_key);
        c0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0), c0);
        c1 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0 + W), c1);
        c2 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0 + 2 * W), c2);
        c3 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0 + 3 * W), c3);
    }
    _mm256_storeu_ps(acc, _mm256_add_ps(c0, e0));
    _mm256_storeu_ps(acc + W, _mm256_add_ps(c1, e1));
    _mm256_storeu_ps(acc + 2 * W, _mm256_add_ps(c2, e2));
    _mm256_storeu_ps(acc + 3 * W, _mm256_add_ps(c3, e3));
}

/* One row, 8 columns of which the lanes in m are real (maskload never touches the others). */
ALWAYS_INLINE void pv_1x8_avx2(float *acc, const float *p, size_t p_key, const float *alpha,
                               size_t nk, const float *v, size_t v_stride, __m256i m) {
    __m256 c0 = _mm256_maskload_ps(acc, m), c1 = _mm256_setzero_ps(), c2 = c1, c3 = c1;
    if (alpha) c0 = _mm256_mul_ps(c0, _mm256_broadcast_ss(alpha));
    size_t j = 0;
    for (; j + 4 <= nk; j += 4) {
        const float *v0 = v + j * v_stride, *p0 = p + j * p_key;
        c0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p0), _mm256_maskload_ps(v0, m), c0);
        c1 = _mm256_fmadd_ps(_mm256_broadcast_ss(p0 + p_key), _mm256_maskload_ps(v0 + v_stride, m),
                             c1);
        c2 = _mm256_fmadd_ps(_mm256_broadcast_ss(p0 + 2 * p_key),
                             _mm256_maskload_ps(v0 + 2 * v_stride, m), c2);
        c3 = _mm256_fmadd_ps(_mm256_broadcast_ss(p0 + 3 * p_key),
                             _mm256_maskload_ps(v0 + 3 * v_stride, m), c3);
    }
    for (; j < nk; j++)
        c0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j * p_key),
                             _mm256_maskload_ps(v + j * v_stride, m), c0);
    _mm256_maskstore_ps(acc, m, _mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)));
}

/* A whole tile: rows six at a time (16 columns a step), then in pairs (32 columns, then 8), then
 * the row left over. */
ALWAYS_INLINE void pv_tile_body(float *acc, size_t ld_acc, const float *p, size_t p_row,
                                size_t p_key, const float *alpha, size_t nq, size_t nk,
                                const float *v, size_t v_stride, size_t d_v) {
    const __m256i all = _mm256_set1_epi32(-1);
    size_t i = 0;
    for (; i + 6 <= nq && d_v >= 2 * W; i += 6) {
        float *a = acc + i * ld_acc;
        const float *pi = p + i * p_row, *ai = alpha ? alpha + i : NULL;
        size_t c = 0;
        for (; c + 2 * W <= d_v; c += 2 * W)
            pv_6x16_avx2(a + c, ld_acc, pi, p_row, p_key, ai, nk, v + c, v_stride);
        for (; c < d_v; c += W) {
            __m256i m = d_v - c >= W ? all : tail_mask(d_v - c);
            for (size_t r = 0; r < 6; r++)
                pv_1x8_avx2(a + r * ld_acc + c, pi + r * p_row, p_key, ai ? ai + r : NULL, nk,
                            v + c, v_stride, m);
        }
    }
    for (; i + 2 <= nq; i += 2) {
        float *a = acc + i * ld_acc;
        const float *pi = p + i * p_row, *ai = alpha ? alpha + i : NULL;
        size_t c = 0;
        for (; c + 4 * W <= d_v; c += 4 * W)
            pv_2x32_avx2(a + c, ld_acc, pi, p_row, p_key, ai, nk, v + c, v_stride);
        for (; c < d_v; c += W) {
            __m256i m = d_v - c >= W ? all : tail_mask(d_v - c);
            pv_1x8_avx2(a + c, pi, p_key, ai, nk, v + c, v_stride, m);
            pv_1x8_avx2(a + ld_acc + c, pi + p_row, p_key, ai ? ai + 1 : NULL, nk, v + c, v_stride,
                        m);
        }
    }
    for (; i < nq; i++) {
        float *a = acc + i * ld_acc;
        const float *pi = p + i * p_row, *ai = alpha ? alpha + i : NULL;
        size_t c = 0;
        for (; c + 4 * W <= d_v; c += 4 * W)
            pv_1x32_avx2(a + c, pi, p_key, ai, nk, v + c, v_stride);
        for (; c < d_v; c += W) {
            __m256i m = d_v - c >= W ? all : tail_mask(d_v - c);
            pv_1x8_avx2(a + c, pi, p_key, ai, nk, v + c, v_stride, m);
        }
    }
}

static void pv_tile_avx2(float *acc, size_t ld_acc, const float *p, size_t ld_p, size_t nq,
                         size_t nk, const float *v, size_t v_stride, size_t d_v) {
    pv_tile_body(acc, ld_acc, p, ld_p, 1, NULL, nq, nk, v, v_stride, d_v);
}

/* In-register transpose of 8 rows of 8 floats: unpack, shuffle, then swap 128-bit halves. */
ALWAYS_INLINE void transpose8_avx2(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20), r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20), r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20), r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20), r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* qt[p][i] = q[i][p], padded with zero queries up to SDPA_ATTN_MAX_BLOCK_Q: 8 x 8 blocks through
 * the register transpose (masked loads for the d tail, zeros for the missing rows). */
static void pack_q_avx2(float *qt, const float *q, size_t q_stride, size_t nq, size_t d) {
    const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;
    for (size_t p0 = 0; p0 < d; p0 += W) {
        const size_t np = d - p0 < W ? d - p0 : W;
        const __m256i m = tail_mask(np);
        for (size_t i0 = 0; i0 < ld; i0 += W) {
            __m256 r[8];
            for (size_t t = 0; t < W; t++)
                r[t] = i0 + t < nq ? _mm256_maskload_ps(q + (i0 + t) * q_stride + p0, m)
                                   : _mm256_setzero_ps();
            transpose8_avx2(r);
            for (size_t t = 0; t < np; t++) _mm256_storeu_ps(qt + (p0 + t) * ld + i0, r[t]);
        }
    }
}

/* two vectors of one key's scores, scaled as they leave the registers */
#define KEYMAJOR_STORE(p, a0, a1)                                                                  \
    do {                                                                                           \
        _mm256_storeu_ps(p, _mm256_mul_ps(a0, vscale));                                            \
        _mm256_storeu_ps((p) + W, _mm256_mul_ps(a1, vscale));                                      \
    } while (0)

/* st[key][query] = scale * sum_p k[key][p] qt[p][query] for nk keys and all
 * SDPA_ATTN_MAX_BLOCK_Q (zero-padded) queries: two keys a step, 4 loads of qt and 2 broadcasts of
 * k for 8 FMAs, no horizontal sums. The scale multiplies the finished dots, as in scores_tile:
 * scaling q first could overflow or underflow where the dot does not. */
/* Six keys and 16 queries: 12 accumulators (more independent chains than the 8 that two FMA
 * pipes of 4-cycle latency need), 2 loads of qt and 6 broadcasts for 12 FMAs. */
ALWAYS_INLINE void keymajor_6x16_avx2(float *st, const float *qt, const float *k, size_t k_stride,
                                      size_t d, __m256 vscale) {
    const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,
           a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00;
    for (size_t p = 0; p < d; p++) {
        __m256 q0 = _mm256_loadu_ps(qt + p * ld), q1 = _mm256_loadu_ps(qt + p * ld + W);
        __asm__("" : "+x"(q0), "+x"(q1));
        __m256 w = _mm256_broadcast_ss(k + p);
        a00 = _mm256_fmadd_ps(w, q0, a00), a01 = _mm256_fmadd_ps(w, q1, a01);
        w = _mm256_broadcast_ss(k + k_stride + p);
        a10 = _mm256_fmadd_ps(w, q0, a10), a11 = _mm256_fmadd_ps(w, q1, a11);
        w = _mm256_broadcast_ss(k + 2 * k_stride + p);
        a20 = _mm256_fmadd_ps(w, q0, a20), a21 = _mm256_fmadd_ps(w, q1, a21);
        w = _mm256_broadcast_ss(k + 3 * k_stride + p);
        a30 = _mm256_fmadd_ps(w, q0, a30), a31 = _mm256_fmadd_ps(w, q1, a31);
        w = _mm256_broadcast_ss(k + 4 * k_stride + p);
        a40 = _mm256_fmadd_ps(w, q0, a40), a41 = _mm256_fmadd_ps(w, q1, a41);
        w = _mm256_broadcast_ss(k + 5 * k_stride + p);
        a50 = _mm256_fmadd_ps(w, q0, a50), a51 = _mm256_fmadd_ps(w, q1, a51);
    }
    KEYMAJOR_STORE(st, a00, a01);
    KEYMAJOR_STORE(st + ld, a10, a11);
    KEYMAJOR_STORE(st + 2 * ld, a20, a21);
    KEYMAJOR_STORE(st + 3 * ld, a30, a31);
    KEYMAJOR_STORE(st + 4 * ld, a40, a41);
    KEYMAJOR_STORE(st + 5 * ld, a50, a51);
}

static void scores_keymajor_avx2(float *st, const float *qt, const float *k, size_t k_stride,
                                 size_t nk, size_t d, float scale) {
    const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;
    const __m256 vscale = _mm256_set1_ps(scale);
    size_t j = 0;
    for (; j + 6 <= nk; j += 6)
        for (size_t h = 0; h < ld; h += 2 * W)
            keymajor_6x16_avx2(st + j * ld + h, qt + h, k + j * k_stride, k_stride, d, vscale);
    for (; j + 2 <= nk; j += 2) {
        const float *k0 = k + j * k_stride, *k1 = k0 + k_stride;
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00,
               a12 = a00, a13 = a00;
        for (size_t p = 0; p < d; p++) {
            const float *qp = qt + p * ld;
            __m256 q0 = _mm256_loadu_ps(qp), q1 = _mm256_loadu_ps(qp + W),
                   q2 = _mm256_loadu_ps(qp + 2 * W), q3 = _mm256_loadu_ps(qp + 3 * W);
            /* one load of qt for both keys (see pv_2x32_avx2) */
            __asm__("" : "+x"(q0), "+x"(q1), "+x"(q2), "+x"(q3));
            __m256 w = _mm256_broadcast_ss(k0 + p);
            a00 = _mm256_fmadd_ps(w, q0, a00), a01 = _mm256_fmadd_ps(w, q1, a01);
            a02 = _mm256_fmadd_ps(w, q2, a02), a03 = _mm256_fmadd_ps(w, q3, a03);
            w = _mm256_broadcast_ss(k1 + p);
            a10 = _mm256_fmadd_ps(w, q0, a10), a11 = _mm256_fmadd_ps(w, q1, a11);
            a12 = _mm256_fmadd_ps(w, q2, a12), a13 = _mm256_fmadd_ps(w, q3, a13);
        }
        float *s0 = st + j * ld, *s1 = s0 + ld;
        KEYMAJOR_STORE(s0, a00, a01);
        KEYMAJOR_STORE(s0 + 2 * W, a02, a03);
        KEYMAJOR_STORE(s1, a10, a11);
        KEYMAJOR_STORE(s1 + 2 * W, a12, a13);
    }
    if (j < nk) {
        const float *k0 = k + j * k_stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (size_t p = 0; p < d; p++) {
            const float *qp = qt + p * ld;
            __m256 w = _mm256_broadcast_ss(k0 + p);
            a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(qp), a0);
            a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(qp + W), a1);
            a2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(qp + 2 * W), a2);
            a3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(qp + 3 * W), a3);
        }
        float *s0 = st + j * ld;
        KEYMAJOR_STORE(s0, a0, a1);
        KEYMAJOR_STORE(s0 + 2 * W, a2, a3);
    }
}

/* The scores tile from the packed queries: the key-major tile, then 8 x 8 in-register
 * transposes into s[query][key]. */
static void scores_packed_avx2(float *s, size_t ld_s, const float *qt, size_t nq, const float *k,
                               size_t k_stride, size_t nk, size_t d, float scale) {
    const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;
    float st[SDPA_ATTN_MAX_BLOCK_KV * SDPA_ATTN_MAX_BLOCK_Q];
    scores_keymajor_avx2(st, qt, k, k_stride, nk, d, scale);
    for (size_t j0 = 0; j0 < nk; j0 += W) {
        const size_t nj = nk - j0 < W ? nk - j0 : W;
        const __m256i m = tail_mask(nj);
        for (size_t i0 = 0; i0 < nq; i0 += W) {
            __m256 r[8];
            for (size_t t = 0; t < W; t++)
                r[t] = t < nj ? _mm256_loadu_ps(st + (j0 + t) * ld + i0) : _mm256_setzero_ps();
            transpose8_avx2(r);
            for (size_t t = 0; t < W && i0 + t < nq; t++)
                _mm256_maskstore_ps(s + (i0 + t) * ld_s + j0, m, r[t]);
        }
    }
}

/* The online softmax's step for a whole tile (kernels.h, scores_max and exp_pv; the avx512
 * version says why): scores key-major, row maxima, exps and row sums across 8 queries at a time,
 * the P V step reading the weights in that layout and rescaling each accumulator row as it loads
 * it. */
static void scores_max_avx2(float *st, float *tile_max, const float *qt, size_t nq, const float *k,
                            size_t k_stride, size_t nk, size_t d_k, float scale) {
    const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;
    scores_keymajor_avx2(st, qt, k, k_stride, nk, d_k, scale);
    for (size_t g = 0; g * W < nq; g++) {
        __m256 mx0 = _mm256_set1_ps(-INFINITY), mx1 = mx0;
        size_t j = 0;
        for (; j + 2 <= nk; j += 2) {
            mx0 = _mm256_max_ps(_mm256_load_ps(st + j * ld + g * W), mx0);
            mx1 = _mm256_max_ps(_mm256_load_ps(st + (j + 1) * ld + g * W), mx1);
        }
        if (j < nk) mx0 = _mm256_max_ps(_mm256_load_ps(st + j * ld + g * W), mx0);
        _mm256_storeu_ps(tile_max + g * W, _mm256_max_ps(mx0, mx1));
    }
}

#define EXP_PV_AVX2(NAME, EXP)                                                                     \
    static void NAME(float *acc, size_t ld_acc, float *st, const float *m, const float *m_new,     \
                     float *alpha, float *sums, size_t nq, size_t nk, const float *v,              \
                     size_t v_stride, size_t d_v) {                                                \
        const size_t ld = SDPA_ATTN_MAX_BLOCK_Q, groups = (nq + W - 1) / W;                        \
        float old[SDPA_ATTN_MAX_BLOCK_Q], shift[SDPA_ATTN_MAX_BLOCK_Q];                            \
        /* rows past nq (zero queries, scores 0): shift 0, alpha exp(-inf) = 0, both unused */     \
        for (size_t i = 0; i < groups * W; i++) {                                                  \
            old[i] = i < nq ? m[i] : -INFINITY;                                                    \
            shift[i] = i < nq ? m_new[i] : 0.0f;                                                   \
        }                                                                                          \
        const __m256 table = exp_table_avx2();                                                     \
        for (size_t g = 0; g < groups; g++) {                                                      \
            const __m256 mx = _mm256_loadu_ps(shift + g * W);                                      \
            /* exp(0) is exactly 1: a row whose max did not move is not rescaled at all */         \
            _mm256_storeu_ps(alpha + g * W,                                                        \
                             EXP(_mm256_sub_ps(_mm256_loadu_ps(old + g * W), mx), table, 0));      \
            __m256 s0 = _mm256_setzero_ps(), s1 = s0;                                              \
            size_t j = 0;                                                                          \
            for (; j + 2 <= nk; j += 2) {                                                          \
                float *p0 = st + j * ld + g * W, *p1 = p0 + ld;                                    \
                __m256 e0 = EXP(_mm256_sub_ps(_mm256_load_ps(p0), mx), table, 0);                  \
                __m256 e1 = EXP(_mm256_sub_ps(_mm256_load_ps(p1), mx), table, 0);                  \
                _mm256_store_ps(p0, e0), _mm256_store_ps(p1, e1);                                  \
                s0 = _mm256_add_ps(s0, e0), s1 = _mm256_add_ps(s1, e1);                            \
            }                                                                                      \
            if (j < nk) {                                                                          \
                float *p0 = st + j * ld + g * W;                                                   \
                __m256 e0 = EXP(_mm256_sub_ps(_mm256_load_ps(p0), mx), table, 0);                  \
                _mm256_store_ps(p0, e0);                                                           \
                s0 = _mm256_add_ps(s0, e0);                                                        \
            }                                                                                      \
            _mm256_storeu_ps(sums + g * W, _mm256_add_ps(s0, s1));                                 \
        }                                                                                          \
        pv_tile_body(acc, ld_acc, st, 1, ld, alpha, nq, nk, v, v_stride, d_v);                     \
    }
EXP_PV_AVX2(exp_pv_fast_avx2, exp_fast_avx2)
EXP_PV_AVX2(exp_pv_sleef_avx2, exp_sleef_avx2)

static const sdpa_attention_kernels attention_avx2 = {
    .block_q = 32,
    .block_kv = 64,
    .scores_tile = scores_tile_avx2,
    .pv_tile = pv_tile_avx2,
    .pack_q = pack_q_avx2,
    .scores_packed = scores_packed_avx2,
    .scores_max = scores_max_avx2,
    .exp_pv = {exp_pv_fast_avx2, exp_pv_sleef_avx2},
};

const sdpa_kernels sdpa_kernels_avx2 = {
    .name = SDPA_BACKEND_NAME,
    .dot = dot_avx2,
    .dot_to = dot_avx2_to,
    .scale = scale_avx2,
    .max_scaled = max_scaled_avx2,
    .exp_sum = {exp_sum_fast_avx2, exp_sum_sleef_avx2},
    .exp_sum_block = 2048,
    .exp_sum_max = {exp_sum_fast_avx2_max, exp_sum_sleef_avx2_max},
    .normalize = normalize_avx2,
    .softmax_backward = softmax_backward_avx2,
    .softmax_short = {softmax_short_fast_avx2, softmax_short_sleef_avx2_entry},
    .exp = {exp_fast_array_avx2, exp_sleef_array_avx2},
    .attention = &attention_avx2,
};
