/* The row kernels of every backend, written once: scale, max_scaled, exp_sum and
 * exp_sum_max, normalize, softmax_backward and the exp entry (arch/kernels.h says what each
 * does). A backend file includes this after its ISA's vector operations and row exps, and so
 * compiles each kernel at its own vector width W: one source, many targets, as in Highway. What
 * an ISA does its own way comes in through those operations: the tails (under a mask on avx512
 * and avx2, element by element on sse and neon), each ISA's exps and how many run side by side.
 * No sum starts at an address-dependent point: its split, and so its order, follows n alone, so
 * that the same values anywhere give the same bits. Only the loops whose results no split can
 * change (scale and normalize, element by element, and the max, which is exact) take a head to
 * a line boundary on avx512 (vf_lead).
 *
 * What they use of the vector vocabulary (arch/x86/<isa>.h, arch/arm/neon.h,
 * arch/scalar/scalar.h; all of it in docs/porting.md), + - * being the compiler's operators:
 *   vf, W       a vector of W floats
 *   vf_load, vf_store, vf_set1, vf_first (lane 0), vf_max and vf_min (b where either is NaN, on
 *               x86), vf_hsum and vf_hmax (across the lanes)
 *   vpart       the lanes of a row's last vector: vpart_first(len) is lanes [0, len), with
 *               vf_load_part (0 in the other lanes), vf_store_part, and vf_max_part and
 *               vf_add_part (acc in the other lanes)
 *   vf_lead(p)  floats from p to where the element-wise and max loops start (0: no alignment)
 *   rounds_to_nearest()  whether the caller's rounding mode is round-to-nearest
 * Row exps (<isa>_exp.h; arch/row_exp_plain.h where the exps take no fold):
 *   row_exp     the constants of one row's exps, from row_exp_shift(shift, folded)
 *   row_exps(z, count, c, kind)  z[u] = exp(z[u] - shift) for u < count, side by side, with
 *               z[u] already less the shift unless folded (exp_constants.h, "A row's shift")
 *   row_exp_folds(kind); row_exp_nearest(kind), the faster form of kind for callers that round
 *               to nearest (or kind); exp_whole(x, c, kind), the exp entry's, whole range
 *   row_sums_after(kind)  exp_sum sums in a second pass over y, in L1, rather than keeping its
 *               sums in registers across exps that are calls
 *   ROW_EXPS, ROW_SUMS  the vectors exp_sum keeps in flight, and its lane sums
 * Weights: row_weight(e, factor, keep_from, from_e) = e * factor, those below FLT_MIN flushed
 *   to 0, decided from e against keep_from when from_e and the ISA can. */
#ifndef SDPA_ARCH_ROW_KERNELS_H
#define SDPA_ARCH_ROW_KERNELS_H

#include <math.h>
#include <stddef.h>

#include "convert_rows.h"
#include "kernels.h"

/* a loop over a constant number of vectors, unrolled so that each one is a named register (an
 * array in a loop left rolled stays in memory) */
#define EACH_VECTOR _Pragma("GCC unroll 8")

/* z = scale * x, or x itself for scale 1 (unit), where the multiply is skipped */
ALWAYS_INLINE vf scaled(vf x, vf vs, int unit) {
    if (!unit) x = x * vs;
    return x;
}

/* one vector at p: whole, or the lanes of part */
ALWAYS_INLINE vf load_some(const float *p, vpart part, int whole) {
    return whole ? vf_load(p) : vf_load_part(p, part);
}
ALWAYS_INLINE void store_some(float *p, vpart part, int whole, vf v) {
    if (whole)
        vf_store(p, v);
    else
        vf_store_part(p, part, v);
}

/* y = alpha x: four vectors a step, all loaded before any is stored (y may be x), unless the ISA
 * defines ROW_AUTO_VECTORS (scalar: its compiler vectorises the one-element loop, with its own
 * check of y against x, where it leaves four elements a step one vector of SSE) */
