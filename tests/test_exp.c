/* White-box: each backend's exp, both kinds, against exp() in double over the whole float
 * range (every 61st bit pattern, plus 2^20 steps over [-88, 0]; in quick mode every 6101st
 * pattern and 2^14 steps).
 * Contract (sdpa.h): "fast" within 3 ULP and "sleef" within 1 ULP where the result is a
 * normal float; no subnormal result; overflow gives +inf; NaN stays NaN; exp(-inf) = 0.
 * Then the exp that softmax and attention run, inside exp_sum (arguments <= 0, kernels.h),
 * with the same bound, and results below FLT_MIN below it (the flush after makes them 0); and
 * softmax's own, read through rows that normalise exactly. */
#include <fenv.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "dispatch.h"

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* error of got in units of the last place of the correctly rounded result */
static double ulp_error(float got, double want) {
    int e;
    frexp(want, &e); /* want = m * 2^e, m in [0.5, 1) */
    double ulp = ldexp(1.0, e - 24);
    return fabs((double)got - want) / ulp;
}

static void check_exp(const char *backend, int kind, double max_ulp) {
    const sdpa_kernels *k = sdpa_backend_kernels(backend);
    if (!k) cr_skip_test("backend %s is not compiled in or not supported by this CPU", backend);
    enum { CHUNK = 1 << 16 };
    float *x = malloc(CHUNK * sizeof(float)), *y = malloc(CHUNK * sizeof(float));
    double worst = 0.0;
    float worst_x = 0.0f;
    const uint64_t stride = test_quick() ? 6101 : 61;
    const uint32_t dense = test_quick() ? 1u << 14 : 1u << 20;
    uint64_t bits = 0;
    int phase = 0;
    while (phase < 2) {
        size_t n = 0;
        for (; n < CHUNK; n++) {
            if (phase == 0) { /* the whole range: every stride-th pattern */
                if (bits > 0xFFFFFFFFull) {
                    phase = 1;
                    bits = 0;
                    break;
                }
                x[n] = from_bits((uint32_t)bits);
                bits += stride;
            } else { /* dense where softmax lives: z - max in [-88, 0] */
                if (bits >= dense) {
                    phase = 2;
                    break;
                }
                x[n] = -88.0f * (float)bits / (float)dense;
                bits++;
            }
        }
        k->exp[kind](y, x, n);
        for (size_t i = 0; i < n; i++) {
            double want = exp((double)x[i]);
            if (isnan(x[i])) {
                cr_assert(isnan(y[i]), "%s exp(NaN) = %g", backend, y[i]);
                continue;
            }
            cr_assert(!(y[i] != 0.0f && y[i] < FLT_MIN), "%s: subnormal exp(%a) = %a", backend,
                      x[i], y[i]);
            if (want > FLT_MAX) {
                cr_assert(y[i] == INFINITY, "%s: exp(%a) = %a, want +inf", backend, x[i], y[i]);
            } else if (want < FLT_MIN) {
                cr_assert(y[i] == 0.0f || (y[i] == FLT_MIN && want > 0.5 * FLT_MIN),
                          "%s: exp(%a) = %a, want 0", backend, x[i], y[i]);
            } else {
                double err = ulp_error(y[i], want);
                if (err > worst) {
                    worst = err;
                    worst_x = x[i];
                }
            }
        }
    }
    cr_log_info("%s exp %s: max error %.3f ULP at x = %a", backend, kind ? "sleef" : "fast", worst,
                worst_x);
    cr_assert(worst <= max_ulp, "%s exp: %.3f ULP at x = %a", backend, worst, worst_x);
    float special[3] = {-INFINITY, INFINITY, 0.0f}, out[3];
    k->exp[kind](out, special, 3);
    cr_assert(out[0] == 0.0f && out[1] == INFINITY && out[2] == 1.0f);
    free(x);
    free(y);
}

/* exp_sum(y, x, n, scale, 0) over [-88, 0] densely, every float of [-0.5, 0] sampled, -inf
 * and NaN, once with scale 1 (its own path in some backends) and once with scale 0.5 on
 * doubled inputs (the products are exact, so the same exps are expected). */
