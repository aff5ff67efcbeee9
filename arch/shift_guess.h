/* Internal: the rules of a guessed softmax shift, shared by the softmax driver (src/) and the
 * short-row kernels of avx512 and avx2, which start their exps before the row's max is known. */
#ifndef SDPA_ARCH_SHIFT_GUESS_H
#define SDPA_ARCH_SHIFT_GUESS_H

#include <stddef.h>
#include <stdint.h>

#include "exp_constants.h"

/* A guessed shift (softmax_short on avx512 and avx2): exp(z - g) for every z of a row needs only
 * g <= max z, so that no weight of FLT_MIN or more is lost to the exp's lower clamp at g - 87.5,
 * and max z - g <= SDPA_SHIFT_GUESS_RANGE, so that the weights (up to e^64.7 with the fold's
 * rounding) and their sum (below 2^106 for 4096 of them) stay far from overflow and 1 / sum from
 * the subnormals; then softmax = exp(z - g) / sum exp(z - g) as well as with g = max z. A guess
 * from a few of the z (the row's ends) lets the exps start without waiting for the max, which is
 * still found, beside them, to check the guess; a row that fails the check (its ends 64 below its
 * max) is done again with the max. */
#define SDPA_SHIFT_GUESS_RANGE 64.0f
/* A capped guess (rows held in registers on avx512): no max at all. The exps take min(z, g + CAP)
 * and the row is kept when the sum of its weights exp(z - g') (g' <= g, g - g' < ln2: the guess's
 * fold) is at most GUESS_SUM_MAX. A capped z would weigh at least e^80 > GUESS_SUM_MAX, so a kept
 * row had no z capped, and its max is below g + 79.1: its weights and sum stay below 2^113 and
 * 1 / sum a normal float. NaN makes the sum NaN and +inf makes it e^80 or more: such rows, and
 * those whose max lies far above the guess, fail the test and are done again with their max. */
#define SDPA_GUESS_CAP     80.0f
#define SDPA_GUESS_SUM_MAX 0x1p113f
/* a guess g that folds: |g| within the magic number's integer range (false for inf and NaN) */
static inline int sdpa_guess_usable(float g) {
    return g >= -SDPA_EXP_FOLD_MAX && g <= SDPA_EXP_FOLD_MAX;
}
/* ... and that holds for a row whose max is `max` (g <= max always: g is the max of some z) */
static inline int sdpa_guess_fits(float g, float max) {
    return sdpa_guess_usable(g) && max <= g + SDPA_SHIFT_GUESS_RANGE;
}
/* the guess: the larger of a row's two ends, z[0] and z[n - 1] (n >= 1) */
static inline float sdpa_ends_guess(const float *x, size_t n, float scale) {
    const float first = scale * x[0], last = scale * x[n - 1];
    return first > last ? first : last;
}
/* y and x share no float: x is still whole after y is written, to start again from */
static inline int sdpa_apart(const float *y, const float *x, size_t n) {
    return (uintptr_t)y >= (uintptr_t)(x + n) || (uintptr_t)x >= (uintptr_t)(y + n);
}

#endif
