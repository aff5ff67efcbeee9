/* Internal: the score stage, what happens to a score between the product and the softmax.
 *
 * The product kernels give s = scale * q.k (the scale is the one step fused into them). The
 * stage then applies, per row of a tile and in this order: the softcap, s = c tanh(s / c); ALiBi,
 * s += slope (j - p_i); the additive mask; and the removal of keys outside the row's segment or
 * at a mask entry of -inf (weight exactly 0, value never read). Which run of keys a row may see
 * at all (causality, the window) is not the stage's: visibility.h decides it per block. A sink
 * joins each row's softmax denominator at the end (score_stage_sink). */
#ifndef SDPA_SRC_SCORE_STAGE_H
#define SDPA_SRC_SCORE_STAGE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

/* Row i of a unit (a query row, or for grouped decode a query head) and key j of its keys. */
typedef struct score_stage {
    const float *mask; /* row i's entries at mask + i * mask_row; NULL: none */
    size_t mask_row;
    float softcap;            /* 0: none */
    const float *alibi;       /* row i's slope at alibi[i * head_row]; NULL: none */
    const float *sinks;       /* row i's sink at sinks[i * head_row]; NULL: none */
    size_t head_row;          /* 0 when the unit is one head's rows, 1 when its rows are heads */
    ptrdiff_t shift;          /* p_i = i * row_step + shift, as the visibility's */
    size_t row_step;          /* 1, or 0 for heads of one query row */
    const int32_t *q_segment; /* row i's at q_segment[i * row_step]; NULL: none */
    const int32_t *k_segment; /* key j's at k_segment[j] */
} score_stage;

/* The stage of batch entry b and query head h of problem p (score_mods.c): for rows that are
   that head's query rows, or (heads_as_rows, grouped decode) heads h, h + 1, ... of one query
   row; shift as the visibility's; the mask rows given. */
struct attention_problem;
score_stage score_stage_of(const struct attention_problem *p, size_t b, size_t h, int heads_as_rows,
                           ptrdiff_t shift, const float *mask, size_t mask_row);

/* The stage does nothing past the product's scale, so a tile may go from the product straight
   to the softmax (the fused path). */
static inline int score_stage_is_scale(const score_stage *st) {
    return !st->mask && st->softcap == 0.0f && !st->alibi && !st->q_segment;
}

/* The same stage on its keys from k0 on, numbered from 0 (a split-KV chunk). */
static inline score_stage score_stage_from(const score_stage *st, size_t k0) {
    score_stage r = *st;
    if (r.mask) r.mask += k0;
    if (r.k_segment) r.k_segment += k0;
    r.shift -= (ptrdiff_t)k0;
    return r;
}

/* The stage only changes scores, removing no key: it may run on a whole tile (the fused path). */
static inline int score_stage_keeps_keys(const score_stage *st) {
    return !st->mask && !st->q_segment;
}

/* Whether the stage removes key j of row i. */
static inline int score_stage_removes(const score_stage *st, size_t i, size_t j) {
    if (st->q_segment && st->q_segment[i * st->row_step] != st->k_segment[j]) return 1;
    return st->mask && st->mask[i * st->mask_row + j] == -INFINITY;
}

/* The softcap of n scores, c tanh(s / c), where the backend has no stage_tile: the formula of
   arch/score_stage_tile.h, for a = |s| / c >= 1/4 tanh a = (1 - t) / (1 + t) with t = exp(-2a)
   from the backend's exp (exp_sum: y = exp(scale x - shift)), below the series to a^9; with
   deriv, 1 - tanh^2 (the backward's). t is n floats of scratch, and may be deriv. */
static inline void score_stage_softcap(float *s, size_t n, float c, float *t, float *deriv,
                                       float (*exp_sum)(float *, const float *, size_t, float,
                                                        float)) {
    for (size_t j = 0; j < n; j++) t[j] = fabsf(s[j]);
    exp_sum(t, t, n, -2.0f / c, 0.0f);
    const float inv_c = 1.0f / c;
    for (size_t j = 0; j < n; j++) { /* both forms, then a select: the loop vectorises */
        const float a = fabsf(s[j]) * inv_c, a2 = a * a;
        const float series =
            a * (1.0f - a2 * (1.0f / 3.0f - a2 * (2.0f / 15.0f -
                                                  a2 * (17.0f / 315.0f - a2 * (62.0f / 2835.0f)))));
        const float ratio = (1.0f - t[j]) / (1.0f + t[j]);
        const float th = a < 0.25f ? series : ratio;
        if (deriv) deriv[j] = 1.0f - th * th;
        s[j] = copysignf(c * th, s[j]);
    }
}

/* The kernels the stage runs on: the backend's stage_tile of the call's exp kind (NULL: the
   loops here, with its exp_sum). */
typedef float stage_exp_sum(float *y, const float *x, size_t n, float scale, float shift);
typedef struct stage_kernels {
    void (*tile)(const sdpa_stage_tile *t);
    stage_exp_sum *exp_sum;
} stage_kernels;

/* Those of table k, for a run whose exp_sum is one of k's. */
static inline stage_kernels stage_kernels_of(const sdpa_kernels *k, stage_exp_sum *exp_sum) {
    const int kind = exp_sum == k->exp_sum[SDPA_EXP_SLEEF] ? SDPA_EXP_SLEEF : SDPA_EXP_FAST;
    return (stage_kernels){k->stage_tile[kind], exp_sum};
}

