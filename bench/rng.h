/* The bench's random numbers: xorshift64 from fixed seeds, so that every run on every machine
 * measures the same values in the same orders. */
#ifndef SDPA_BENCH_RNG_H
#define SDPA_BENCH_RNG_H

#include <stddef.h>
#include <stdint.h>

#define RNG_SEED  0x9e3779b97f4a7c15u /* values */
#define POOL_SEED 0x2545f4914f6cdd1du /* orders: a paged pool's blocks, the roofline's rows */

static inline uint64_t rng_next(uint64_t *state) {
    uint64_t x = *state;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return *state = x;
}

/* uniform in [lo, hi], from the top 53 bits */
static inline float rng_uniform(uint64_t *state, float lo, float hi) {
    return lo + (hi - lo) * (float)((double)(rng_next(state) >> 11) * 0x1p-53);
}

/* p = a random permutation of 0 .. n-1 (Fisher-Yates), or with seed 0 (which xorshift cannot
 * leave) the identity; n <= INT32_MAX */
static inline void rng_permutation(int32_t *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) p[i] = (int32_t)i;
    for (size_t i = n; i > 1 && seed; i--) {
        const size_t r = (size_t)(rng_next(&seed) % i);
        const int32_t t = p[i - 1];
        p[i - 1] = p[r], p[r] = t;
    }
}

#endif
