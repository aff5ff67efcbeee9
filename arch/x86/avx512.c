/* AVX-512F backend: 16 floats a vector; tails use masked loads and stores, which never touch
 * the masked-off bytes, so no kernel reads or writes past its arrays. The row kernels and
 * softmax_short's three passes are arch/row_kernels.h and arch/softmax_passes.h; this file holds
 * what only avx512 does: its weights and the short rows held in registers. */
#include "avx512_exp.h"

SDPA_DOT_TO(dot_avx512)

/* w = e * factor for a row's weights, with keep_normal's flush decided from e, beside the
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
ALWAYS_INLINE __m512 row_factor(__m512 total, int kind, __m512 *keep_from) {
    (void)kind;
    *keep_from = total * _mm512_set1_ps(SDPA_KEEP_FLOOR);
    return _mm512_div_round_ps(_mm512_set1_ps(1.0f), total, NEAREST_);
}
#undef NEAREST_
/* y[i] *= factor; weights below FLT_MIN become exactly 0: decided from y[i] before the multiply
 * against keep_from (weights_avx512, one operation fewer a vector) when `from_e`, for rows whose
 * factor and keep_from are row_factor's; else by keep_normal after it */
ALWAYS_INLINE __m512 row_weight(__m512 e, __m512 factor, __m512 keep_from, int from_e) {
    return from_e ? weights_avx512(e, factor, keep_from) : keep_normal(e * factor);
}

#define ROW_KEEP_LAST 1 /* softmax_passes.h keeps a partial last vector in a register */
#include "row_kernels.h"
#include "score_stage_tile.h"
#include "softmax_passes.h"

/* weights_avx512 for one vector: e / total, one division where 1 / total takes one too, and no
 * multiply after it. Each weight is its quotient rounded once, so e <= total gives at most 1 in
 * every rounding mode, and a row of one entry exactly 1, where e * fl(1 / e) may be 1 - 2^-24. */
ALWAYS_INLINE __m512 quotients_avx512(__m512 e, __m512 total) {
    const __m512 keep_from = total * _mm512_set1_ps(SDPA_KEEP_FLOOR);
    return _mm512_maskz_div_ps(_mm512_cmp_ps_mask(e, keep_from, _CMP_NLT_UQ), e, total);
}

/* the exps of one vector of z's lanes in `valid` (z - shift, up to the shift's constant factor),
 * 0 in the others */
ALWAYS_INLINE __m512 vector_exps(__m512 z, __mmask16 valid, __m512 shift, const row_exp *c,
                                 int kind, int folded) {
    if (!folded) z = z - shift;
    row_exps(&z, 1, c, kind);
    return _mm512_maskz_mov_ps(valid, z);
}

/* A row of one vector, in a register from the load to the store, where longer rows store their
 * weights and load them again (a store and reload on the chain of a row this short); its guess
 * is checked by the sum, with no max (shift_guess.h, "A capped guess"). */
ALWAYS_INLINE float softmax_vector(float *y, const float *x, size_t n, __m512 vs, int unit,
                                   int kind) {
    const __mmask16 valid = tail_mask(n);
    const __m512 z = scaled(_mm512_maskz_loadu_ps(valid, x), vs, unit);
    const __m512 g = ends_guess(x, n, vs, unit);
    const float gs = _mm512_cvtss_f32(g);
    if (sdpa_guess_usable(gs)) {
        const row_exp c = row_exp_guess(g, kind);
        const __m512 cap = g + _mm512_set1_ps(SDPA_GUESS_CAP);
        const __m512 e =
            vector_exps(_mm512_min_ps(cap, z), valid, g, &c, kind, row_exp_folds(kind));
        const __m512 total = vf_allsum(e);
        if (_mm512_cvtss_f32(total) <= SDPA_GUESS_SUM_MAX) {
            _mm512_mask_storeu_ps(y, valid, quotients_avx512(e, total));
            return gs;
        }
    }
    const __m512 vmax = vf_allmax(_mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), valid, z));
    const float max = _mm512_cvtss_f32(vmax);
    if (!isfinite(max)) return max;
    const int folded = row_exp_folds(kind) && fabsf(max) <= SDPA_EXP_FOLD_MAX;
    const row_exp c = row_exp_max(vmax, folded, kind);
    const __m512 e = vector_exps(z, valid, vmax, &c, kind, folded);
    _mm512_mask_storeu_ps(y, valid, quotients_avx512(e, vf_allsum(e)));
    return max;
}

