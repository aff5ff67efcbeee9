/* Internal: the score stage, what happens to a score between the product and the softmax.
 *
 * The product kernels give s = scale * q.k (the scale is the one step fused into them). The
 * stage then applies, per row of a tile, what the call asks: today an additive float mask,
 * whose -inf entries remove a key (its weight is exactly 0 and its value is never read). The
 * score modifiers (softcap, ALiBi) join here. Which keys a row may see at all (causality,
 * windows, segments) is not the stage's: visibility.h decides that, per block. */
#ifndef SDPA_SRC_SCORE_STAGE_H
#define SDPA_SRC_SCORE_STAGE_H

#include <math.h>
#include <stddef.h>

typedef struct score_stage {
    const float *mask; /* row i's entries at mask + i * mask_row, from the stage's key 0; NULL */
    size_t mask_row;
} score_stage;

/* The stage does nothing past the product's scale, so a tile may go from the product straight
   to the softmax (the fused path). */
static inline int score_stage_is_scale(const score_stage *st) { return st->mask == NULL; }

/* The same stage from key k0 of its keys on (a split-KV chunk). */
static inline score_stage score_stage_from(const score_stage *st, size_t k0) {
    score_stage r = {st->mask ? st->mask + k0 : NULL, st->mask_row};
    return r;
}

/* Row i's scores s of keys [k0, k0 + n) through the stage. Returns 0 if it removed a key. */
static inline int score_stage_row(const score_stage *st, size_t i, size_t k0, float *s, size_t n) {
    if (!st->mask) return 1;
    const float *m = st->mask + i * st->mask_row + k0;
    int all = 1;
    for (size_t j = 0; j < n; j++) {
        if (m[j] == -INFINITY) {
            s[j] = -INFINITY;
            all = 0;
        } else {
            s[j] += m[j];
        }
    }
    return all;
}

/* Whether the stage removes key j of row i. */
static inline int score_stage_removes(const score_stage *st, size_t i, size_t j) {
    return st->mask && st->mask[i * st->mask_row + j] == -INFINITY;
}

#endif
