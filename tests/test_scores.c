/* sdpa_scores_f32: s[j] = scale * dot(q, k_j) for strided keys. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "common.h"
#include "reference.h"

static void check_scores(const float *s, const float *q, const float *k, size_t n_keys, size_t d,
                         size_t stride, float scale) {
    for (size_t j = 0; j < n_keys; j++) {
        const float *kj = k + j * stride;
        double want = scale * ref_dot(q, kj, d);
        double bound = 1e-5 * fabs(scale) * ref_dot_abs(q, kj, d) + 1e-30;
        cr_assert(fabs(s[j] - want) <= bound, "n_keys=%zu d=%zu stride=%zu j=%zu: %.9g vs %.9g",
                  n_keys, d, stride, j, s[j], want);
    }
}

BACKEND_TEST(scores, shapes_and_strides) {
    rng r = rng_seed(9);
    const size_t dims[] = {1, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33, 64, 80, 96, 128, 129, 256};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        size_t d = dims[di];
        for (size_t n_keys = 0; n_keys <= 13; n_keys++) {
            for (size_t pad = 0; pad <= 7; pad += 7) {
                size_t stride = d + pad;
                void *bq, *bk;
                float *q = alloc_offset(d, n_keys % 4, &bq);
                float *k = alloc_offset(n_keys * stride + 1, (n_keys + 1) % 4, &bk);
                fill_uniform(&r, q, d, -1.0f, 1.0f);
                fill_uniform(&r, k, n_keys * stride, -1.0f, 1.0f);
                float s[13];
                float scale = 1.0f / sqrtf((float)d);
                cr_assert_eq(sdpa_scores_f32(s, q, k, n_keys, d, stride, scale), SDPA_OK);
                check_scores(s, q, k, n_keys, d, stride, scale);
                free(bq);
                free(bk);
            }
        }
    }
}

BACKEND_TEST(scores, many_keys) {
    rng r = rng_seed(10);
    size_t d = 128, n_keys = 1000;
    float *q = malloc(d * sizeof(float)), *k = malloc(n_keys * d * sizeof(float)),
          *s = malloc(n_keys * sizeof(float));
    fill_uniform(&r, q, d, -2.0f, 2.0f);
    fill_uniform(&r, k, n_keys * d, -2.0f, 2.0f);
    cr_assert_eq(sdpa_scores_f32(s, q, k, n_keys, d, d, 0.0883883f), SDPA_OK);
    check_scores(s, q, k, n_keys, d, d, 0.0883883f);
    free(q);
    free(k);
    free(s);
}

BACKEND_TEST(scores, no_access_outside) {
    for (size_t d = 1; d <= 33; d += 4) {
        for (size_t n_keys = 1; n_keys <= 9; n_keys++) {
            guarded gq = guard_alloc(d, GUARD_BEFORE),
                    gk = guard_alloc((n_keys - 1) * d + d, GUARD_AFTER),
                    gs = guard_alloc(n_keys, GUARD_AFTER);
            for (size_t i = 0; i < d; i++) gq.p[i] = 1.0f;
            for (size_t i = 0; i < n_keys * d; i++) gk.p[i] = (float)(i / d);
            cr_assert_eq(sdpa_scores_f32(gs.p, gq.p, gk.p, n_keys, d, d, 1.0f), SDPA_OK);
            for (size_t j = 0; j < n_keys; j++) cr_assert_eq(gs.p[j], (float)(j * d));
            guard_free(&gq);
            guard_free(&gk);
            guard_free(&gs);
        }
    }
}

Test(scores, errors_leave_output_untouched) {
    float q[4] = {1, 2, 3, 4}, k[8] = {0}, s[2] = {SENTINEL, SENTINEL};
    cr_assert_eq(sdpa_scores_f32(NULL, q, k, 2, 4, 4, 1.0f), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_scores_f32(s, NULL, k, 2, 4, 4, 1.0f), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_scores_f32(s, q, NULL, 2, 4, 4, 1.0f), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_scores_f32(s, q, k, 2, 4, 3, 1.0f), SDPA_ERR_SIZE, "stride < d");
    cr_assert_eq(sdpa_scores_f32(s, q, k, 2, 0, 4, 1.0f), SDPA_ERR_SIZE, "d == 0");
    cr_assert_eq(sdpa_scores_f32(s, q, k, SIZE_MAX / 2, 4, 4, 1.0f), SDPA_ERR_SIZE, "overflow");
    cr_assert_eq(sdpa_scores_f32(s, q, k, 2, 4, SIZE_MAX / 4, 1.0f), SDPA_ERR_SIZE, "overflow");
    cr_assert_eq(sdpa_scores_f32(s, q, k, 2, 4, 4, NAN), SDPA_ERR_ARG);
    cr_assert_eq(sdpa_scores_f32(s, q, k, 2, 4, 4, INFINITY), SDPA_ERR_ARG);
    cr_assert_eq(sdpa_scores_f32(NULL, NULL, NULL, 0, 0, 0, 1.0f), SDPA_OK);
    cr_assert(s[0] == SENTINEL && s[1] == SENTINEL);
}
