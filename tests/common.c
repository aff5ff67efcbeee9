#include "common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void use_backend(const char *name) {
    if (!sdpa_backend_supported(name))
        cr_skip_test("backend %s is not compiled in or not supported by this CPU", name);
    cr_assert_eq(sdpa_set_backend(name), SDPA_OK, "sdpa_set_backend(%s)", name);
    cr_assert_str_eq(sdpa_backend(), name, "forced backend is not the active one");
}

guarded guard_alloc(size_t n, enum guard_side side) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t bytes = n * sizeof(float);
    size_t data_pages = (bytes + page - 1) / page;
    if (data_pages == 0) data_pages = 1;
    guarded g;
    g.map_len = (data_pages + 1) * page;
    g.map = mmap(NULL, g.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(g.map, MAP_FAILED, "mmap");
    char *base = g.map;
    if (side == GUARD_AFTER) {
        char *guard = base + data_pages * page;
        cr_assert_eq(mprotect(guard, page, PROT_NONE), 0);
        g.p = (float *)(guard - bytes);
    } else {
        cr_assert_eq(mprotect(base, page, PROT_NONE), 0);
        g.p = (float *)(base + page);
    }
    return g;
}

void guard_free(guarded *g) { munmap(g->map, g->map_len); }

rng rng_seed(uint64_t seed) {
    rng r = {seed * 0x9E3779B97F4A7C15ull + 1};
    return r;
}

static uint64_t next(rng *r) { /* splitmix64 */
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double rng_uniform(rng *r, double lo, double hi) {
    return lo + (hi - lo) * ((double)(next(r) >> 11) * 0x1p-53);
}

double rng_normal(rng *r) {
    double u = rng_uniform(r, 0x1p-53, 1.0), v = rng_uniform(r, 0.0, 1.0);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

void fill_uniform(rng *r, float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = (float)rng_uniform(r, lo, hi);
}

float *alloc_offset(size_t n, size_t offset, void **base) {
    *base = aligned_alloc(64, ((n + offset) * sizeof(float) + 63) / 64 * 64 + 64);
    cr_assert_not_null(*base);
    return (float *)*base + offset;
}

const size_t TEST_SIZES[] = {
    0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11,  12,  13,  14,   15,   16,   17, 18, 19,
    20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,  32,  33,  34,   35,   36,   37, 38, 39,
    40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51,  52,  53,  54,   55,   56,   57, 58, 59,
    60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 127, 128, 129, 1000, 4097, 65537};
const size_t N_TEST_SIZES = sizeof TEST_SIZES / sizeof TEST_SIZES[0];
