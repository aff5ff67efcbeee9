/* sdpa_softmax_f32 and sdpa_softmax_backward_f32 against a double-precision reference:
 * accuracy, the special-value contract, no access outside, errors. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bounds.h"
#include "common.h"
#include "reference.h"

/* Checks y against the reference: relative error <= tol where the reference is a normal float
 * of at least 2 * FLT_MIN, and never a subnormal output. */
static void check_softmax(const float *y, const float *x, size_t n, float scale, double tol,
                          const char *what) {
    double *want = malloc((n ? n : 1) * sizeof(double));
    ref_softmax(want, x, n, scale);
    for (size_t i = 0; i < n; i++) {
        cr_assert(!(y[i] != 0.0f && fabsf(y[i]) < FLT_MIN), "%s: subnormal output %a at %zu", what,
                  y[i], i);
        if (isnan(want[i])) {
            cr_assert(isnan(y[i]), "%s: n=%zu i=%zu want NaN got %g", what, n, i, y[i]);
        } else if (want[i] < 2.0 * FLT_MIN) {
            cr_assert(y[i] >= 0.0f && y[i] < 3.0 * FLT_MIN, "%s: n=%zu i=%zu want %g got %g", what,
                      n, i, want[i], y[i]);
        } else {
            double rel = fabs(y[i] - want[i]) / want[i];
            cr_assert(rel <= tol, "%s: n=%zu i=%zu rel err %.3g (got %.9g want %.9g)", what, n, i,
                      rel, y[i], want[i]);
        }
    }
    free(want);
}

BACKEND_TEST(softmax, sizes_offsets_in_place) {
    rng r = rng_seed(4);
    for (size_t s = 0; s < N_TEST_SIZES; s++) {
        size_t n = TEST_SIZES[s];
        for (size_t off = 0; off < 4; off++) {
            void *bx, *by;
            float *x = alloc_offset(n, off, &bx), *y = alloc_offset(n, 3 - off, &by);
            fill_uniform(&r, x, n, -20.0f, 20.0f);
            float scale = off % 2 ? 0.125f : -2.0f; /* |scale * x| <= 40 */
            cr_assert_eq(sdpa_softmax_f32(y, x, n, scale), SDPA_OK);
            check_softmax(y, x, n, scale, bound_softmax_rel(n), "out of place");
            memcpy(y, x, n * sizeof(float));
            cr_assert_eq(sdpa_softmax_f32(x, x, n, scale), SDPA_OK);
            check_softmax(x, y, n, scale, bound_softmax_rel(n), "in place");
            free(bx);
            free(by);
        }
    }
}

BACKEND_TEST(softmax, wide_range_of_magnitudes) {
    /* scaled inputs up to |z| = 80, where the contract applies, at several widths of spread */
    rng r = rng_seed(5);
    const float spreads[] = {1e-6f, 1e-3f, 1.0f, 10.0f, 80.0f};
    for (size_t k = 0; k < 5; k++) {
        for (size_t n = 1; n <= 300; n += 37) {
            float x[300], y[300];
            fill_uniform(&r, x, n, -spreads[k], spreads[k]);
            cr_assert_eq(sdpa_softmax_f32(y, x, n, 1.0f), SDPA_OK);
            check_softmax(y, x, n, 1.0f, bound_softmax_rel(4096), "spread");
        }
    }
}

BACKEND_TEST(softmax, huge_inputs_do_not_overflow) {
    /* |x| up to 1e30: only the max survives, and nothing overflows to NaN */
    float x[67], y[67];
    rng r = rng_seed(6);
    for (size_t i = 0; i < 67; i++) x[i] = (float)rng_uniform(&r, -1e30, 1e30);
    x[40] = 1e30f;
    cr_assert_eq(sdpa_softmax_f32(y, x, 67, 1.0f), SDPA_OK);
    check_softmax(y, x, 67, 1.0f, bound_softmax_rel(4096), "huge");
    cr_assert_eq(y[40], 1.0f);
    for (size_t i = 0; i < 67; i++) x[i] = 1e30f;
    cr_assert_eq(sdpa_softmax_f32(y, x, 67, 1.0f), SDPA_OK);
    check_softmax(y, x, 67, 1.0f, bound_softmax_rel(4096), "huge, all equal");
}

BACKEND_TEST(softmax, large_rows) {
    size_t n = (size_t)1 << 20;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    rng r = rng_seed(7);
    fill_uniform(&r, x, n, -10.0f, 10.0f);
    cr_assert_eq(sdpa_softmax_f32(y, x, n, 1.0f), SDPA_OK);
    check_softmax(y, x, n, 1.0f, bound_softmax_rel(n), "2^20");
    free(x);
    free(y);
}

