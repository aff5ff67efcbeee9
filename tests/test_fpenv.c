/* The caller's floating-point environment: no entry point changes the rounding mode or the
 * flush-to-zero / denormals-are-zero bits (MXCSR on x86-64, FPCR on AArch64), and results stay
 * within the bounds of sdpa.h under every rounding mode and with FTZ/DAZ set. Every backend,
 * both exp modes. Inputs are normal floats: with DAZ the hardware reads subnormal inputs as 0,
 * which is the caller's choice and not the library's. */
#include <fenv.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bounds.h"
#include "checks.h"
#include "common.h"

typedef struct environment {
    const char *name;
    int round;
    int ftz_daz;
} environment;

static const environment ENVIRONMENTS[] = {
    {"default", FE_TONEAREST, 0},
    {"upward", FE_UPWARD, 0},
    {"downward", FE_DOWNWARD, 0},
    {"toward zero", FE_TOWARDZERO, 0},
    {"FTZ+DAZ", FE_TONEAREST, 1},
    {"FTZ+DAZ, upward", FE_UPWARD, 1},
    {"FTZ+DAZ, toward zero", FE_TOWARDZERO, 1},
};

/* Asserts that the environment is the one the test set, after a call. */
static void assert_unchanged(uint64_t before, int round, const char *env, const char *call) {
    cr_assert_eq(fegetround(), round, "%s: %s changed the rounding mode", env, call);
    cr_assert_eq(fp_control_word(), before, "%s: %s changed the control word %#llx -> %#llx", env,
                 call, (unsigned long long)before, (unsigned long long)fp_control_word());
}

static void restore_default(void) {
    fesetround(FE_TONEAREST);
    set_ftz_daz(0);
}

/* Every entry point, a few sizes that cover full vectors and tails, in one environment. */
static void every_entry_point(const environment *env) {
    static const size_t sizes[] = {1, 5, 16, 33, 100, 1000, 4096};
    rng r = rng_seed(200);
    cr_assert_eq(fesetround(env->round), 0);
    set_ftz_daz(env->ftz_daz);
    uint64_t before = fp_control_word();
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float)),
              *y = malloc(n * sizeof(float)), *dy = malloc(n * sizeof(float)),
              *out = malloc(n * sizeof(float));
        cr_assert(a && b && y && dy && out);
        fill_uniform(&r, a, n, -3.0f, 3.0f);
        fill_uniform(&r, b, n, -3.0f, 3.0f);
        fill_uniform(&r, dy, n, -1.0f, 1.0f);

        float dot;
        cr_assert_eq(sdpa_dot_f32(a, b, n, &dot), SDPA_OK);
        assert_unchanged(before, env->round, env->name, "dot");
        CHECK_OK(check_dot, env->name, dot, a, b, n);

        cr_assert_eq(sdpa_scale_f32(out, a, n, -0.3f), SDPA_OK);
        assert_unchanged(before, env->round, env->name, "scale");
        CHECK_OK(check_scale, env->name, out, a, n, -0.3f); /* in the caller's rounding mode */

        const char *modes[] = {"fast", "sleef"};
        for (size_t e = 0; e < 2; e++) {
            cr_assert_eq(sdpa_set_exp_mode(modes[e]), SDPA_OK);
            /* scaled inputs up to |z| = 60: weights down to e^-120 flush to 0 */
            cr_assert_eq(sdpa_softmax_f32(out, a, n, 20.0f), SDPA_OK);
            assert_unchanged(before, env->round, env->name, "softmax");
            CHECK_OK(check_softmax, env->name, out, a, n, 20.0f);
            cr_assert_eq(sdpa_softmax_f32(y, a, n, 0.7f), SDPA_OK);
            CHECK_OK(check_softmax, env->name, y, a, n, 0.7f);
        }
        sdpa_set_exp_mode("fast");

        cr_assert_eq(sdpa_softmax_backward_f32(out, y, dy, n, 0.7f), SDPA_OK);
        assert_unchanged(before, env->round, env->name, "softmax_backward");
        CHECK_OK(check_backward, env->name, out, y, dy, n, 0.7f);

        size_t d = n < 64 ? n : 64, n_keys = n / d;
        cr_assert_eq(sdpa_scores_f32(out, a, b, n_keys, d, d, 0.125f), SDPA_OK);
        assert_unchanged(before, env->round, env->name, "scores");
        CHECK_OK(check_scores, env->name, out, a, b, n_keys, d, d, 0.125f);

        /* errors leave it alone too */
        cr_assert_eq(sdpa_softmax_f32(out, a, n, 0.0f), SDPA_ERR_ARG);
        assert_unchanged(before, env->round, env->name, "softmax (error)");
        free(a);
        free(b);
        free(y);
        free(dy);
        free(out);
    }
    restore_default();
}

