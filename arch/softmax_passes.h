/* softmax_short's three passes (arch/kernels.h, softmax_short), written once for the backends
 * that run them (avx512, avx2): the max, the exps with their sum, and the weights of a row of
 * up to 4096 floats in one call, without the calls between the driver's passes, the max and the
 * sum reduced in registers, and 1 / sum in float. The exp pass is exp_sum's own loop
 * (arch/row_kernels.h, included before this file); the sum comes from ROW_SUMS * W partial sums
 * of about 4096 / (ROW_SUMS * W) weights each, as exp_sum's blocks do. Up to 4096 floats the
 * calls between the passes and the latency from one pass to the next are a visible part of the
 * row's time.
 *
 * The exps first run against a guessed shift (shift_guess.h, "A guessed shift"), when y and x are
 * apart, so that x is still there to start again from: the max comes beside the exps and checks
 * the guess after the stores. A row that fails the check finds its max first; a row whose y is x
 * finds its max first and then, where the guess holds, runs the same exps against it, so that
 * in place and apart give the same bits.
 * Against the max, the weights are exp(z - max) times one constant factor near 1, which the
 * division by their sum takes out: the exp needs no correction for its folded shift.
 *
 * Beyond row_kernels.h's, the ISA supplies vf_allsum and vf_allmax (the sum and the max of the
 * lanes, in every lane), ROW_KEEP_LAST (exps_to_weights), row_exp_guess(g, kind) and
 * row_exp_max(max, folded, kind) (the exps against a shift in every lane, without the fold's
 * correction), and row_factor(total, kind, &keep_from): the factor of the weights e * factor
 * (row_weight) of a row whose sum is in every lane of total, such that none exceeds 1 whatever the
 * caller's rounding mode. */
#ifndef SDPA_ARCH_SOFTMAX_PASSES_H
#define SDPA_ARCH_SOFTMAX_PASSES_H

#include "row_kernels.h"

/* The guess: the max of the row's two ends, z[0] and z[n - 1], from two broadcast loads, so
 * that the exps wait for neither the max nor its cross-lane reduction. */
ALWAYS_INLINE vf ends_guess(const float *x, size_t n, vf vs, int unit) {
    return vf_max(scaled(vf_set1(x[0]), vs, unit), scaled(vf_set1(x[n - 1]), vs, unit));
}

/* The exps of z = scale * x against c and their weights, with vmax (not NULL) the lane maxima of
 * z: whole vectors through exp_sum's loop. Where the ISA keeps the last (ROW_KEEP_LAST), a
 * partial last vector stays in a register from its exp to its store: a masked store followed by
 * a masked load of the same bytes is not forwarded cheaply, and a short row would pay for it. */
ALWAYS_INLINE void exps_to_weights(float *y, const float *x, size_t n, vf vs, const row_exp *c,
                                   int kind, int unit, int folded, vf *vmax) {
    const size_t head = ROW_KEEP_LAST ? n & ~(size_t)(W - 1) : n;
    const vpart last = vpart_first(n - head);
    vf sums = exp_sum_lanes(y, x, head, vs, c, kind, unit, folded, vmax);
    vf e = vf_set1(0.0f);
    if (head < n) {
        e = scaled(vf_load_part(x + head, last), vs, unit);
        if (vmax) *vmax = vf_max_part(*vmax, last, e);
        if (!folded) e = e - c->shift;
        row_exps(&e, 1, c, kind);
        sums = vf_add_part(sums, last, e);
    }
    vf keep_from;
    const vf factor = row_factor(vf_allsum(sums), kind, &keep_from);
    normalize_lanes(y, head, factor, keep_from, 1);
    if (head < n) vf_store_part(y + head, last, row_weight(e, factor, keep_from, 1));
}

/* Returns the row's max, or the guess it kept (finite), when y holds the softmax; else the max,
 * not finite, with y unwritten if it is x (SDPA_SHORT_ENTRY). */
ALWAYS_INLINE float softmax_passes(float *y, const float *x, size_t n, float scale, int unit,
                                   int kind) {
    const vf vs = vf_set1(scale);
    const vf g = ends_guess(x, n, vs, unit);
    const float gs = vf_first(g);
    const int apart = sdpa_apart(y, x, n);
    if (apart && sdpa_guess_usable(gs)) {
        const row_exp c = row_exp_guess(g, kind);
        vf vmax;
        exps_to_weights(y, x, n, vs, &c, kind, unit, row_exp_folds(kind), &vmax);
        const float max = vf_hmax(vmax);
        if (sdpa_guess_fits(gs, max)) return max;
    }
    const vf vmax = vf_allmax(max_lanes(x, n, vs, unit));
    const float max = vf_first(vmax);
    if (!isfinite(max)) return max;
    if (!apart && sdpa_guess_fits(gs, max)) {
        /* in place, the max first, then the weights that y apart from x gets: the same bits */
        const row_exp c = row_exp_guess(g, kind);
        exps_to_weights(y, x, n, vs, &c, kind, unit, row_exp_folds(kind), NULL);
        return max;
    }
    /* the sum is > 0.9 (the max gives about exp(0)), or NaN when x holds a NaN: so is every y */
    const int folded = row_exp_folds(kind) && fabsf(max) <= SDPA_EXP_FOLD_MAX;
    const row_exp c = row_exp_max(vmax, folded, kind);
    if (folded)
        exps_to_weights(y, x, n, vs, &c, kind, unit, 1, NULL);
    else
        exps_to_weights(y, x, n, vs, &c, kind, unit, 0, NULL);
    return max;
}

/* one body for scale 1 (no multiplies) and one for any other */
ALWAYS_INLINE float softmax_passes_of(float *y, const float *x, size_t n, float scale, int kind) {
    return scale == 1.0f ? softmax_passes(y, x, n, 1.0f, 1, kind)
                         : softmax_passes(y, x, n, scale, 0, kind);
}

/* the fields of the table of a backend with these passes: exp_sum_max (row_kernels.h) and its
 * softmax_short entries */
#define SOFTMAX_PASSES_KERNELS(FAST, SLEEF)                                                        \
    .exp_sum_max = {exp_sum_max_fast, exp_sum_max_sleef}, .softmax_short = {FAST, SLEEF}

#endif
