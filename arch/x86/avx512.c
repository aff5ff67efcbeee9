/* AVX-512F backend: 16 floats a vector; tails use masked loads and stores, which never touch
 * the masked-off bytes, so no kernel reads or writes past its arrays. */
#include "avx512_exp.h"

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
    .attention = &sdpa_attention_kernels_avx512,
};
