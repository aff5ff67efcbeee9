/* Shared test helpers: run a test body on each backend, guarded buffers, random data. */
#ifndef SDPA_TESTS_COMMON_H
#define SDPA_TESTS_COMMON_H

#include <criterion/criterion.h>
#include <stddef.h>
#include <stdint.h>

#include "backends.h"
#include "sdpa.h"

/* SDPA_TEST_QUICK=1 (the emulated test setups, where qemu runs 20 to 140 times slower): tests
 * of a backend this CPU cannot run, or of a backend other than the one the setup is there to
 * prove, are skipped before a worker process is spawned for them (see common.c), and the
 * exhaustive sweeps sample more sparsely. */
int test_quick(void);

/* Makes `name` active (or skips the test), and checks that it really is. */
void use_backend(const char *name);

/* BACKEND_TEST(suite, name) { body } defines suite::name_<backend> for every backend name the
 * ABI knows (the generated list, backends.h): each runs the body on its backend, or skips,
 * visibly, when this library or CPU cannot run it. */
#define BACKEND_TEST_ONE_(suite, name, b, ...)                                                     \
    Test(suite, name##_##b) {                                                                      \
        use_backend(#b);                                                                           \
        suite##_##name##_body();                                                                   \
    }
#define BACKEND_TEST(suite, name)                                                                  \
    static void suite##_##name##_body(void);                                                       \
    SDPA_BACKENDS(BACKEND_TEST_ONE_, suite, name)                                                  \
    static void suite##_##name##_body(void)

/* n floats placed so that the last one ends exactly where a PROT_NONE page begins
 * (GUARD_AFTER), or the first one starts exactly where a PROT_NONE page ends (GUARD_BEFORE):
 * any read or write outside [p, p + n) faults. */
enum guard_side { GUARD_AFTER, GUARD_BEFORE };
typedef struct guarded {
    float *p;
    void *map;
    size_t map_len;
} guarded;
guarded guard_alloc(size_t n, enum guard_side side);
void guard_free(guarded *g);

/* Deterministic uniform random numbers in [lo, hi). */
typedef struct rng {
    uint64_t s;
} rng;
rng rng_seed(uint64_t seed);
double rng_uniform(rng *r, double lo, double hi);
double rng_normal(rng *r);
void fill_uniform(rng *r, float *x, size_t n, float lo, float hi);
void fill_normal(rng *r, float *x, size_t n); /* unit normal */

/* Aligned allocation plus an offset in floats (0..3) from a 64-byte boundary. */
float *alloc_offset(size_t n, size_t offset, void **base);

/* Sizes every kernel is tested at: 0..70, then around powers of two and beyond. */
extern const size_t TEST_SIZES[];
extern const size_t N_TEST_SIZES;

/* Sets (1) or clears (0) flush-to-zero and denormals-are-zero: MXCSR's FTZ and DAZ on x86-64,
 * FPCR.FZ on AArch64. */
void set_ftz_daz(int on);

/* The floating-point control bits: MXCSR's exception masks, rounding, FTZ and DAZ on x86-64 (not
 * its sticky exception flags, which any arithmetic sets), FPCR on AArch64; 0 elsewhere. */
uint64_t fp_control_word(void);

/* A recognisable bit pattern to check that outputs were not written on error. */
#define SENTINEL 12345.678f

#endif