BACKEND_TEST(fpenv, preserved_and_accurate_in_every_environment) {
    for (size_t i = 0; i < sizeof ENVIRONMENTS / sizeof ENVIRONMENTS[0]; i++)
        every_entry_point(&ENVIRONMENTS[i]);
}

/* Special values under directed rounding and FTZ: the rules of sdpa.h do not depend on them. */
BACKEND_TEST(fpenv, special_values_in_every_environment) {
    for (size_t k = 0; k < sizeof ENVIRONMENTS / sizeof ENVIRONMENTS[0]; k++) {
        const environment *env = &ENVIRONMENTS[k];
        fesetround(env->round);
        set_ftz_daz(env->ftz_daz);
        for (size_t n = 1; n <= 40; n++) {
            float x[40], y[40];
            for (size_t i = 0; i < n; i++) x[i] = -INFINITY;
            cr_assert_eq(sdpa_softmax_f32(y, x, n, 1.0f), SDPA_OK);
            for (size_t i = 0; i < n; i++) cr_assert_eq(y[i], 0.0f, "%s: masked row", env->name);
            for (size_t i = 0; i < n; i++) x[i] = i % 3 ? -INFINITY : (float)i;
            x[n - 1] = NAN;
            cr_assert_eq(sdpa_softmax_f32(y, x, n, 1.0f), SDPA_OK);
            for (size_t i = 0; i < n; i++) cr_assert(isnan(y[i]), "%s: NaN row", env->name);
            /* equal maxima share the mass, the rest is exactly 0 */
            if (n < 2) continue;
            for (size_t i = 0; i < n; i++) x[i] = i % 2 ? 1e30f : -1e30f;
            cr_assert_eq(sdpa_softmax_f32(y, x, n, 1.0f), SDPA_OK);
            double share = 1.0 / (double)(n / 2);
            for (size_t i = 0; i < n; i++)
                cr_assert(i % 2 ? fabs(y[i] - share) <= 1e-6 * share : y[i] == 0.0f,
                          "%s: n=%zu i=%zu got %a", env->name, n, i, y[i]);
        }
        restore_default();
    }
}

/* softmax_backward's sum y_j dy_j over long rows, in every environment: each dx depends on it,
 * and a float sum of equal terms drifts with n (every rounding errs the same way). The row of a
 * constant softmax, y = 1/n and dy = 1.0001, has exact dx = 0 and the smallest bound there is. */
static void backward_long_row(const environment *env, size_t n, int constant, rng *r) {
    float *y = malloc(n * sizeof(float)), *dy = malloc(n * sizeof(float)),
          *dx = malloc(n * sizeof(float));
    cr_assert(y && dy && dx);
    if (constant) {
        for (size_t i = 0; i < n; i++) y[i] = 1.0f / (float)n, dy[i] = 1.0001f;
    } else {
        double sum = 0.0;
        for (size_t i = 0; i < n; i++) sum += y[i] = (float)rng_uniform(r, 0.0, 2.0);
        for (size_t i = 0; i < n; i++) y[i] = (float)(y[i] / sum);
        fill_uniform(r, dy, n, 0.5f, 1.5f); /* one sign: the drift of a float sum is largest */
    }
    cr_assert_eq(fesetround(env->round), 0);
    set_ftz_daz(env->ftz_daz);
    sdpa_status st = sdpa_softmax_backward_f32(dx, y, dy, n, 1.0f);
    restore_default();
    cr_assert_eq(st, SDPA_OK);
    char context[96];
    snprintf(context, sizeof context, "%s, n = %zu, %s row", env->name, n,
             constant ? "constant" : "random");
    CHECK_OK(check_backward, context, dx, y, dy, n, 1.0f);
    free(y);
    free(dy);
    free(dx);
}

BACKEND_TEST(fpenv, softmax_backward_long_rows_within_bound) {
    const size_t sizes[] = {12345, (size_t)1 << 18, (size_t)1 << 20, (size_t)1 << 22};
    /* emulated CPUs: up to 2^20, enough for the drift to show on every backend */
    const size_t n_sizes = test_quick() ? 3 : 4;
    rng r = rng_seed(404);
    for (size_t k = 0; k < sizeof ENVIRONMENTS / sizeof ENVIRONMENTS[0]; k++)
        for (size_t s = 0; s < n_sizes; s++) {
            if ((sizes[s] & (sizes[s] - 1)) == 0)
                backward_long_row(&ENVIRONMENTS[k], sizes[s], 1, &r);
            backward_long_row(&ENVIRONMENTS[k], sizes[s], 0, &r);
        }
}

