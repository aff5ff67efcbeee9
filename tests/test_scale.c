/* sdpa_scale_f32: bit-exact (one IEEE multiply per element), in place, no access outside. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

BACKEND_TEST(scale, bit_exact_sizes_offsets_in_place) {
    rng r = rng_seed(3);
    const float alphas[] = {0.125f, -3.7f, 1e-30f, 1e30f, 0.0f};
    for (size_t s = 0; s < N_TEST_SIZES; s++) {
        size_t n = TEST_SIZES[s];
        for (size_t off = 0; off < 4; off++) {
            void *bx, *by;
            float *x = alloc_offset(n, off, &bx), *y = alloc_offset(n, (off + 1) % 4, &by);
            fill_uniform(&r, x, n, -100.0f, 100.0f);
            float alpha = alphas[(s + off) % 5];
            cr_assert_eq(sdpa_scale_f32(y, x, n, alpha), SDPA_OK);
            for (size_t i = 0; i < n; i++) {
                volatile float want = alpha * x[i];
                cr_assert(memcmp(&y[i], (const void *)&want, sizeof want) == 0,
                          "n=%zu i=%zu: %a vs %a", n, i, y[i], want);
            }
            memcpy(y, x, n * sizeof(float));
            cr_assert_eq(sdpa_scale_f32(x, x, n, -2.5f), SDPA_OK); /* in place */
            for (size_t i = 0; i < n; i++) {
                volatile float want = -2.5f * y[i];
                cr_assert_eq(x[i], want, "in place, n=%zu i=%zu", n, i);
            }
            free(bx);
            free(by);
        }
    }
}

BACKEND_TEST(scale, no_access_outside) {
    for (size_t n = 0; n <= 33; n++) {
        guarded gx = guard_alloc(n, GUARD_BEFORE), gy = guard_alloc(n, GUARD_AFTER);
        for (size_t i = 0; i < n; i++) gx.p[i] = (float)i;
        cr_assert_eq(sdpa_scale_f32(gy.p, gx.p, n, 0.5f), SDPA_OK);
        for (size_t i = 0; i < n; i++) cr_assert_eq(gy.p[i], 0.5f * (float)i);
        cr_assert_eq(sdpa_scale_f32(gy.p, gy.p, n, 2.0f), SDPA_OK);
        guard_free(&gx);
        guard_free(&gy);
    }
}

BACKEND_TEST(scale, special_values) {
    float x[5] = {NAN, INFINITY, -INFINITY, 0.0f, 1.0f}, y[5];
    sdpa_scale_f32(y, x, 5, 2.0f);
    cr_assert(isnan(y[0]) && y[1] == INFINITY && y[2] == -INFINITY && y[3] == 0.0f && y[4] == 2.0f);
    sdpa_scale_f32(y, x, 5, INFINITY);
    cr_assert(isnan(y[3]), "0 * inf is NaN");
}

Test(scale, errors_leave_output_untouched) {
    float x[3] = {1, 2, 3}, y[3] = {SENTINEL, SENTINEL, SENTINEL};
    cr_assert_eq(sdpa_scale_f32(NULL, x, 3, 1.0f), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_scale_f32(y, NULL, 3, 1.0f), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_scale_f32(NULL, NULL, 0, 1.0f), SDPA_OK);
    cr_assert(y[0] == SENTINEL && y[1] == SENTINEL && y[2] == SENTINEL);
}
