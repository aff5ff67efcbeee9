#include "checks.h"
#include "bounds.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"

int check_dot(float got, const float *a, const float *b, size_t n, char *why) {
    double want = ref_dot(a, b, n), bound = bound_dot(ref_dot_abs(a, b, n));
    if (fabs(got - want) <= bound) return 0;
    snprintf(why, WHY_LEN, "dot n=%zu: got %.9g want %.9g (bound %.3g)", n, got, want, bound);
    return 1;
}

int check_scale(const float *y, const float *x, size_t n, float alpha, char *why) {
    for (size_t i = 0; i < n; i++) {
        volatile float want = alpha * x[i];
        if (memcmp(&y[i], (const void *)&want, sizeof want) != 0) {
            snprintf(why, WHY_LEN, "scale n=%zu i=%zu: %a * %a gave %a, want %a", n, i, alpha, x[i],
                     y[i], want);
            return 1;
        }
    }
    return 0;
}

int check_softmax(const float *y, const float *x, size_t n, float scale, char *why) {
    double *want = malloc((n ? n : 1) * sizeof(double));
    if (!want) abort();
    ref_softmax(want, x, n, scale);
    double tol = bound_softmax_rel(n);
    int bad = 0;
    for (size_t i = 0; i < n && !bad; i++) {
        if (y[i] != 0.0f && fabsf(y[i]) < FLT_MIN)
            bad = snprintf(why, WHY_LEN, "softmax n=%zu i=%zu: subnormal %a", n, i, y[i]);
        else if (isnan(want[i]))
            bad = !isnan(y[i]) &&
                  snprintf(why, WHY_LEN, "softmax n=%zu i=%zu: want NaN, got %g", n, i, y[i]);
        else if (want[i] < 2.0 * FLT_MIN)
            bad =
                !(y[i] >= 0.0f && y[i] < 3.0 * FLT_MIN) &&
                snprintf(why, WHY_LEN, "softmax n=%zu i=%zu: want %g, got %g", n, i, want[i], y[i]);
        else if (!(fabs(y[i] - want[i]) <= tol * want[i]))
            bad = snprintf(why, WHY_LEN, "softmax n=%zu i=%zu: got %.9g want %.9g (rel %.3g)", n, i,
                           y[i], want[i], fabs(y[i] - want[i]) / want[i]);
    }
    free(want);
    return bad != 0;
}

int check_backward(const float *dx, const float *y, const float *dy, size_t n, float scale,
                   char *why) {
    double s = ref_dot(y, dy, n), s_abs = ref_dot_abs(y, dy, n);
    for (size_t i = 0; i < n; i++) {
        double want = (double)scale * y[i] * (dy[i] - s);
        double bound = bound_backward(fabs(dy[i]) + s_abs, fabs(scale) * fabs(y[i]), n);
        if (!(fabs(dx[i] - want) <= bound)) {
            snprintf(why, WHY_LEN, "softmax_backward n=%zu i=%zu: got %.9g want %.9g", n, i, dx[i],
                     want);
            return 1;
        }
    }
    return 0;
}

int check_scores(const float *s, const float *q, const float *k, size_t n_keys, size_t d,
                 size_t stride, float scale, char *why) {
    for (size_t j = 0; j < n_keys; j++) {
        const float *kj = k + j * stride;
        double want = scale * ref_dot(q, kj, d);
        double bound = bound_dot(fabs(scale) * ref_dot_abs(q, kj, d));
        if (!(fabs(s[j] - want) <= bound)) {
            snprintf(why, WHY_LEN, "scores n_keys=%zu d=%zu stride=%zu j=%zu: got %.9g want %.9g",
                     n_keys, d, stride, j, s[j], want);
            return 1;
        }
    }
    return 0;
}

int check_attention(const float *out, size_t out_stride, const float *q, size_t q_stride,
                    const float *k, size_t k_stride, const float *v, size_t v_stride,
                    const float *mask, size_t mask_stride, size_t len_q, size_t len_kv, size_t d_k,
                    size_t d_v, float scale, int causal, char *why) {
    double s = scale == 0.0f ? 1.0 / sqrt((double)d_k) : (double)scale;
    double *want = malloc((len_q * d_v + 1) * sizeof(double));
    if (!want) abort();
    ref_attention(want, d_v, q, q_stride, k, k_stride, v, v_stride, mask, mask_stride, len_q,
                  len_kv, d_k, d_v, s, causal);
    double max_v = 0.0;
    for (size_t j = 0; j < len_kv; j++)
        for (size_t c = 0; c < d_v; c++)
            if (fabs((double)v[j * v_stride + c]) > max_v)
                max_v = fabs((double)v[j * v_stride + c]);
    double bound = bound_attention(max_v) + 1e-37;
    int bad = 0;
    for (size_t i = 0; i < len_q && !bad; i++) {
        for (size_t c = 0; c < d_v && !bad; c++) {
            float got = out[i * out_stride + c];
            if (!(fabs(got - want[i * d_v + c]) <= bound))
                bad = snprintf(why, WHY_LEN,
                               "attention len_q=%zu len_kv=%zu d_k=%zu d_v=%zu causal=%d mask=%d "
                               "[%zu][%zu]: got %.9g want %.9g (bound %.3g)",
                               len_q, len_kv, d_k, d_v, causal, mask != NULL, i, c, got,
                               want[i * d_v + c], bound) > 0;
        }
    }
    free(want);
    return bad;
}