/* Rows longer than the driver's chunk (4096 floats): the running max rises from chunk to chunk,
 * whole chunks are masked, and +inf or NaN first appears in a later chunk, in place or not. */
BACKEND_TEST(softmax, special_values_across_chunks) {
    const size_t n = 3 * 4096 + 100;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    for (int in_place = 0; in_place < 2; in_place++) {
        float *out = in_place ? x : y;
        for (int pattern = 0; pattern < 6; pattern++) {
            for (size_t i = 0; i < n; i++) x[i] = (float)i * 0.002f; /* rising: rescales */
            if (pattern == 1)
                for (size_t i = 0; i < 4096; i++) x[i] = -INFINITY; /* first chunk masked */
            if (pattern == 2)
                for (size_t i = 4096; i < 8192; i++) x[i] = -INFINITY; /* middle chunk masked */
            if (pattern == 3) x[n - 3] = x[n - 1] = INFINITY;          /* +inf only at the end */
            if (pattern == 4) x[n - 2] = NAN;                          /* NaN only at the end */
            if (pattern == 5) {                                        /* NaN in a masked chunk */
                for (size_t i = 4096; i < 8192; i++) x[i] = -INFINITY;
                x[5000] = NAN;
            }
            float *copy = malloc(n * sizeof(float));
            memcpy(copy, x, n * sizeof(float));
            cr_assert_eq(sdpa_softmax_f32(out, x, n, 1.0f), SDPA_OK);
            if (pattern == 3) {
                for (size_t i = 0; i < n; i++)
                    cr_assert_eq(out[i], i == n - 3 || i == n - 1 ? 0.5f : 0.0f, "i=%zu", i);
            } else {
                check_softmax(out, copy, n, 1.0f, bound_softmax_rel(n), "across chunks");
            }
            free(copy);
        }
        /* every chunk masked: all zeros */
        for (size_t i = 0; i < n; i++) x[i] = -INFINITY;
        cr_assert_eq(sdpa_softmax_f32(out, x, n, 1.0f), SDPA_OK);
        for (size_t i = 0; i < n; i++) cr_assert_eq(out[i], 0.0f);
    }
    free(x);
    free(y);
}

BACKEND_TEST(softmax, all_equal_and_one_dominant) {
    for (size_t n = 1; n <= 70; n++) {
        float x[70], y[70];
        for (size_t i = 0; i < n; i++) x[i] = 3.25f;
        cr_assert_eq(sdpa_softmax_f32(y, x, n, 1.0f), SDPA_OK);
        for (size_t i = 0; i < n; i++)
            cr_assert(fabs(y[i] - 1.0 / (double)n) <= 2e-5 / (double)n, "n=%zu: %g", n, y[i]);
        x[n / 2] = 200.0f; /* every other weight is e^-196.75: exactly 0 */
        cr_assert_eq(sdpa_softmax_f32(y, x, n, 1.0f), SDPA_OK);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(y[i], i == n / 2 ? 1.0f : 0.0f, "n=%zu i=%zu", n, i);
    }
}

BACKEND_TEST(softmax, seed_examples) {
    /* the saturation that scaling by 1/sqrt(d_k) avoids (d_k = 4) */
    float x[2] = {14.0f, 10.0f}, y[2];
    cr_assert_eq(sdpa_softmax_f32(y, x, 2, 1.0f), SDPA_OK);
    cr_assert(fabs(y[0] - 0.98201379) < 1e-6 && fabs(y[1] - 0.01798621) < 1e-6, "%.8f %.8f", y[0],
              y[1]);
    cr_assert_eq(sdpa_softmax_f32(y, x, 2, 0.5f), SDPA_OK);
    cr_assert(fabs(y[0] - 0.88079708) < 1e-6 && fabs(y[1] - 0.11920292) < 1e-6, "%.8f %.8f", y[0],
              y[1]);
}

/* The special-value tests run every n up to 130: one vector, the avx512 register tiers of 2, 4
 * and 8 vectors (17 to 128 floats, arch/x86/avx512.c), and the three-pass body past them. */
