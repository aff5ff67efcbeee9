/* AVX2 + FMA backend: 8 floats a vector; tails use vmaskmovps, whose masked-off lanes are
 * neither read nor written (no fault past the end of an array). The row kernels and
 * softmax_short's three passes are arch/row_kernels.h and arch/softmax_passes.h; this file holds
 * what only avx2 does: its weights' factor and the short rows held in registers. */
#include "avx2_exp.h"

SDPA_DOT_TO(dot_avx2)

static inline __m256 flush_below_min(__m256 w) {
    return _mm256_andnot_ps(_mm256_cmp_ps(w, _mm256_set1_ps(FLT_MIN), _CMP_LT_OQ), w);
}

/* The factor 1 / sum for a row's weights e * factor, from its sum in every lane, such that no
 * weight exceeds 1 whatever the caller's rounding mode: -1 / sum, negated, is rounded the
 * mirror way of the mode (down where it rounds up, and up where it rounds down, where the
 * weight's own rounding then takes e * factor < 1 + 2^-23 down to at most 1), so e <= sum gives
 * weights <= 1; under round-to-nearest it is 1 / sum. One operation a row, where a min with 1
 * would take one a vector. Rows run only under round-to-nearest (EXP_MAGIC) take 1 / sum itself,
 * where e * fl(1 / sum) <= 1 + 2^-24 rounds to at most 1 without the negations (which cost rows
 * of 300 floats measurably more than their one operation). */
ALWAYS_INLINE __m256 row_factor(__m256 total, int kind, __m256 *keep_from) {
    *keep_from = total; /* no use: the flush follows the multiply (row_weight) */
    if (kind == EXP_MAGIC) return _mm256_div_ps(_mm256_set1_ps(1.0f), total);
    __m256 q = _mm256_div_ps(_mm256_set1_ps(-1.0f), total);
    /* opaque: the compiler assumes round-to-nearest, and would fold -(-1 / sum) to 1 / sum */
    __asm__("" : "+x"(q));
    return _mm256_xor_ps(q, _mm256_set1_ps(-0.0f));
}
ALWAYS_INLINE __m256 row_weight(__m256 e, __m256 factor, __m256 keep_from, int from_e) {
    (void)keep_from, (void)from_e;
    return flush_below_min(e * factor);
}

/* softmax_passes.h's exps_to_weights keeps no partial last vector in a register here: the
 * compares that adds cost the rows that fill their vectors (128 floats) about what it saves the
 * others */
#define ROW_KEEP_LAST 0
#include "row_kernels.h"
#include "score_stage_tile.h"
#include "softmax_passes.h"

/* Reading MXCSR waits for the floating-point work before it (its flags), which costs a short row
 * its overlap with the call before, more than the operation saved: rows shorter than this keep
 * roundps and read nothing. */
#define SHORT_MAGIC_FROM 256

/* Rows of up to 32 floats with the fast exp, in V = 1, 2 or 4 vectors that stay in registers
 * from their loads to their stores, where the three passes store the weights and load them
 * again (as on avx512): in a row this short, that store and reload are a large part of the work.
 * Vectors past the row's end are skipped. SLEEF's exp, a call, keeps the three passes.
 * Vectors before `last` are whole, `last` has lm's lanes, those after it are skipped: one mask
 * register, not one a vector (16 registers are few). */

/* the exps of z against c's shift (less it unless folded), their sum in every lane, and the
 * weights e / sum: a division a vector, no slower here than 1 / sum and a multiply a vector
 * (measured at 8 to 32 floats). Each weight is its quotient rounded once, so e <= sum gives at
 * most 1 in every rounding mode, and a row of one entry exactly 1, where e * fl(1 / e) may be
 * 1 - 2^-24. */
ALWAYS_INLINE void regs_weights(float *y, __m256 *z, const int V, size_t last, __m256i lm,
                                const row_exp *c, int folded) {
    __m256 a[4];
    EACH_VECTOR for (int k = 0; k < V; k++) {
        a[k] = _mm256_setzero_ps();
        if ((size_t)k < last + 1) {
            z[k] = exp_row(folded ? z[k] : _mm256_sub_ps(z[k], c->shift), c, 0);
            if ((size_t)k == last) z[k] = _mm256_and_ps(z[k], _mm256_castsi256_ps(lm));
            a[k] = z[k];
        }
    }
    if (V > 2) a[0] = a[0] + a[2], a[1] = a[1] + a[3];
    if (V > 1) a[0] = a[0] + a[1];
    const __m256 sum = vf_allsum(a[0]);
    EACH_VECTOR for (int k = 0; k < V; k++) {
        const __m256 w = flush_below_min(_mm256_div_ps(z[k], sum));
        if ((size_t)k < last) _mm256_storeu_ps(y + k * W, w);
        if ((size_t)k == last) _mm256_maskstore_ps(y + k * W, lm, w);
    }
}

