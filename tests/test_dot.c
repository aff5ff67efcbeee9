/* sdpa_dot_f32: accuracy at every size and alignment, no reads outside the inputs, special
 * values, errors. */
#include <math.h>
#include <stdlib.h>

#include "bounds.h"
#include "common.h"
#include "reference.h"

/* The documented bound is for n <= 4096; beyond, allow it to grow with n. */
static double dot_bound(const float *a, const float *b, size_t n) {
    double growth = n > 4096 ? (double)n / 4096.0 : 1.0;
    return bound_dot(growth * ref_dot_abs(a, b, n));
}

BACKEND_TEST(dot, sizes_and_offsets) {
    rng r = rng_seed(1);
    for (size_t s = 0; s < N_TEST_SIZES; s++) {
        size_t n = TEST_SIZES[s];
        for (size_t off = 0; off < 4; off++) {
            void *ba, *bb;
            float *a = alloc_offset(n, off, &ba), *b = alloc_offset(n, 3 - off, &bb);
            fill_uniform(&r, a, n, -1.0f, 1.0f);
            fill_uniform(&r, b, n, -1.0f, 1.0f);
            float got = SENTINEL;
            cr_assert_eq(sdpa_dot_f32(a, b, n, &got), SDPA_OK);
            double want = ref_dot(a, b, n);
            cr_assert(fabs(got - want) <= dot_bound(a, b, n), "n=%zu off=%zu: got %.9g want %.9g",
                      n, off, got, want);
            free(ba);
            free(bb);
        }
    }
}

BACKEND_TEST(dot, zero_length_stores_zero) {
    float got = SENTINEL;
    cr_assert_eq(sdpa_dot_f32(NULL, NULL, 0, &got), SDPA_OK);
    cr_assert_eq(got, 0.0f);
}

BACKEND_TEST(dot, large_values_and_cancellation) {
    /* sum of +-1e18 pairs plus small terms: the bound is relative to sum |a_i b_i| */
    enum { N = 1000 };
    float a[N], b[N];
    rng r = rng_seed(2);
    for (int i = 0; i < N; i++) {
        a[i] = (float)(i % 2 ? 1e9 : -1e9) * (float)rng_uniform(&r, 0.5, 1.5);
        b[i] = (float)rng_uniform(&r, 0.5, 1.5) * 1e9f;
    }
    float got;
    cr_assert_eq(sdpa_dot_f32(a, b, N, &got), SDPA_OK);
    cr_assert(fabs(got - ref_dot(a, b, N)) <= dot_bound(a, b, N));
}

BACKEND_TEST(dot, no_access_outside_inputs) {
    for (size_t n = 0; n <= 2 * 16 + 1; n++) {
        guarded ga = guard_alloc(n, GUARD_AFTER), gb = guard_alloc(n, GUARD_BEFORE);
        for (size_t i = 0; i < n; i++) {
            ga.p[i] = (float)i;
            gb.p[i] = 1.0f;
        }
        float got;
        cr_assert_eq(sdpa_dot_f32(ga.p, gb.p, n, &got), SDPA_OK);
        cr_assert_eq(got, (float)(n * (n - (n > 0)) / 2), "n=%zu", n); /* sum 0..n-1, exact */
        guard_free(&ga);
        guard_free(&gb);
    }
}

BACKEND_TEST(dot, special_values) {
    float a[37], b[37];
    for (int i = 0; i < 37; i++) a[i] = b[i] = 1.0f;
    float got;
    a[36] = NAN;
    sdpa_dot_f32(a, b, 37, &got);
    cr_assert(isnan(got), "NaN must propagate");
    a[36] = INFINITY;
    sdpa_dot_f32(a, b, 37, &got);
    cr_assert(got == INFINITY);
    a[0] = -INFINITY;
    sdpa_dot_f32(a, b, 37, &got);
    cr_assert(isnan(got), "inf - inf is NaN");
}

Test(dot, errors_leave_output_untouched) {
    float a[4] = {1, 2, 3, 4}, got = SENTINEL;
    cr_assert_eq(sdpa_dot_f32(NULL, a, 4, &got), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_dot_f32(a, NULL, 4, &got), SDPA_ERR_NULL);
    cr_assert_eq(got, SENTINEL);
    cr_assert_eq(sdpa_dot_f32(a, a, 4, NULL), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_dot_f32(a, a, 0, NULL), SDPA_ERR_NULL);
}

Test(dot, seed_examples) {
    /* the dot products that grow with d, from the library's motivation */
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {3, 4, 5, 6, 7, 8}, got;
    sdpa_dot_f32(a, b, 2, &got);
    cr_assert_eq(got, 11.0f);
    sdpa_dot_f32(a, b, 4, &got);
    cr_assert_eq(got, 50.0f);
    sdpa_dot_f32(a, b, 6, &got);
    cr_assert_eq(got, 133.0f);
}