static void scale_row(float *y, const float *x, size_t n, float alpha) {
    const vf va = vf_set1(alpha);
    size_t i = 0;
    if (n >= 4 * W && vf_lead(y)) { /* the stores to a line boundary (and x with them) */
        i = vf_lead(y);
        const vpart part = vpart_first(i);
        vf_store_part(y, part, va * vf_load_part(x, part));
    }
#ifndef ROW_AUTO_VECTORS
    for (; i + 4 * W <= n; i += 4 * W) {
        vf x0 = vf_load(x + i), x1 = vf_load(x + i + W);
        vf x2 = vf_load(x + i + 2 * W), x3 = vf_load(x + i + 3 * W);
        vf_store(y + i, va * x0);
        vf_store(y + i + W, va * x1);
        vf_store(y + i + 2 * W, va * x2);
        vf_store(y + i + 3 * W, va * x3);
    }
#endif
    for (; i + W <= n; i += W) vf_store(y + i, va * vf_load(x + i));
    if (i < n) {
        const vpart part = vpart_first(n - i);
        vf_store_part(y + i, part, va * vf_load_part(x + i, part));
    }
}

/* the lane maxima of z = scale * x (x itself when unit), -inf in a lane no z reached */
ALWAYS_INLINE vf max_lanes(const float *x, size_t n, vf vs, int unit) {
    vf m0 = vf_set1(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    size_t i = 0;
    if (n >= 4 * W && vf_lead(x)) { /* x to a line boundary */
        i = vf_lead(x);
        const vpart part = vpart_first(i);
        m1 = vf_max_part(m1, part, scaled(vf_load_part(x, part), vs, unit));
    }
    for (; i + 4 * W <= n; i += 4 * W) {
        m0 = vf_max(scaled(vf_load(x + i), vs, unit), m0);
        m1 = vf_max(scaled(vf_load(x + i + W), vs, unit), m1);
        m2 = vf_max(scaled(vf_load(x + i + 2 * W), vs, unit), m2);
        m3 = vf_max(scaled(vf_load(x + i + 3 * W), vs, unit), m3);
    }
    for (; i + W <= n; i += W) m0 = vf_max(scaled(vf_load(x + i), vs, unit), m0);
    if (i < n) {
        const vpart part = vpart_first(n - i);
        m1 = vf_max_part(m1, part, scaled(vf_load_part(x + i, part), vs, unit));
    }
    return vf_max(vf_max(m0, m1), vf_max(m2, m3));
}

static float max_scaled_row(const float *x, size_t n, float scale) {
    return vf_hmax(max_lanes(x, n, vf_set1(scale), 0));
}

/* kernels.h's rows_finite: x * 0 is 0 for a finite x and NaN for an inf or a NaN, so the sum of
 * those products (exact: every term is a zero) is 0 exactly when every element is finite. One
 * call for a block's rows, with no reduction per row. */
static int rows_finite_row(const float *x, size_t stride, size_t n, size_t d) {
    const vf zero = vf_zero();
    vf a0 = zero, a1 = zero;
    for (size_t j = 0; j < n; j++) {
        const float *row = x + j * stride;
        size_t i = 0;
        for (; i + 2 * W <= d; i += 2 * W) {
            a0 += vf_load(row + i) * zero;
            a1 += vf_load(row + i + W) * zero;
        }
        for (; i < d; i += W)
            a0 +=
                (d - i >= W ? vf_load(row + i) : vf_load_part(row + i, vpart_first(d - i))) * zero;
    }
    return vf_hsum(a0 + a1) == 0.0f;
}

ALWAYS_INLINE void normalize_one(float *y, vf factor, vf keep_from, int from_e, vpart part,
                                 int whole) {
    store_some(y, part, whole, row_weight(load_some(y, part, whole), factor, keep_from, from_e));
}

/* y[i] = row_weight(y[i], factor, keep_from, from_e). The vectors after an unrolled loop, here
 * and below, run whole and then the last one partial: under a mask each, vmaskmovps's stores
 * cost avx2 more than the compares. */
ALWAYS_INLINE void normalize_lanes(float *y, size_t n, vf factor, vf keep_from, int from_e) {
    size_t i = 0;
    if (n >= 4 * W && vf_lead(y)) {
        i = vf_lead(y);
        const vpart part = vpart_first(i);
        vf_store_part(y, part, row_weight(vf_load_part(y, part), factor, keep_from, from_e));
    }
    for (; i + 2 * W <= n; i += 2 * W) {
        vf w[2];
        EACH_VECTOR for (int u = 0; u < 2; u++) w[u] =
            row_weight(vf_load(y + i + u * W), factor, keep_from, from_e);
        EACH_VECTOR for (int u = 0; u < 2; u++) vf_store(y + i + u * W, w[u]);
    }
    for (; i < n; i += W)
        if (n - i >= W)
            normalize_one(y + i, factor, keep_from, from_e, vpart_first(W), 1);
        else
            normalize_one(y + i, factor, keep_from, from_e, vpart_first(n - i), 0);
}

static void normalize_row(float *y, size_t n, float factor) {
    normalize_lanes(y, n, vf_set1(factor), vf_set1(0.0f), 0);
}

ALWAYS_INLINE void softmax_backward_one(float *dx, const float *y, const float *dy, vf vs, vf vd,
                                        vpart part, int whole) {
    const vf t = load_some(dy, part, whole) - vd;
    store_some(dx, part, whole, (vs * load_some(y, part, whole)) * t);
}

static void softmax_backward_row(float *dx, const float *y, const float *dy, size_t n, float scale,
                                 float y_dot_dy) {
    const vf vs = vf_set1(scale), vd = vf_set1(y_dot_dy);
    for (size_t i = 0; i < n; i += W)
        if (n - i >= W)
            softmax_backward_one(dx + i, y + i, dy + i, vs, vd, vpart_first(W), 1);
        else
            softmax_backward_one(dx + i, y + i, dy + i, vs, vd, vpart_first(n - i), 0);
}

/* z = scale * x, into the lane maxima vmax (not NULL) */
ALWAYS_INLINE vf scaled_max(const float *x, vf vs, int unit, vpart part, int whole, vf *vmax) {
    const vf z = scaled(load_some(x, part, whole), vs, unit);
    if (vmax) *vmax = whole ? vf_max(z, *vmax) : vf_max_part(*vmax, part, z);
    return z;
}
/* one vector of the exp pass (exp_sum_lanes), into sum when not NULL */
ALWAYS_INLINE void exp_sum_one(float *y, const float *x, vf vs, const row_exp *c, int kind,
                               int unit, int folded, vpart part, int whole, vf *sum, vf *vmax) {
    vf z = scaled_max(x, vs, unit, part, whole, vmax);
    if (!folded) z = z - c->shift;
    row_exps(&z, 1, c, kind);
    store_some(y, part, whole, z);
    if (sum && whole) *sum = *sum + z;
    if (sum && !whole) *sum = vf_add_part(*sum, part, z);
}

/* ROW_EXPS vectors z into `count` accumulators acc, their sums or (max) maxima: z[u] and
 * z[u + count] meet first, so that each accumulator is a chain of one operation a step */
ALWAYS_INLINE void accumulate(vf *acc, const int count, const vf *z, int max) {
    vf t[ROW_EXPS];
    EACH_VECTOR for (int u = 0; u < ROW_EXPS; u++) {
        if (u < count)
            t[u] = z[u];
        else if (max)
            t[u % count] = vf_max(t[u % count], z[u]);
        else
            t[u % count] = t[u % count] + z[u];
    }
    EACH_VECTOR for (int k = 0; k < count; k++) {
        if (max)
            acc[k] = vf_max(t[k], acc[k]);
        else
            acc[k] = acc[k] + t[k];
    }
}

/* one vector of the sums after the exp pass */
ALWAYS_INLINE void sum_one(const float *y, const float *x, vf vs, int unit, vpart part, int whole,
                           vf *sum, vf *vmax) {
    scaled_max(x, vs, unit, part, whole, vmax);
    if (whole)
        *sum = *sum + vf_load(y);
    else
        *sum = vf_add_part(*sum, part, vf_load_part(y, part));
}

/* The lane sum a tail vector at i (after the steps of ROW_EXPS vectors) goes into: the first,
 * unless the ISA spreads them as its steps do (scalar's, i mod ROW_SUMS). */
#ifndef ROW_TAIL_SUM
#define ROW_TAIL_SUM(i) 0
#endif

/* the sum of ROW_SUMS lane sums, neighbours first: (s0 + s1) + (s2 + s3) */
ALWAYS_INLINE vf sum_of_lanes(const vf *s) {
    vf t = s[0] + s[1];
    EACH_VECTOR for (int u = 2; u < ROW_SUMS; u += 2) t = t + (s[u] + s[u + 1]);
    return t;
}

/* The exp pass: y[i] = exp(z - shift), z = scale * x rounded before the shift is subtracted, as
 * sdpa.h defines z (no fused multiply-subtract: a fused one gets exp of its product's rounding
 * error, inf or 0 once |z| > ~1e9, and a NaN row: tests/test_regressions.c). Returns the lane
 * sums unreduced (softmax_short reduces them in registers) and, with vmax (not NULL), stores the
 * lane maxima of z (exp_sum_max). ROW_EXPS exps side by side in each step keep the pipes busy
 * through the exp's dependency chain. */
ALWAYS_INLINE vf exp_sum_lanes(float *y, const float *x, size_t n, vf vs, const row_exp *c,
                               int kind, int unit, int folded, vf *vmax) {
    vf s[ROW_SUMS], m[2] = {vf_set1(-INFINITY), vf_set1(-INFINITY)};
    EACH_VECTOR for (int k = 0; k < ROW_SUMS; k++) s[k] = vf_set1(0.0f);
    size_t i = 0;
    if (row_sums_after(kind)) {
        /* nothing stays in a register across a call (four lane sums and four arguments would be
           spilled and reloaded around each one): the exps first, then the sums (and maxima)
           from a second pass over y (and x), in L1 */
        for (; i + W <= n; i += W)
            exp_sum_one(y + i, x + i, vs, c, kind, unit, folded, vpart_first(W), 1, NULL, NULL);
        if (i < n)
            exp_sum_one(y + i, x + i, vs, c, kind, unit, folded, vpart_first(n - i), 0, NULL, NULL);
        for (i = 0; i + ROW_EXPS * W <= n; i += ROW_EXPS * W) {
            vf e[ROW_EXPS], z[ROW_EXPS];
            EACH_VECTOR for (int u = 0; u < ROW_EXPS; u++) {
                e[u] = vf_load(y + i + u * W);
                z[u] = scaled(vf_load(x + i + u * W), vs, unit);
            }
            accumulate(s, ROW_SUMS, e, 0);
            if (vmax) accumulate(m, 2, z, 1);
        }
        for (; i < n; i += W)
            if (n - i >= W)
                sum_one(y + i, x + i, vs, unit, vpart_first(W), 1, &s[ROW_TAIL_SUM(i)],
                        vmax ? &m[0] : NULL);
            else
                sum_one(y + i, x + i, vs, unit, vpart_first(n - i), 0, &s[ROW_TAIL_SUM(i)],
                        vmax ? &m[0] : NULL);
    } else {
        for (; i + ROW_EXPS * W <= n; i += ROW_EXPS * W) {
            vf z[ROW_EXPS];
            EACH_VECTOR for (int u = 0; u < ROW_EXPS; u++) z[u] =
                scaled(vf_load(x + i + u * W), vs, unit);
            if (vmax) accumulate(m, 2, z, 1);
            if (!folded) EACH_VECTOR for (int u = 0; u < ROW_EXPS; u++) z[u] = z[u] - c->shift;
            row_exps(z, ROW_EXPS, c, kind);
            EACH_VECTOR for (int u = 0; u < ROW_EXPS; u++) vf_store(y + i + u * W, z[u]);
            accumulate(s, ROW_SUMS, z, 0);
        }
        for (; i < n; i += W)
            if (n - i >= W)
                exp_sum_one(y + i, x + i, vs, c, kind, unit, folded, vpart_first(W), 1,
                            &s[ROW_TAIL_SUM(i)], vmax ? &m[0] : NULL);
            else
                exp_sum_one(y + i, x + i, vs, c, kind, unit, folded, vpart_first(n - i), 0,
                            &s[ROW_TAIL_SUM(i)], vmax ? &m[0] : NULL);
    }
    if (vmax) *vmax = vf_max(m[0], m[1]);
    return sum_of_lanes(s);
}

/* exp_sum (and its maxima) with one body for each of scale 1 and any other, and for a shift
 * folded into the exp or subtracted */
ALWAYS_INLINE float exp_sum_of(float *y, const float *x, size_t n, float scale, float shift,
                               vf *vmax, int kind) {
    const vf vs = vf_set1(scale);
    const int folded = row_exp_folds(kind) && fabsf(shift) <= SDPA_EXP_FOLD_MAX;
    const row_exp c = row_exp_shift(shift, folded);
    vf s;
    if (folded)
        s = scale == 1.0f ? exp_sum_lanes(y, x, n, vs, &c, kind, 1, 1, vmax)
                          : exp_sum_lanes(y, x, n, vs, &c, kind, 0, 1, vmax);
    else
        s = scale == 1.0f ? exp_sum_lanes(y, x, n, vs, &c, kind, 1, 0, vmax)
                          : exp_sum_lanes(y, x, n, vs, &c, kind, 0, 0, vmax);
    return vf_hsum(s);
}

/* an exp with a faster form for callers that round to nearest takes it only then: the rounding
 * mode is read once a call */
ALWAYS_INLINE float exp_sum_entry(float *y, const float *x, size_t n, float scale, float shift,
                                  vf *vmax, int kind) {
    if (row_exp_nearest(kind) != kind && rounds_to_nearest())
        return exp_sum_of(y, x, n, scale, shift, vmax, row_exp_nearest(kind));
    return exp_sum_of(y, x, n, scale, shift, vmax, kind);
}

ALWAYS_INLINE float exp_sum_max_of(float *y, const float *x, size_t n, float scale, float shift,
                                   float *max, int kind) {
    vf vmax;
    const float sum = exp_sum_entry(y, x, n, scale, shift, &vmax, kind);
    *max = vf_hmax(vmax);
    return sum;
}

static float exp_sum_fast(float *y, const float *x, size_t n, float scale, float shift) {
    return exp_sum_entry(y, x, n, scale, shift, NULL, SDPA_EXP_FAST);
}
static float exp_sum_sleef(float *y, const float *x, size_t n, float scale, float shift) {
    return exp_sum_entry(y, x, n, scale, shift, NULL, SDPA_EXP_SLEEF);
}
/* optional in a table: a backend without them leaves them unused */
__attribute__((unused)) static float exp_sum_max_fast(float *y, const float *x, size_t n,
                                                      float scale, float shift, float *max) {
    return exp_sum_max_of(y, x, n, scale, shift, max, SDPA_EXP_FAST);
}
__attribute__((unused)) static float exp_sum_max_sleef(float *y, const float *x, size_t n,
                                                       float scale, float shift, float *max) {
    return exp_sum_max_of(y, x, n, scale, shift, max, SDPA_EXP_SLEEF);
}

ALWAYS_INLINE void exp_array(float *y, const float *x, size_t n, int kind) {
    const row_exp c = row_exp_shift(0.0f, 0);
    for (size_t i = 0; i < n; i += W)
        if (n - i >= W)
            vf_store(y + i, exp_whole(vf_load(x + i), &c, kind));
        else
            vf_store_part(y + i, vpart_first(n - i),
                          exp_whole(vf_load_part(x + i, vpart_first(n - i)), &c, kind));
}
static void exp_array_fast(float *y, const float *x, size_t n) {
    exp_array(y, x, n, SDPA_EXP_FAST);
}
static void exp_array_sleef(float *y, const float *x, size_t n) {
    exp_array(y, x, n, SDPA_EXP_SLEEF);
}

/* The fields of a backend's table (arch/kernels.h) that come from this file and from the
 * backend's dot (DOT, with the DOT##_to that SDPA_DOT_TO makes of it). exp_sum_block: each of
 * the ROW_SUMS * W partial sums takes about 64 weights of a block, which keeps its float sum well
 * inside softmax's bound (or ROW_SUM_BLOCK, where the ISA sets it). */
#ifndef ROW_SUM_BLOCK
#define ROW_SUM_BLOCK (64 * ROW_SUMS * W)
#endif
#define ROW_KERNELS(DOT)                                                                           \
    .name = SDPA_BACKEND_NAME, .dot = DOT, .dot_to = DOT##_to, .scale = scale_row,                 \
    .max_scaled = max_scaled_row, .rows_finite = rows_finite_row,                                  \
    .exp_sum = {exp_sum_fast, exp_sum_sleef}, .exp_sum_block = ROW_SUM_BLOCK,                      \
    .normalize = normalize_row, .softmax_backward = softmax_backward_row,                          \
    .exp = {exp_array_fast, exp_array_sleef}, CONVERT_ENTRIES

#endif