/* The exception flags sdpa.h lets a call raise: dot, scale and scores only what their IEEE
 * arithmetic raises (moderate finite inputs: none of FE_INVALID, FE_DIVBYZERO, FE_OVERFLOW);
 * softmax, its backward and attention anything but FE_DIVBYZERO, since their exps run on lanes
 * and rows whose results are then dropped. Finite inputs, some far apart (|z| up to 1e4). */
BACKEND_TEST(fpenv, exception_flags_as_documented) {
    enum { N = 5000, D = 64 };
    static float x[N], y[N], dy[N], out[N];
    rng r = rng_seed(31);
    fill_uniform(&r, x, N, -50.0f, 50.0f);
    fill_uniform(&r, dy, N, -1.0f, 1.0f);
    const size_t sizes[] = {1, 3, 16, 17, 100, 4096, N};
    const char *modes[] = {"fast", "sleef"};
    for (size_t e = 0; e < 2; e++) {
        cr_assert_eq(sdpa_set_exp_mode(modes[e]), SDPA_OK);
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            const size_t n = sizes[s];
            float dot;
            feclearexcept(FE_ALL_EXCEPT);
            cr_assert_eq(sdpa_dot_f32(x, dy, n, &dot), SDPA_OK);
            cr_assert_eq(sdpa_scale_f32(out, x, n, 0.3f), SDPA_OK);
            cr_assert_eq(sdpa_scores_f32(out, x, dy, n / D, n < D ? n : D, D, 0.125f), SDPA_OK);
            cr_assert(!fetestexcept(FE_INVALID | FE_DIVBYZERO | FE_OVERFLOW),
                      "%s n=%zu: dot, scale or scores raised %#x", modes[e], n,
                      fetestexcept(FE_ALL_EXCEPT));
            for (float scale = 1.0f; scale <= 200.0f; scale *= 14.0f) {
                cr_assert_eq(sdpa_softmax_f32(y, x, n, scale), SDPA_OK);
                cr_assert_eq(sdpa_softmax_backward_f32(out, y, dy, n, scale), SDPA_OK);
            }
            const size_t len = n / D ? n / D : 1, d = n < D ? n : D;
            for (int causal = 0; causal < 2; causal++)
                cr_assert_eq(sdpa_attention_f32(out, x, x, dy, len, len, d, d, 0.5f,
                                                causal ? SDPA_CAUSAL : 0),
                             SDPA_OK);
            cr_assert(!fetestexcept(FE_DIVBYZERO), "%s n=%zu: FE_DIVBYZERO", modes[e], n);
        }
    }
    sdpa_set_exp_mode("fast");
}

/* ---- Softmax's z = scale * x is rounded once, in the caller's mode, and every pass of a row sees
 * that z: rows far beyond any accuracy range (|z| up to FLT_MAX, where one ULP of z decides
 * between exp(0) and inf) and longer than any chunk, and rows of one entry, whose weight is
 * exactly 1. No weight is ever above 1. ---- */

static const char *const EXP_MODES[] = {"fast", "sleef"};

/* scale * x rounded to float in the current rounding mode, at run time */
static float z_of(float scale, float x) {
    volatile float z = scale * x;
    return z;
}

/* y against the softmax of the rounded z (z_of, in the current mode), in double: NaN nowhere,
 * every weight in [0, 1] and within the bound of sdpa.h of its own exp(z - max) / sum, so equal
 * z get equal weights, and the weights sum to 1 within that bound; +inf z share the mass */
static void check_softmax_of_z(const char *ctx, const float *y, const float *x, size_t n,
                               float scale) {
    double *want = malloc(n * sizeof(double));
    cr_assert(want);
    float m = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        const float z = z_of(scale, x[i]);
        cr_assert(!isnan(z), "%s: the test's z is NaN", ctx);
        if (z > m) m = z;
    }
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        const float z = z_of(scale, x[i]);
        want[i] = m == INFINITY ? (z == INFINITY) : z == -INFINITY ? 0.0 : exp((double)z - m);
        sum += want[i];
    }
    const double tol = bound_softmax_rel(n);
    double got_sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        want[i] /= sum;
        cr_assert(y[i] >= 0.0f && y[i] <= 1.0f, "%s: n=%zu i=%zu: weight %a (z %a, max %a)", ctx, n,
                  i, y[i], z_of(scale, x[i]), m);
        if (want[i] < 2.0 * FLT_MIN)
            cr_assert(y[i] < 3.0f * FLT_MIN, "%s: n=%zu i=%zu: %a, want %g", ctx, n, i, y[i],
                      want[i]);
        else
            cr_assert(fabs(y[i] - want[i]) <= tol * want[i],
                      "%s: n=%zu i=%zu: %.9g, want %.9g (z %a, max %a)", ctx, n, i, y[i], want[i],
                      z_of(scale, x[i]), m);
        got_sum += y[i];
    }
    cr_assert(fabs(got_sum - 1.0) <= tol, "%s: n=%zu: the weights sum to %.9g", ctx, n, got_sum);
    free(want);
}

