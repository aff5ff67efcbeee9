/* White-box: each backend's exp, both kinds, against exp() in double over the whole float
 * range (every 61st bit pattern, plus 2^20 steps over [-88, 0]; in quick mode every 6101st
 * pattern and 2^14 steps).
 * Contract (sdpa.h): "fast" within 3 ULP and "sleef" within 1 ULP where the result is a
 * normal float; no subnormal result; overflow gives +inf; NaN stays NaN; exp(-inf) = 0. */
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

#define EXP_TESTS(b)                                                                               \
    Test(exp, fast_##b) { check_exp(#b, SDPA_EXP_FAST, 3.0); }                                     \
    Test(exp, sleef_##b) { check_exp(#b, SDPA_EXP_SLEEF, 1.0); }
FOR_EACH_BACKEND(EXP_TESTS)