/* Row i's scores s of keys [k0, k0 + n) through the stage; t is n floats of scratch. Returns 0
   if it removed a key. */
static inline int score_stage_row(const score_stage *st, size_t i, size_t k0, float *s, size_t n,
                                  float *t, const stage_kernels *kn) {
    const ptrdiff_t p = (ptrdiff_t)i * (ptrdiff_t)st->row_step + st->shift;
    if (kn->tile && (st->softcap != 0.0f || st->alibi)) {
        const float dist = (float)((ptrdiff_t)k0 - p);
        const sdpa_stage_tile tile = {
            s,     n,   1, n, st->softcap, 1, NULL, st->alibi ? st->alibi + i * st->head_row : NULL,
            &dist, NULL};
        kn->tile(&tile);
    } else {
        if (st->softcap != 0.0f) score_stage_softcap(s, n, st->softcap, t, NULL, kn->exp_sum);
        if (st->alibi) {
            const float slope = st->alibi[i * st->head_row];
            for (size_t j = 0; j < n; j++) s[j] += slope * (float)((ptrdiff_t)(k0 + j) - p);
        }
    }
    int all = 1;
    if (st->mask) {
        const float *m = st->mask + i * st->mask_row + k0;
        for (size_t j = 0; j < n; j++) {
            if (m[j] == -INFINITY) {
                s[j] = -INFINITY;
                all = 0;
            } else {
                s[j] += m[j];
            }
        }
    }
    if (st->q_segment) {
        const int32_t seg = st->q_segment[i * st->row_step], *ks = st->k_segment + k0;
        for (size_t j = 0; j < n; j++)
            if (ks[j] != seg) {
                s[j] = -INFINITY;
                all = 0;
            }
    }
    return all;
}

/* ALiBi's slopes and distances k0 - p_i of rows i0 + r (r < nq <= SDPA_ATTN_MAX_BLOCK_Q) for a
   key-major tile from key k0 (sdpa_stage_tile's slope and dist); the distance is an integer held
   exactly in float (|k0 - p_i| < 2^24), so each bias is one rounding, as in score_stage_row. */
static inline void score_stage_alibi_rows(const score_stage *st, size_t i0, size_t nq, size_t k0,
                                          float *slope, float *dist) {
    for (size_t r = 0; r < nq; r++) {
        const size_t i = i0 + r;
        const ptrdiff_t p = (ptrdiff_t)i * (ptrdiff_t)st->row_step + st->shift;
        slope[r] = st->alibi[i * st->head_row];
        dist[r] = (float)((ptrdiff_t)k0 - p);
    }
}

/* The stage's softcap and ALiBi on a key-major tile, s[j * ld + r] for rows i0 + r (r < n, the
   first nq of them real, the others zeros that stay zeros) and keys k0 + j (j < nk); with
   deriv, the softcap's derivative 1 - tanh^2 (as s); with max, each real row's max over the
   stage's scores, NaN if one is NaN. t is nk * ld floats of scratch (it may be deriv). The loops
   run over r, the contiguous axis, so that they vectorise where the backend has no stage_tile. */
static inline void score_stage_keymajor(const score_stage *st, float *s, size_t ld, size_t n,
                                        size_t i0, size_t nq, size_t k0, size_t nk, float *max,
                                        float *deriv, float *t, const stage_kernels *kn) {
    float slope[SDPA_ATTN_MAX_BLOCK_Q] = {0}, dist[SDPA_ATTN_MAX_BLOCK_Q] = {0};
    if (st->alibi) score_stage_alibi_rows(st, i0, nq, k0, slope, dist);
    if (kn->tile) {
        const sdpa_stage_tile tile = {
            s, ld, nk, n, st->softcap, 0, deriv, st->alibi ? slope : NULL, dist, max};
        kn->tile(&tile);
        return;
    }
    if (st->softcap != 0.0f) score_stage_softcap(s, nk * ld, st->softcap, t, deriv, kn->exp_sum);
    if (st->alibi)
        for (size_t j = 0; j < nk; j++) {
            float *row = s + j * ld;
            const float jf = (float)j;
            for (size_t r = 0; r < nq; r++) row[r] += slope[r] * (dist[r] + jf);
        }
    if (!max) return;
    int nan = 0;
    for (size_t r = 0; r < nq; r++) max[r] = -INFINITY;
    for (size_t j = 0; j < nk; j++) {
        const float *row = s + j * ld;
        for (size_t r = 0; r < nq; r++) {
            max[r] = row[r] > max[r] ? row[r] : max[r];
            nan |= row[r] != row[r];
        }
    }
    if (nan)
        for (size_t r = 0; r < nq; r++) max[r] = NAN;
}

/* Each real row's max over a key-major tile, as score_stage_keymajor's with no step to apply. */
static inline void score_stage_keymajor_max(float *s, size_t ld, size_t n, size_t nq, size_t nk,
                                            float *max, const stage_kernels *kn) {
    const score_stage none = {0};
    score_stage_keymajor(&none, s, ld, n, 0, nq, 0, nk, max, NULL, NULL, kn);
}

/* Row i's sink, -inf for none. */
static inline float score_stage_sink(const score_stage *st, size_t i) {
    return st->sinks ? st->sinks[i * st->head_row] : -INFINITY;
}

#endif