BACKEND_TEST(softmax, minus_inf_entries_are_exactly_zero) {
    for (size_t n = 1; n <= 130; n++) {
        float x[130], y[130];
        for (size_t i = 0; i < n; i++) x[i] = i % 3 ? -INFINITY : (float)i * 0.1f;
        cr_assert_eq(sdpa_softmax_f32(y, x, n, 1.0f), SDPA_OK);
        check_softmax(y, x, n, 1.0f, bound_softmax_rel(4096), "-inf entries");
        for (size_t i = 0; i < n; i++)
            if (i % 3) cr_assert_eq(y[i], 0.0f);
        /* a fully masked row is all zeros, not NaN */
        for (size_t i = 0; i < n; i++) x[i] = -INFINITY;
        cr_assert_eq(sdpa_softmax_f32(y, x, n, 1.0f), SDPA_OK);
        for (size_t i = 0; i < n; i++) cr_assert_eq(y[i], 0.0f, "masked row n=%zu", n);
        /* with a negative scale, +inf is the masked value */
        for (size_t i = 0; i < n; i++) x[i] = INFINITY;
        cr_assert_eq(sdpa_softmax_f32(y, x, n, -1.0f), SDPA_OK);
        for (size_t i = 0; i < n; i++) cr_assert_eq(y[i], 0.0f);
    }
}

BACKEND_TEST(softmax, plus_inf_entries_share_the_mass) {
    for (size_t n = 2; n <= 130; n++) {
        float x[130], y[130];
        size_t n_inf = 0;
        for (size_t i = 0; i < n; i++) {
            x[i] = i % 4 == 1 ? INFINITY : (float)i;
            n_inf += x[i] == INFINITY;
        }
        cr_assert_eq(sdpa_softmax_f32(y, x, n, 1.0f), SDPA_OK);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(y[i], x[i] == INFINITY ? 1.0f / (float)n_inf : 0.0f, "n=%zu i=%zu", n, i);
        /* in place: the kernels must not write before the driver has seen the +inf */
        cr_assert_eq(sdpa_softmax_f32(x, x, n, 1.0f), SDPA_OK);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(x[i], i % 4 == 1 ? 1.0f / (float)n_inf : 0.0f, "in place n=%zu i=%zu", n,
                         i);
    }
}

BACKEND_TEST(softmax, nan_poisons_the_row) {
    for (size_t n = 1; n <= 130; n++) {
        for (size_t at = 0; at < n; at += 7) {
            float x[130], y[130];
            for (size_t i = 0; i < n; i++) x[i] = (float)i;
            x[at] = NAN;
            cr_assert_eq(sdpa_softmax_f32(y, x, n, 1.0f), SDPA_OK);
            for (size_t i = 0; i < n; i++) cr_assert(isnan(y[i]), "n=%zu at=%zu i=%zu", n, at, i);
            /* also beside -inf and +inf entries */
            for (size_t i = 0; i < n; i++) x[i] = i % 2 ? -INFINITY : INFINITY;
            x[at] = NAN;
            cr_assert_eq(sdpa_softmax_f32(y, x, n, 1.0f), SDPA_OK);
            for (size_t i = 0; i < n; i++) cr_assert(isnan(y[i]));
        }
    }
}

/* avx512 shifts the exps by a guess from the row's two ends and checks it against the max
 * (arch/shift_guess.h, "A guessed shift"): the guess must hold while the ends lie up to 64 below
 * the max, with weights up to e^64 before the normalisation, and be dropped beyond (ends 64.5, 100,
 * 1e4 below; 1e6 is past the range the guess folds). Rows held in registers check the guess by
 * their sum instead ("A capped guess"): ends 78 to 79.5 below straddle the sum's limit, and from
 * 80.5 below the max is capped, which only the sum's check keeps out of y (the ends' weights,
 * e^-80.5 or more, are normal floats: a capped max would leave them 1.6 times too large). Rows of
 * every length to 130 (one vector, the register tiers) and longer ones, whose guess is checked only
 * after y is written, up to rows of several chunks, where the driver guesses each chunk's shift
 * (src/kernels_api.c): out of place, in place (where x must survive), a positive and a negative
 * scale, and a +inf or a NaN inside. */