static void check_exp_sum(const char *backend, int kind, double max_ulp) {
    const sdpa_kernels *k = sdpa_backend_kernels(backend);
    if (!k) cr_skip_test("backend %s is not compiled in or not supported by this CPU", backend);
    const size_t n = test_quick() ? (size_t)1 << 14 : (size_t)1 << 20; /* a multiple of 512 */
    float *x = malloc((n + 3) * sizeof(float)), *y = malloc((n + 3) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = i % 2 ? -88.0f * (float)i / (float)n : -from_bits(0x3f000000u - (uint32_t)i * 61);
    x[n] = -INFINITY, x[n + 1] = NAN, x[n + 2] = -0.0f;
    for (int pass = 0; pass < 2; pass++) {
        const float scale = pass ? 0.5f : 1.0f;
        if (pass)
            for (size_t i = 0; i < n + 3; i++) x[i] *= 2.0f;
        float sum = k->exp_sum[kind](y, x, n + 3, scale, 0.0f);
        cr_assert(isnan(sum), "%s exp_sum: a NaN input must make the sum NaN", backend);
        cr_assert(isnan(y[n + 1]) && y[n] >= 0.0f && y[n] < FLT_MIN && y[n + 2] == 1.0f,
                  "%s exp_sum: exp(-inf) = %a, exp(NaN) = %a, exp(0) = %a", backend, y[n], y[n + 1],
                  y[n + 2]);
        /* the sum, in blocks as softmax asks for it (src/kernels_api.c) */
        const size_t block = k->exp_sum_block;
        for (size_t i = 0; i + block <= n; i += block) {
            sum = k->exp_sum[kind](y + i, x + i, block, scale, 0.0f);
            double total = 0.0;
            for (size_t j = i; j < i + block; j++) total += y[j];
            cr_assert(fabs(sum - total) <= 1e-5 * total,
                      "%s exp_sum: returned %.9g, its outputs sum to %.9g", backend, sum, total);
        }
        double worst = 0.0;
        float worst_x = 0.0f;
        for (size_t i = 0; i < n; i++) {
            double z = (double)x[i] * scale, want = exp(z);
            if (want < FLT_MIN) {
                cr_assert(y[i] >= 0.0f && y[i] < FLT_MIN,
                          "%s exp_sum: exp(%a) = %a, want < FLT_MIN", backend, (float)z, y[i]);
                continue;
            }
            double err = ulp_error(y[i], want);
            if (err > worst) worst = err, worst_x = (float)z;
        }
        cr_log_info("%s exp_sum %s, scale %g: max error %.3f ULP at %a", backend,
                    kind ? "sleef" : "fast", scale, worst, worst_x);
        cr_assert(worst <= max_ulp, "%s exp_sum (scale %g): %.3f ULP at %a", backend, scale, worst,
                  worst_x);
    }
    free(x);
    free(y);
}

/* exp_sum(y, x, n, scale, shift) with the shifts softmax passes (a row's max): the avx512 and
 * avx2 backends fold the shift into their exp (exp_constants.h) up to |shift| = 2^16 and subtract
 * it beyond, so shifts on both sides of that, negative ones, and one with all 24 bits set. x =
 * shift
 * + d for d over [-88, 0] (and twice that with scale 0.5); the bound applies where the argument
 * z - shift is a float (so that every backend gets the same exact argument), which is every
 * element for most of these shifts and the ones near the shift for the others. */
static void check_exp_sum_shifted(const char *backend, int kind, double max_ulp) {
    const sdpa_kernels *k = sdpa_backend_kernels(backend);
    if (!k) cr_skip_test("backend %s is not compiled in or not supported by this CPU", backend);
    static const float shifts[] = {3.75f, -20.25f, 3.7f, 1000.5f, 65536.0f, 70000.5f, -1e5f};
    const size_t n = test_quick() ? (size_t)1 << 12 : (size_t)1 << 16;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    for (size_t s = 0; s < sizeof shifts / sizeof shifts[0]; s++) {
        const float shift = shifts[s];
        for (int pass = 0; pass < 2; pass++) {
            const float scale = pass ? 0.5f : 1.0f;
            for (size_t i = 0; i < n; i++) x[i] = (shift - 88.0f * (float)i / (float)n) / scale;
            x[0] = shift / scale; /* the max itself: exp(0) */
            float sum = k->exp_sum[kind](y, x, n, scale, shift);
            double total = 0.0, worst = 0.0;
            size_t checked = 0;
            for (size_t i = 0; i < n; i++) {
                total += y[i];
                double d = (double)(x[i] * scale) - shift, want = exp(d);
                if ((double)(float)d != d) continue; /* z - shift is not a float */
                if (want < FLT_MIN) {
                    cr_assert(y[i] >= 0.0f && y[i] < FLT_MIN,
                              "%s exp_sum shift %g: exp(%a) = %a, want < FLT_MIN", backend, shift,
                              (float)d, y[i]);
                    continue;
                }
                double err = ulp_error(y[i], want);
                if (err > worst) worst = err;
                checked++;
            }
            cr_assert(fabs(sum - total) <= 1e-5 * total,
                      "%s exp_sum shift %g: returned %.9g, its outputs sum to %.9g", backend, shift,
                      sum, total);
            cr_assert(checked >= 16, "shift %g: only %zu exact arguments", shift, checked);
            cr_log_info("%s exp_sum %s, shift %g, scale %g: max error %.3f ULP over %zu", backend,
                        kind ? "sleef" : "fast", shift, scale, worst, checked);
            cr_assert(worst <= max_ulp, "%s exp_sum (shift %g, scale %g): %.3f ULP", backend, shift,
                      scale, worst);
        }
    }
    free(x);
    free(y);
}

/* The exp that softmax itself runs, through the public entry: a row whose max is 0 and whose
 * other entries lie below -26 sums to exactly 1 in float (their exps add up to less than half an
 * ULP of 1), so its normalisation multiplies by exactly 1 and every weight is the exp of its
 * entry, unrounded by anything else. That reads softmax_short's own exp (avx512's 32-entry one,
 * exp_constants.h) as well as exp_sum's. The entries run densely over [-87.5, -26] (every table
 * entry and reduced argument many times over), rows of 1 to 16 floats (a single vector) and of 4081
 * to 4096 (every tail), the max at varying places, with scale 1 and with scale 0.5 on doubled
 * entries. avx512 shifts the exps by a guess taken from the row's ends (shift_guess.h, "A guessed
 * shift"): its fast exp folds the guess as a multiple of ln2, so the sum is then a power of two
 * and the weights stay exact, but SLEEF's exp(z - guess) carries the guess's rounding into the
 * normalisation. So with SLEEF's exp the max sits at an end, where the guess is the max. */
static void check_softmax_exps(const char *backend, const char *mode, double max_ulp) {
    use_backend(backend);
    cr_assert_eq(sdpa_set_exp_mode(mode), SDPA_OK);
    enum { LONG = 4096 };
    const int sleef = strcmp(mode, "sleef") == 0;
    float *x = malloc(LONG * sizeof(float)), *y = malloc(LONG * sizeof(float));
    const size_t total = test_quick() ? (size_t)1 << 14 : (size_t)1 << 20;
    double worst = 0.0;
    float worst_z = 0.0f;
    for (int pass = 0; pass < 2; pass++) {
        const float scale = pass ? 0.5f : 1.0f;
        size_t done = 0;
        for (size_t row = 0; done < total; row++) {
            const size_t n = row % 4 == 0 ? 1 + row / 4 % 16 : LONG - row / 4 % 16;
            const size_t top = !sleef ? (row * 37) % n : row % 2 ? n - 1 : 0;
            for (size_t i = 0; i < n; i++) {
                if (i == top) {
                    x[i] = 0.0f;
                    continue;
                }
                x[i] = (-26.0f - 61.5f * (float)(done % total) / (float)total) / scale;
                done++;
            }
            cr_assert_eq(sdpa_softmax_f32(y, x, n, scale), SDPA_OK);
            cr_assert(y[top] == 1.0f, "%s %s: the max's weight is %a, not exactly 1 (n %zu)",
                      backend, mode, y[top], n);
            for (size_t i = 0; i < n; i++) {
                if (i == top) continue;
                const double want = exp((double)x[i] * scale);
                if (want < FLT_MIN) {
                    cr_assert(y[i] == 0.0f || (y[i] == FLT_MIN && want > 0.5 * FLT_MIN),
                              "%s %s: weight %a for exp(%a), want 0", backend, mode, y[i],
                              x[i] * scale);
                    continue;
                }
                const double err = ulp_error(y[i], want);
                if (err > worst) worst = err, worst_z = x[i] * scale;
            }
        }
    }
    cr_log_info("%s softmax's exp (%s): max error %.3f ULP at %a", backend, mode, worst, worst_z);
    cr_assert(worst <= max_ulp, "%s softmax's exp (%s): %.3f ULP at %a", backend, mode, worst,
              worst_z);
    sdpa_set_exp_mode("fast");
    free(x);
    free(y);
}

/* exp_sum under the directed rounding modes: the fast exp's arithmetic then rounds up, down or
 * toward 0, but its reduction must still round N to nearest (avx2's magic-number rounding
 * follows MXCSR, so in a directed mode avx2 takes roundps instead). Left to the mode, the reduced
 * argument reaches ln2 / 8 and the error about 20 ULP. */
static void check_exp_sum_directed(const char *backend) {
    static const int modes[] = {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        cr_assert_eq(fesetround(modes[m]), 0);
        check_exp_sum(backend, SDPA_EXP_FAST, 4.0);
        cr_assert_eq(fegetround(), modes[m], "%s exp_sum changed the rounding mode", backend);
        fesetround(FE_TONEAREST);
    }
}

#define EXP_TESTS(unused, b, ...)                                                                  \
    Test(exp, fast_##b) { check_exp(#b, SDPA_EXP_FAST, 3.0); }                                     \
    Test(exp, sleef_##b) { check_exp(#b, SDPA_EXP_SLEEF, 1.0); }                                   \
    Test(exp, sum_fast_##b) { check_exp_sum(#b, SDPA_EXP_FAST, 3.0); }                             \
    Test(exp, sum_sleef_##b) { check_exp_sum(#b, SDPA_EXP_SLEEF, 1.0); }                           \
    Test(exp, sum_fast_directed_##b) { check_exp_sum_directed(#b); }                               \
    Test(exp, sum_shifted_fast_##b) { check_exp_sum_shifted(#b, SDPA_EXP_FAST, 3.0); }             \
    Test(exp, sum_shifted_sleef_##b) { check_exp_sum_shifted(#b, SDPA_EXP_SLEEF, 1.0); }           \
    Test(exp, softmax_fast_##b) { check_softmax_exps(#b, "fast", 3.0); }                           \
    Test(exp, softmax_sleef_##b) { check_softmax_exps(#b, "sleef", 1.0); }
SDPA_BACKENDS(EXP_TESTS, )
