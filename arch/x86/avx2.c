/* AVX2 + FMA backend: 8 floats a vector; tails use vmaskmovps, whose masked-off lanes are
 * neither read nor written (no fault past the end of an array). */
#include "avx2_exp.h"

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

/* z = scale * x is rounded before the shift is subtracted, as sdpa.h defines z (no fused
 * multiply-subtract): a fused one gets exp of its product's rounding error, inf or 0 once
 * |z| > ~1e9, and a NaN row (tests/test_regressions.c). With scale 1 z = x and the multiply is
 * skipped. One body for both exp kinds; the exp is inlined. Four independent exps per iteration
 * keep both FMA pipes busy through the exp's dependency chain. */
#define EXP_SUM_LANES_AVX2(NAME, EXP)                                                              \
    /* the loop itself, the lane sums left unreduced (softmax_short reduces them in registers);    \
       with vmax (not NULL), also the lane maxima of z (exp_sum_max) */                            \
    ALWAYS_INLINE                                                                                  \
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
    ALWAYS_INLINE float NAME##_inline(float *y, const float *x, size_t n, float scale,             \
                                      float shift, __m256 *vmax) {                                 \
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

ALWAYS_INLINE void normalize_avx2_inline(float *y, size_t n, __m256 vf) {
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
ALWAYS_INLINE __m256 allmax_avx2(__m256 v) {
    v = _mm256_max_ps(v, _mm256_permute2f128_ps(v, v, 1));
    v = _mm256_max_ps(v, _mm256_permute_ps(v, 0x4E));
    return _mm256_max_ps(v, _mm256_permute_ps(v, 0xB1));
}
ALWAYS_INLINE __m256 allsum_avx2(__m256 v) {
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
ALWAYS_INLINE __m256 row_factor_avx2(__m256 sum) {
    __m256 q = _mm256_div_ps(_mm256_set1_ps(-1.0f), sum);
    /* opaque: the compiler assumes round-to-nearest, and would fold -(-1 / sum) to 1 / sum */
    __asm__("" : "+x"(q));
    return _mm256_xor_ps(q, _mm256_set1_ps(-0.0f));
}
/* 1 / sum itself, for rows run only under round-to-nearest, where e * fl(1 / sum) <= 1 + 2^-24
 * rounds to at most 1 without the negations (which cost rows of 300 floats measurably more than
 * their one operation) */
ALWAYS_INLINE __m256 nearest_factor_avx2(__m256 sum) {
    return _mm256_div_ps(_mm256_set1_ps(1.0f), sum);
}

/* A row of up to 4096 floats in one call (kernels.h, softmax_short), as on avx512: the three
 * passes without calls between them, the reductions in registers, 1 / sum in float (32 partial
 * sums of at most 128 weights each, fewer than the scalar backend's 512-float blocks add per
 * lane), and the exp's shift folded without the factor it leaves, which the division by the sum
 * takes out. */
#define SOFTMAX_SHORT_AVX2(NAME, EXP_SUM_LANES, GUESS_EXP, FOLDS, FACTOR)                          \
    ALWAYS_INLINE float NAME##_body(float *y, const float *x, size_t n, float scale, int unit) {   \
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
ALWAYS_INLINE float softmax_regs_fast_avx2(float *y, const float *x, size_t n, __m256 vs, int unit,
                                           const int V) {
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
    .attention = &sdpa_attention_kernels_avx2,
};