BACKEND_TEST(softmax, ends_far_below_the_max) {
    static const float below[] = {0.0f,  10.0f, 63.0f, 63.9f, 64.5f,  78.0f, 78.5f,
                                  79.0f, 79.5f, 80.5f, 84.0f, 100.0f, 1e4f,  1e6f};
    static const size_t longer[] = {255, 1000, 4095, 4096, 3 * 4096 + 100};
    enum { MAX_N = 3 * 4096 + 100 };
    float *x = malloc(MAX_N * sizeof(float)), *y = malloc(MAX_N * sizeof(float));
    float *z = malloc(MAX_N * sizeof(float));
    rng r = rng_seed(12);
    for (size_t t = 0; t < 130 + sizeof longer / sizeof longer[0]; t++) {
        const size_t n = t < 130 ? t + 1 : longer[t - 130];
        for (size_t b = 0; b < sizeof below / sizeof below[0]; b++) {
            const float scale = b % 2 ? -0.5f : 1.0f;
            /* z: the max 3 in the middle, the ends `below` lower, the rest between */
            for (size_t i = 0; i < n; i++) z[i] = 3.0f - below[b] * (float)rng_uniform(&r, 0, 1);
            z[0] = z[n - 1] = 3.0f - below[b];
            z[n / 2] = 3.0f;
            for (size_t i = 0; i < n; i++) x[i] = z[i] / scale; /* exact: scale * x = z */
            cr_assert_eq(sdpa_softmax_f32(y, x, n, scale), SDPA_OK);
            check_softmax(y, x, n, scale, bound_softmax_rel(4096), "ends below the max");
            memcpy(y, x, n * sizeof(float));
            cr_assert_eq(sdpa_softmax_f32(y, y, n, scale), SDPA_OK);
            check_softmax(y, x, n, scale, 2e-5, "ends below the max, in place");
            if (n < 3) continue;
            x[n / 2] = INFINITY * scale; /* z = +inf: all the mass */
            cr_assert_eq(sdpa_softmax_f32(y, x, n, scale), SDPA_OK);
            for (size_t i = 0; i < n; i++)
                cr_assert_eq(y[i], i == n / 2 ? 1.0f : 0.0f, "+inf: n=%zu i=%zu", n, i);
            x[n / 2] = NAN;
            cr_assert_eq(sdpa_softmax_f32(y, x, n, scale), SDPA_OK);
            for (size_t i = 0; i < n; i++) cr_assert(isnan(y[i]), "NaN: n=%zu i=%zu", n, i);
        }
    }
    free(x);
    free(y);
    free(z);
}

BACKEND_TEST(softmax, tiny_weights_flush_to_zero) {
    /* e^-87 is a normal float, e^-100 is subnormal: the first is kept, the second is exactly 0 */
    float x[3] = {0.0f, -87.0f, -100.0f}, y[3];
    cr_assert_eq(sdpa_softmax_f32(y, x, 3, 1.0f), SDPA_OK);
    cr_assert(fabs(y[1] - exp(-87.0)) / exp(-87.0) < 2e-5, "%g", y[1]);
    cr_assert_eq(y[2], 0.0f);
}

BACKEND_TEST(softmax, no_access_outside) {
    /* every n to 33, then around the avx512 register tiers' ends (64, 128) */
    static const size_t longer[] = {47, 48, 63, 64, 65, 80, 100, 127, 128, 129};
    for (size_t t = 0; t < 34 + sizeof longer / sizeof longer[0]; t++) {
        const size_t n = t < 34 ? t : longer[t - 34];
        guarded gx = guard_alloc(n, GUARD_AFTER), gy = guard_alloc(n, GUARD_BEFORE);
        for (size_t i = 0; i < n; i++) gx.p[i] = (float)i * 0.25f;
        cr_assert_eq(sdpa_softmax_f32(gy.p, gx.p, n, 1.0f), SDPA_OK);
        check_softmax(gy.p, gx.p, n, 1.0f, 2e-5, "guarded");
        cr_assert_eq(sdpa_softmax_f32(gx.p, gx.p, n, 1.0f), SDPA_OK);
        guard_free(&gx);
        guard_free(&gy);
    }
}

Test(softmax, errors_leave_output_untouched) {
    float x[3] = {1, 2, 3}, y[3] = {SENTINEL, SENTINEL, SENTINEL};
    cr_assert_eq(sdpa_softmax_f32(NULL, x, 3, 1.0f), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_softmax_f32(y, NULL, 3, 1.0f), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_softmax_f32(y, x, 3, 0.0f), SDPA_ERR_ARG);
    cr_assert_eq(sdpa_softmax_f32(y, x, 3, NAN), SDPA_ERR_ARG);
    cr_assert_eq(sdpa_softmax_f32(y, x, 3, INFINITY), SDPA_ERR_ARG);
    cr_assert_eq(sdpa_softmax_f32(y, x, 3, -INFINITY), SDPA_ERR_ARG);
    cr_assert_eq(sdpa_softmax_f32(NULL, NULL, 0, 1.0f), SDPA_OK);
    cr_assert(y[0] == SENTINEL && y[1] == SENTINEL && y[2] == SENTINEL);
}