/* x in [1, 3) (the inputs a model's scores divided by a small scale would be), in three orders:
 * scrambled (the largest entry in every block of 1024), rising (a new max in every chunk, so
 * every chunk's shift moves) and falling; the scales take |z| to 1e37 and FLT_MAX (and past it,
 * where z overflows to +inf or stops at FLT_MAX as the mode says), to 1e6 and 3e4 (beyond the
 * exps' fold, where only the largest entries keep a weight) and to 1e3 and 30 (where many
 * weights count and one ULP of z moves each of them by e^(ULP)) */
static void fill_one_to_three(float *x, size_t n, int order) {
    for (size_t i = 0; i < n; i++) {
        const size_t k = order == 0   ? i * 7919 % 1024
                         : order == 1 ? i * 1024 / n
                                      : (n - 1 - i) * 1024 / n;
        x[i] = 1.0f + (float)k / 512.0f;
    }
}

BACKEND_TEST(fpenv, softmax_z_rounded_once_in_every_mode) {
    static const float scales[] = {1e37f,          -1e37f,          3e38f / 3.0f, FLT_MAX / 3.0f,
                                   FLT_MAX / 2.0f, -FLT_MAX / 2.0f, 1e6f,         3e4f,
                                   1e3f,           30.0f,           -30.0f};
    static const size_t sizes[] = {300, 4096, 4097, 70000};
    const size_t n_sizes = test_quick() ? 3 : sizeof sizes / sizeof sizes[0];
    float *x = malloc(70000 * sizeof(float)), *y = malloc(70000 * sizeof(float));
    cr_assert(x && y);
    for (size_t k = 0; k < sizeof ENVIRONMENTS / sizeof ENVIRONMENTS[0]; k++) {
        const environment *env = &ENVIRONMENTS[k];
        for (size_t e = 0; e < 2; e++) {
            cr_assert_eq(sdpa_set_exp_mode(EXP_MODES[e]), SDPA_OK);
            for (size_t s = 0; s < n_sizes; s++) {
                const size_t n = sizes[s];
                for (int order = 0; order < 3; order++) {
                    for (size_t c = 0; c < sizeof scales / sizeof scales[0]; c++) {
                        for (int in_place = 0; in_place < 2; in_place++) {
                            char ctx[160];
                            snprintf(ctx, sizeof ctx, "%s, exp %s, order %d, scale %a%s", env->name,
                                     EXP_MODES[e], order, scales[c], in_place ? ", in place" : "");
                            fill_one_to_three(x, n, order);
                            fesetround(env->round);
                            set_ftz_daz(env->ftz_daz);
                            const sdpa_status st =
                                sdpa_softmax_f32(in_place ? x : y, x, n, scales[c]);
                            if (in_place) memcpy(y, x, n * sizeof(float));
                            fill_one_to_three(x, n, order);
                            /* the reference rounds z in the same mode */
                            check_softmax_of_z(ctx, y, x, n, scales[c]);
                            restore_default();
                            cr_assert_eq(st, SDPA_OK);
                        }
                    }
                }
            }
        }
    }
    sdpa_set_exp_mode("fast");
    free(x);
    free(y);
}

/* A row of one entry is exactly 1 for every finite z, in every mode and with either exp; -inf
 * gives 0, NaN gives NaN and +inf gives 1 (sdpa.h), z overflowing as the mode says. */