/* Rows of 17 to 128 floats with the fast exp, in V = 2, 4 or 8 vectors that stay in registers
 * from their loads to their stores, where the three passes store the weights and load them
 * again: the store and the reload are a large part of a row this short. Vectors past the row's
 * end are skipped by a branch, not loaded with an empty mask: such a load still takes a slow
 * fault-suppression assist when its bytes lie on an unmapped page. SLEEF's exp is a call, across
 * which nothing stays in a register: that kind keeps the three passes. */

/* z = scale * x for the vectors with lanes in the row (m), the others left as they are */
ALWAYS_INLINE void regs_load(__m512 *z, const __mmask16 *m, const float *x, __m512 vs, int unit,
                             const int V) {
    EACH_VECTOR for (int k = 0; k < V; k++) if (m[k]) z[k] =
        scaled(_mm512_maskz_loadu_ps(m[k], x + k * W), vs, unit);
}
/* e = the exps of z (capped at `cap`, or less `shift` when not folded), 0 past the row */
ALWAYS_INLINE void regs_exps(__m512 *e, const __m512 *z, const __mmask16 *m, const int V,
                             const row_exp *c, __m512 shift, __m512 cap, int capped, int folded) {
    EACH_VECTOR for (int k = 0; k < V; k++) {
        e[k] = _mm512_setzero_ps();
        if (m[k]) {
            __m512 t = capped ? _mm512_min_ps(cap, z[k]) : z[k];
            if (!folded) t = z[k] - shift;
            row_exps(&t, 1, c, EXP_FAST32);
            e[k] = _mm512_maskz_mov_ps(m[k], t);
        }
    }
}
/* the sum (or the max) of V vectors, a tree */
ALWAYS_INLINE __m512 regs_tree(const __m512 *v, const int V, int max) {
    __m512 a[8];
    EACH_VECTOR for (int k = 0; k < V; k++) a[k] = v[k];
    EACH_VECTOR for (int h = V / 2; h >= 1; h /= 2) {
        EACH_VECTOR for (int k = 0; k < h; k++) a[k] =
            max ? _mm512_max_ps(a[k], a[k + h]) : _mm512_add_ps(a[k], a[k + h]);
    }
    return a[0];
}
/* the weights of the exps e, whose sum is in every lane of total */
ALWAYS_INLINE void regs_weights(float *y, const __m512 *e, const __mmask16 *m, const int V,
                                __m512 total) {
    __m512 keep_from;
    const __m512 factor = row_factor(total, EXP_FAST32, &keep_from);
    EACH_VECTOR for (int k = 0; k < V; k++) if (m[k])
        _mm512_mask_storeu_ps(y + k * W, m[k], weights_avx512(e[k], factor, keep_from));
}

/* full: the row fills the V vectors, so there are no masks to form and no branches per vector.
 * Arrays of named registers (regs_*): gcc keeps them in registers once the loops are unrolled. */