ALWAYS_INLINE float softmax_regs(float *y, const float *x, size_t n, __m256 vs, int unit,
                                 const int V) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    const size_t last = (n - 1) / W;
    const __m256i lm = tail_mask(n - last * W);
    __m256 z[4], a[4];
    EACH_VECTOR for (int k = 0; k < V; k++) {
        z[k] = ninf, a[k] = ninf;
        if ((size_t)k < last + 1) {
            z[k] =
                (size_t)k < last ? _mm256_loadu_ps(x + k * W) : _mm256_maskload_ps(x + k * W, lm);
            z[k] = scaled(z[k], vs, unit);
            a[k] = (size_t)k < last ? z[k] : _mm256_blendv_ps(ninf, z[k], _mm256_castsi256_ps(lm));
        }
    }
    if (V > 2) a[0] = _mm256_max_ps(a[0], a[2]), a[1] = _mm256_max_ps(a[1], a[3]);
    if (V > 1) a[0] = _mm256_max_ps(a[0], a[1]);
    const __m256 vmax = vf_allmax(a[0]);
    const float max = _mm256_cvtss_f32(vmax);
    const float g = sdpa_ends_guess(x, n, _mm256_cvtss_f32(vs));
    if (!isfinite(max)) return max;
    /* against the guessed shift when it holds (shift_guess.h): its fold does not wait for the max
     */
    if (sdpa_guess_fits(g, max)) {
        const row_exp c = row_exp_guess(_mm256_set1_ps(g), SDPA_EXP_FAST);
        regs_weights(y, z, V, last, lm, &c, 1);
        return max;
    }
    const int folded = fabsf(max) <= SDPA_EXP_FOLD_MAX;
    const row_exp c = row_exp_max(vmax, folded, SDPA_EXP_FAST);
    regs_weights(y, z, V, last, lm, &c, folded);
    return max;
}

ALWAYS_INLINE float softmax_short_passes_fast(float *y, const float *x, size_t n, float scale) {
    return softmax_passes_of(y, x, n, scale, SDPA_EXP_FAST);
}
ALWAYS_INLINE float softmax_short_passes_nearest(float *y, const float *x, size_t n, float scale) {
    return softmax_passes_of(y, x, n, scale, EXP_MAGIC);
}
ALWAYS_INLINE float softmax_short_sleef(float *y, const float *x, size_t n, float scale) {
    return softmax_passes_of(y, x, n, scale, SDPA_EXP_SLEEF);
}
SDPA_SHORT_ENTRY(softmax_short_passes_nearest)
SDPA_SHORT_ENTRY(softmax_short_passes_fast)
SDPA_SHORT_ENTRY(softmax_short_sleef)
/* rows of 256 floats and more: the magic-number rounding when the caller rounds to nearest. MXCSR
 * is read here, not in the dispatcher below, where its stack slot would give every row a frame. */
static __attribute__((noinline)) int softmax_short_long(float *y, const float *x, size_t n,
                                                        float scale) {
    return rounds_to_nearest() ? softmax_short_passes_nearest_entry(y, x, n, scale)
                               : softmax_short_passes_fast_entry(y, x, n, scale);
}
ALWAYS_INLINE float softmax_short_regs(float *y, const float *x, size_t n, float scale) {
    const __m256 vs = _mm256_set1_ps(scale);
    const int unit = scale == 1.0f;
    if (n <= W) return unit ? softmax_regs(y, x, n, vs, 1, 1) : softmax_regs(y, x, n, vs, 0, 1);
    if (n <= 2 * W) return unit ? softmax_regs(y, x, n, vs, 1, 2) : softmax_regs(y, x, n, vs, 0, 2);
    return unit ? softmax_regs(y, x, n, vs, 1, 4) : softmax_regs(y, x, n, vs, 0, 4);
}
static int softmax_short_fast(float *y, const float *x, size_t n, float scale) {
    if (n >= SHORT_MAGIC_FROM) return softmax_short_long(y, x, n, scale);
    if (n > 4 * W) return softmax_short_passes_fast_entry(y, x, n, scale);
    return sdpa_short_done(softmax_short_regs(y, x, n, scale), y, x, n, scale);
}

const sdpa_kernels sdpa_kernels_avx2 = {
    ROW_KERNELS(dot_avx2),
    SOFTMAX_PASSES_KERNELS(softmax_short_fast, softmax_short_sleef_entry),
    STAGE_TILE_ENTRIES,
    .attention = &sdpa_attention_kernels_avx2,
};