/* ---- backward ---- */

static void check_backward(const float *dx, const float *y, const float *dy, size_t n, float scale,
                           const char *what) {
    double s = 0.0, s_abs = 0.0;
    for (size_t j = 0; j < n; j++) {
        s += (double)y[j] * dy[j];
        s_abs += fabs((double)y[j] * dy[j]);
    }
    for (size_t i = 0; i < n; i++) {
        double want = (double)scale * y[i] * (dy[i] - s);
        double bound = 1e-5 * fabs(scale) * y[i] * (fabs(dy[i]) + s_abs) + 1e-37;
        cr_assert(fabs(dx[i] - want) <= bound, "%s: n=%zu i=%zu got %.9g want %.9g", what, n, i,
                  dx[i], want);
    }
}

BACKEND_TEST(softmax_backward, sizes_offsets_aliasing) {
    rng r = rng_seed(8);
    for (size_t s = 0; s < N_TEST_SIZES; s++) {
        size_t n = TEST_SIZES[s];
        if (n > 4097) continue;
        for (size_t off = 0; off < 4; off++) {
            void *b1, *b2, *b3;
            float *y = alloc_offset(n, off, &b1), *dy = alloc_offset(n, (off + 1) % 4, &b2),
                  *dx = alloc_offset(n, (off + 2) % 4, &b3);
            fill_uniform(&r, y, n, -3.0f, 3.0f);
            cr_assert_eq(sdpa_softmax_f32(y, y, n, 1.0f), SDPA_OK);
            fill_uniform(&r, dy, n, -1.0f, 1.0f);
            float scale = off % 2 ? 0.125f : -1.5f;
            cr_assert_eq(sdpa_softmax_backward_f32(dx, y, dy, n, scale), SDPA_OK);
            check_backward(dx, y, dy, n, scale, "separate");
            memcpy(dx, dy, n * sizeof(float));
            cr_assert_eq(sdpa_softmax_backward_f32(dx, y, dx, n, scale), SDPA_OK);
            check_backward(dx, y, dy, n, scale, "dx == dy");
            free(b1);
            free(b2);
            free(b3);
        }
    }
}

BACKEND_TEST(softmax_backward, seed_gradient_vanishes) {
    /* sigma = [0.99, 0.01]: d sigma_0 / d z_1 = -sigma_0 sigma_1 = -0.0099 */
    float y[2] = {0.99f, 0.01f}, dy[2] = {0.0f, 1.0f}, dx[2];
    cr_assert_eq(sdpa_softmax_backward_f32(dx, y, dy, 2, 1.0f), SDPA_OK);
    cr_assert(fabs(dx[0] + 0.0099) < 1e-7 && fabs(dx[1] - 0.0099) < 1e-7, "%g %g", dx[0], dx[1]);
}

BACKEND_TEST(softmax_backward, no_access_outside) {
    for (size_t n = 0; n <= 33; n++) {
        guarded gy = guard_alloc(n, GUARD_AFTER), gd = guard_alloc(n, GUARD_BEFORE),
                gx = guard_alloc(n, GUARD_AFTER);
        for (size_t i = 0; i < n; i++) {
            gy.p[i] = 1.0f / (float)n;
            gd.p[i] = (float)i;
        }
        cr_assert_eq(sdpa_softmax_backward_f32(gx.p, gy.p, gd.p, n, 1.0f), SDPA_OK);
        check_backward(gx.p, gy.p, gd.p, n, 1.0f, "guarded");
        guard_free(&gy);
        guard_free(&gd);
        guard_free(&gx);
    }
}

Test(softmax_backward, errors_leave_output_untouched) {
    float y[2] = {0.5f, 0.5f}, dy[2] = {1, 2}, dx[2] = {SENTINEL, SENTINEL};
    cr_assert_eq(sdpa_softmax_backward_f32(NULL, y, dy, 2, 1.0f), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_softmax_backward_f32(dx, NULL, dy, 2, 1.0f), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_softmax_backward_f32(dx, y, NULL, 2, 1.0f), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_softmax_backward_f32(dx, y, dy, 2, 0.0f), SDPA_ERR_ARG);
    cr_assert_eq(sdpa_softmax_backward_f32(dx, y, dy, 2, NAN), SDPA_ERR_ARG);
    cr_assert(dx[0] == SENTINEL && dx[1] == SENTINEL);
}