BACKEND_TEST(fpenv, softmax_of_one_entry_is_exactly_one) {
    static const float xs[] = {0.0f,    -0.0f,    1.0f,      100.0f,  123.0f,   -123.0f,
                               87.5f,   88.8f,    -88.8f,    1e5f,    -1e5f,    1e-30f,
                               FLT_MIN, 3e38f,    -3e38f,    FLT_MAX, -FLT_MAX, 0.1f,
                               2.5e-3f, INFINITY, -INFINITY, NAN};
    static const float scales[] = {1.0f, 0.5f, -1.0f, 0.125f, 3.0f, 1e37f, -2.0f, 1e-37f};
    for (size_t k = 0; k < sizeof ENVIRONMENTS / sizeof ENVIRONMENTS[0]; k++) {
        const environment *env = &ENVIRONMENTS[k];
        for (size_t e = 0; e < 2; e++) {
            cr_assert_eq(sdpa_set_exp_mode(EXP_MODES[e]), SDPA_OK);
            for (size_t c = 0; c < sizeof scales / sizeof scales[0]; c++) {
                /* the listed values, then a sweep of 2000 more through [-100, 100) */
                for (size_t i = 0; i < sizeof xs / sizeof xs[0] + 2000; i++) {
                    const size_t n_listed = sizeof xs / sizeof xs[0];
                    float x = i < n_listed ? xs[i] : -100.0f + 0.1f * (float)(i - n_listed);
                    float y = SENTINEL, in_place = x;
                    fesetround(env->round);
                    set_ftz_daz(env->ftz_daz);
                    const sdpa_status st = sdpa_softmax_f32(&y, &x, 1, scales[c]);
                    const sdpa_status st_in_place =
                        sdpa_softmax_f32(&in_place, &in_place, 1, scales[c]);
                    const float z = z_of(scales[c], x);
                    restore_default();
                    cr_assert(st == SDPA_OK && st_in_place == SDPA_OK);
                    const float want = isnan(z) ? NAN : z == -INFINITY ? 0.0f : 1.0f;
                    cr_assert(isnan(want) ? isnan(y) && isnan(in_place)
                                          : memcmp(&y, &want, sizeof y) == 0 &&
                                                memcmp(&in_place, &want, sizeof y) == 0,
                              "%s, exp %s: softmax of %a * %a (z %a) is %a (in place %a), want %a",
                              env->name, EXP_MODES[e], scales[c], x, z, y, in_place, want);
                }
            }
        }
    }
    sdpa_set_exp_mode("fast");
}

/* No weight above 1 in any mode: rows of one dominant entry whose others lie 20 to 100 below
 * it (or at -inf), so that the row's sum is about its largest exp and the normalisation
 * multiplies that exp by about its own reciprocal, for many values of it and every short-row
 * path (one vector, rows in registers, the passes), and for rows longer than a chunk. */
BACKEND_TEST(fpenv, softmax_weights_never_above_one) {
    static const float gaps[] = {20.0f, 40.0f, 100.0f, INFINITY};
    float *x = malloc(5000 * sizeof(float)), *y = malloc(5000 * sizeof(float));
    cr_assert(x && y);
    const size_t values = test_quick() ? 40 : 200;
    for (size_t k = 0; k < sizeof ENVIRONMENTS / sizeof ENVIRONMENTS[0]; k++) {
        const environment *env = &ENVIRONMENTS[k];
        for (size_t e = 0; e < 2; e++) {
            cr_assert_eq(sdpa_set_exp_mode(EXP_MODES[e]), SDPA_OK);
            for (size_t n = 2; n <= 64 + 3; n++) {
                const size_t len = n <= 64 ? n : n == 65 ? 300 : n == 66 ? 4096 : 4097;
                for (size_t g = 0; g < sizeof gaps / sizeof gaps[0]; g++) {
                    for (size_t v = 0; v < values; v += len <= 64 ? 1 : 10) {
                        const float top = -20.0f + 0.1373f * (float)v;
                        const size_t at = v * 13 % len;
                        for (size_t i = 0; i < len; i++)
                            x[i] = i == at ? top : top - gaps[g] - (float)(i % 7);
                        fesetround(env->round);
                        set_ftz_daz(env->ftz_daz);
                        cr_assert_eq(sdpa_softmax_f32(y, x, len, v % 2 ? 1.0f : 2.0f), SDPA_OK);
                        restore_default();
                        for (size_t i = 0; i < len; i++)
                            cr_assert(y[i] >= 0.0f && y[i] <= 1.0f,
                                      "%s, exp %s: n=%zu, top %a at %zu, gap %g: y[%zu] = %a",
                                      env->name, EXP_MODES[e], len, top, at, gaps[g], i, y[i]);
                        cr_assert(y[at] >= 1.0f - 2e-5f, "%s, exp %s: n=%zu: top weight %a",
                                  env->name, EXP_MODES[e], len, y[at]);
                    }
                }
            }
        }
    }
    sdpa_set_exp_mode("fast");
    free(x);
    free(y);
}
