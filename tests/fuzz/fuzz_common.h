/* Shared pieces of the differential fuzzers (one file per entry-point family: fuzz_kernels.c
 * and fuzz_attention.c): a reader that turns fuzz bytes into sizes, flags
 * and float bit patterns; fenced buffers whose surroundings AddressSanitizer poisons and whose
 * canaries are checked after every call; the loop over every backend this CPU runs.
 *
 * Header-only (static functions) so that each fuzzer is one translation unit plus the library
 * sources; scripts/fuzz builds them. */
#ifndef SDPA_FUZZ_COMMON_H
#define SDPA_FUZZ_COMMON_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#include <sanitizer/asan_interface.h>
#define FUZZ_POISON(p, bytes)   ASAN_POISON_MEMORY_REGION(p, bytes)
#define FUZZ_UNPOISON(p, bytes) ASAN_UNPOISON_MEMORY_REGION(p, bytes)
#endif
#endif
#ifndef FUZZ_POISON
#define FUZZ_POISON(p, bytes)   ((void)(p), (void)(bytes))
#define FUZZ_UNPOISON(p, bytes) ((void)(p), (void)(bytes))
#endif

/* A contract violation: say what and where, then abort so libFuzzer saves the input. */
#define FUZZ_FAIL(...)                                                                             \
    do {                                                                                           \
        fprintf(stderr, "contract violation (%s, backend %s, exp %s): ", __func__, sdpa_backend(), \
                sdpa_exp_mode());                                                                  \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        abort();                                                                                   \
    } while (0)
#define FUZZ_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) FUZZ_FAIL(__VA_ARGS__);                                                       \
    } while (0)

/* ---- Reading the input ---- */

typedef struct fuzz_reader {
    const uint8_t *p;
    size_t left;
    uint64_t rng; /* once the bytes run out, values come from a generator seeded by them */
} fuzz_reader;

static inline fuzz_reader fuzz_reader_init(const uint8_t *data, size_t size) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a of the whole input */
    for (size_t i = 0; i < size; i++) h = (h ^ data[i]) * 0x100000001b3ull;
    fuzz_reader r = {data, size, h};
    return r;
}

static inline uint64_t fuzz_splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint8_t fuzz_u8(fuzz_reader *r) {
    if (r->left) {
        r->left--;
        return *r->p++;
    }
    return (uint8_t)fuzz_splitmix(&r->rng);
}

static inline uint32_t fuzz_u32(fuzz_reader *r) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v = v << 8 | fuzz_u8(r);
    return v;
}

static inline float fuzz_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t fuzz_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* The values that break kernels: signed zeros, the subnormal range, the edges of the normal
 * range, infinities, quiet and signalling NaNs, and the edges of the fast exp's clamp. */
static const float FUZZ_SPECIALS[] = {
    0.0f,      -0.0f,       1.0f,    -1.0f,    0x1p-149f,   -0x1p-149f, 0x1.fffffcp-127f,
    FLT_MIN,   -FLT_MIN,    FLT_MAX, -FLT_MAX, INFINITY,    -INFINITY,  NAN,
    -NAN,      1e-30f,      -1e-30f, 1e30f,    -1e30f,      87.33654f,  -87.33654f,
    88.72283f, -88.72283f,  -87.5f,  88.8f,    -103.97208f, 0.5f,       2.0f,
    1e-7f,     16777216.0f,
};
#define FUZZ_N_SPECIALS (sizeof FUZZ_SPECIALS / sizeof FUZZ_SPECIALS[0])

/* One float: mostly ordinary values in [-range, range], sometimes a special value or raw bits
 * (a signalling NaN with a payload, any subnormal); uniform in [-range, range] once the input
 * is used up, so that short inputs still fill long rows. */
static inline float fuzz_float(fuzz_reader *r, float range) {
    if (!r->left) {
        double u = (double)(fuzz_splitmix(&r->rng) >> 11) * 0x1p-53;
        return (float)((2.0 * u - 1.0) * range);
    }
    uint8_t c = fuzz_u8(r);
    if (c < 192) {
        int16_t v = (int16_t)(fuzz_u8(r) << 8 | fuzz_u8(r));
        return (float)v / 32768.0f * range;
    }
    if (c < 240) return FUZZ_SPECIALS[(c - 192) % FUZZ_N_SPECIALS];
    return fuzz_bits(fuzz_u32(r));
}

/* ---- Fenced buffers ---- */

/* FENCE floats of canary on each side of the data, plus `offset` floats of misalignment
 * (also canary) before it; all of it poisoned for AddressSanitizer, so any access outside
 * [p, p + n) is reported at the faulting instruction, and checked by value afterwards. */
#define FENCE       32
#define CANARY_BITS 0x7fa5a5a5u /* a NaN no kernel produces */

typedef struct fenced {
    float *p; /* the n floats */
    size_t n, offset;
    float *base;
} fenced;

static inline fenced fenced_alloc(size_t n, size_t offset) {
    fenced f;
    f.n = n;
    f.offset = offset;
    size_t total = FENCE + offset + n + FENCE;
    f.base = aligned_alloc(64, (total * sizeof(float) + 63) / 64 * 64);
    if (!f.base) abort();
    for (size_t i = 0; i < total; i++) f.base[i] = fuzz_bits(CANARY_BITS);
    f.p = f.base + FENCE + offset;
    FUZZ_POISON(f.base, (FENCE + offset) * sizeof(float));
    FUZZ_POISON(f.p + n, FENCE * sizeof(float));
    return f;
}

static inline void fenced_check(const fenced *f, const char *name) {
    FUZZ_UNPOISON(f->base, (FENCE + f->offset) * sizeof(float));
    FUZZ_UNPOISON(f->p + f->n, FENCE * sizeof(float));
    for (size_t i = 0; i < FENCE + f->offset; i++)
        FUZZ_CHECK(fuzz_to_bits(f->base[i]) == CANARY_BITS, "%s: written %zu floats before start",
                   name, FENCE + f->offset - i);
    for (size_t i = 0; i < FENCE; i++)
        FUZZ_CHECK(fuzz_to_bits(f->p[f->n + i]) == CANARY_BITS, "%s: written past end (+%zu)", name,
                   i);
    FUZZ_POISON(f->base, (FENCE + f->offset) * sizeof(float));
    FUZZ_POISON(f->p + f->n, FENCE * sizeof(float));
}

static inline void fenced_free(fenced *f) {
    FUZZ_UNPOISON(f->base, (FENCE + f->offset + f->n + FENCE) * sizeof(float));
    free(f->base);
}

/* Bitwise equality of n floats (for "untouched" and "inputs are const"). */
static inline int same_bits(const float *a, const float *b, size_t n) {
    return n == 0 || memcmp(a, b, n * sizeof(float)) == 0;
}

/* ---- Backends ---- */

/* Makes the next backend this CPU runs active, starting from *index (0 at first); returns 0,
 * with "auto" restored, when there is none left:
 *     for (size_t b = 0; next_backend(&b);) { ... runs once per backend ... } */
static inline int next_backend(size_t *index) {
    for (const char *name; (name = sdpa_backend_name(*index)) != NULL;) {
        ++*index;
        if (!sdpa_backend_supported(name)) continue;
        if (sdpa_set_backend(name) != SDPA_OK) FUZZ_FAIL("cannot select supported %s", name);
        return 1;
    }
    sdpa_set_backend("auto");
    return 0;
}

#endif