ALWAYS_INLINE float softmax_regs(float *y, const float *x, size_t n, __m512 vs, int unit,
                                 const int V, const int full) {
    if (full) n = (size_t)V * W;
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __mmask16 m[8];
    __m512 z[8], e[8];
    EACH_VECTOR for (int k = 0; k < V; k++) {
        m[k] = n <= (size_t)k * W         ? 0
               : n >= (size_t)(k + 1) * W ? (__mmask16)0xFFFF
                                          : tail_mask(n - (size_t)k * W);
        z[k] = ninf;
    }
    regs_load(z, m, x, vs, unit, V);
    const __m512 g = ends_guess(x, n, vs, unit);
    const float gs = _mm512_cvtss_f32(g);
    if (sdpa_guess_usable(gs)) {
        /* no max: the sum checks the guess (shift_guess.h, "A capped guess") */
        const row_exp c = row_exp_guess(g, EXP_FAST32);
        regs_exps(e, z, m, V, &c, g, g + _mm512_set1_ps(SDPA_GUESS_CAP), 1, 1);
        const __m512 total = vf_allsum(regs_tree(e, V, 0));
        if (_mm512_cvtss_f32(total) <= SDPA_GUESS_SUM_MAX) {
            regs_weights(y, e, m, V, total);
            return gs;
        }
        /* nothing is stored yet, so x is whole: z is loaded again rather than kept in registers
           through the exps, where it crowded them into spills (the barrier stops gcc reusing the
           first loads) */
        __asm__ volatile("" ::: "memory");
        regs_load(z, m, x, vs, unit, V);
    }
    EACH_VECTOR for (int k = 0; k < V; k++) e[k] = _mm512_mask_mov_ps(ninf, m[k], z[k]);
    const __m512 vmax = vf_allmax(regs_tree(e, V, 1));
    const float max = _mm512_cvtss_f32(vmax);
    if (!isfinite(max)) return max;
    const int folded = fabsf(max) <= SDPA_EXP_FOLD_MAX;
    const row_exp c = row_exp_max(vmax, folded, EXP_FAST32);
    regs_exps(e, z, m, V, &c, vmax, ninf, 0, folded);
    regs_weights(y, e, m, V, vf_allsum(regs_tree(e, V, 0)));
    return max;
}

/* a row of 17 to 128 floats in V vectors, with no masks when it fills them */
ALWAYS_INLINE float softmax_regs_of(float *y, const float *x, size_t n, __m512 vs, int unit,
                                    const int V) {
    if (n == (size_t)V * W)
        return unit ? softmax_regs(y, x, n, vs, 1, V, 1) : softmax_regs(y, x, n, vs, 0, V, 1);
    return unit ? softmax_regs(y, x, n, vs, 1, V, 0) : softmax_regs(y, x, n, vs, 0, V, 0);
}

ALWAYS_INLINE float softmax_short_fast32(float *y, const float *x, size_t n, float scale) {
    return softmax_passes_of(y, x, n, scale, EXP_FAST32);
}
ALWAYS_INLINE float sleef_rows(float *y, const float *x, size_t n, float scale, int unit) {
    if (n <= W) return softmax_vector(y, x, n, _mm512_set1_ps(scale), unit, SDPA_EXP_SLEEF);
    return softmax_passes(y, x, n, scale, unit, SDPA_EXP_SLEEF);
}
ALWAYS_INLINE float softmax_short_sleef(float *y, const float *x, size_t n, float scale) {
    return scale == 1.0f ? sleef_rows(y, x, n, 1.0f, 1) : sleef_rows(y, x, n, scale, 0);
}
SDPA_SHORT_ENTRY(softmax_short_fast32)
SDPA_SHORT_ENTRY(softmax_short_sleef)
/* rows of up to 128 floats here, in registers; longer ones jump to the three passes, whose
 * loops' registers and frame stay there */
static int softmax_short_fast(float *y, const float *x, size_t n, float scale) {
    if (n > 8 * W) return softmax_short_fast32_entry(y, x, n, scale);
    const __m512 vs = _mm512_set1_ps(scale);
    const int unit = scale == 1.0f;
    float got;
    if (n <= W)
        got = unit ? softmax_vector(y, x, n, vs, 1, EXP_FAST32)
                   : softmax_vector(y, x, n, vs, 0, EXP_FAST32);
    else
        got = n <= 2 * W   ? softmax_regs_of(y, x, n, vs, unit, 2)
              : n <= 4 * W ? softmax_regs_of(y, x, n, vs, unit, 4)
                           : softmax_regs_of(y, x, n, vs, unit, 8);
    return sdpa_short_done(got, y, x, n, scale);
}

const sdpa_kernels sdpa_kernels_avx512 = {
    ROW_KERNELS(dot_avx512),
    SOFTMAX_PASSES_KERNELS(softmax_short_fast, softmax_short_sleef_entry),
    STAGE_TILE_ENTRIES,
    .attention = &sdpa_attention_kernels_avx512,
};
