/* Public kernel entry points: check arguments once, then hand valid input to the active
 * backend. The softmax special-value rules live here, once, for every backend. */
#include <math.h>
#include <stdint.h>

#include "dispatch.h"
#include "sdpa.h"

/* exp_sum runs in chunks whose float sums are added in double: a row of 2^20 weights then
 * loses no more accuracy in its sum than a row of SOFTMAX_CHUNK does. The chunk is short enough
 * that even the scalar backend's four lane sums (128 additions each) stay well inside the 2e-5
 * bound when every rounding errs the same way (a row of equal weights did 3.1e-5 at n = 2815
 * with 4096: tests/test_regressions.c). */
#define SOFTMAX_CHUNK 512

SDPA_API const char *sdpa_status_string(sdpa_status status) {
    switch (status) {
    case SDPA_OK: return "ok";
    case SDPA_ERR_NULL: return "a required pointer is NULL";
    case SDPA_ERR_SIZE: return "invalid size: zero where work is needed, or overflowing";
    case SDPA_ERR_ARG: return "invalid argument (scale, flags or descriptor)";
    case SDPA_ERR_UNSUPPORTED: return "unsupported: unknown name or not runnable on this CPU";
    }
    return "unknown status";
}

SDPA_API uint32_t sdpa_abi_version(void) { return SDPA_ABI_VERSION; }

SDPA_API const char *sdpa_version(void) { return SDPA_VERSION_STRING; }

static int bad_scale(float scale) { return !isfinite(scale) || scale == 0.0f; }

SDPA_API sdpa_status sdpa_dot_f32(const float *a, const float *b, size_t n, float *result) {
    if (!result || (n && (!a || !b))) return SDPA_ERR_NULL;
    *result = n ? sdpa_kernels_now()->dot(a, b, n) : 0.0f;
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_scale_f32(float *y, const float *x, size_t n, float alpha) {
    if (n && (!y || !x)) return SDPA_ERR_NULL;
    if (n) sdpa_kernels_now()->scale(y, x, n, alpha);
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_scores_f32(float *s, const float *q, const float *k, size_t n_keys,
                                     size_t d, size_t k_stride, float scale) {
    if (n_keys && (!s || !q || !k)) return SDPA_ERR_NULL;
    if (n_keys &&
        (d == 0 || k_stride < d || (n_keys - 1) > (SIZE_MAX / sizeof(float) - d) / k_stride))
        return SDPA_ERR_SIZE;
    if (!isfinite(scale)) return SDPA_ERR_ARG;
    if (n_keys) sdpa_kernels_now()->scores(s, q, k, n_keys, d, k_stride, scale);
    return SDPA_OK;
}

/* The rare rows whose largest z is not finite: NaN anywhere gives NaN everywhere; otherwise
 * the +inf entries share the mass (all zeros when there are none, a fully masked row). */
static void softmax_nonfinite(float *y, const float *x, size_t n, float scale) {
    size_t n_inf = 0;
    int has_nan = 0;
    for (size_t i = 0; i < n; i++) {
        float z = scale * x[i];
        has_nan |= isnan(z);
        n_inf += z == INFINITY;
    }
    float share = n_inf ? 1.0f / (float)n_inf : 0.0f;
    for (size_t i = 0; i < n; i++) y[i] = has_nan ? NAN : scale * x[i] == INFINITY ? share : 0.0f;
}

SDPA_API sdpa_status sdpa_softmax_f32(float *y, const float *x, size_t n, float scale) {
    if (n && (!y || !x)) return SDPA_ERR_NULL;
    if (bad_scale(scale)) return SDPA_ERR_ARG;
    if (!n) return SDPA_OK;
    const sdpa_kernels *k = sdpa_kernels_now();
    float m = k->max_scaled(x, n, scale);
    if (!isfinite(m)) {
        softmax_nonfinite(y, x, n, scale);
        return SDPA_OK;
    }
    float (*exp_sum)(float *, const float *, size_t, float, float) = k->exp_sum[sdpa_exp_now()];
    double sum = 0.0;
    for (size_t i = 0; i < n; i += SOFTMAX_CHUNK) {
        size_t len = n - i < SOFTMAX_CHUNK ? n - i : SOFTMAX_CHUNK;
        sum += exp_sum(y + i, x + i, len, scale, m);
    }
    /* sum >= 1 (the max contributes exp(0)), or NaN when x holds a NaN: then every y is NaN */
    k->normalize(y, n, (float)(1.0 / sum));
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_softmax_backward_f32(float *dx, const float *y, const float *dy, size_t n,
                                               float scale) {
    if (n && (!dx || !y || !dy)) return SDPA_ERR_NULL;
    if (bad_scale(scale)) return SDPA_ERR_ARG;
    if (!n) return SDPA_OK;
    const sdpa_kernels *k = sdpa_kernels_now();
    k->softmax_backward(dx, y, dy, n, scale, k->dot(y, dy, n));
    return SDPA_OK;
}
