/* The softmax of a row whose largest z = scale * x is not finite (sdpa.h's special values),
 * written once for every backend and for the softmax driver in src/. Compiled for the baseline
 * ISA, apart from every backend: any of them may call it, on any CPU. */
#include <math.h>

#include "kernels.h"

static void fill(float *y, size_t n, float value) {
    for (size_t i = 0; i < n; i++) y[i] = value;
}

void sdpa_softmax_nonfinite_from(float *y, const float *x, size_t n, float scale, size_t from,
                                 int nan_before) {
    size_t n_inf = 0;
    int has_nan = nan_before;
    for (size_t i = from; i < n; i++) {
        float z = scale * x[i];
        has_nan |= isnan(z);
        n_inf += z == INFINITY;
    }
    if (has_nan) {
        fill(y, n, NAN);
        return;
    }
    float share = n_inf ? 1.0f / (float)n_inf : 0.0f;
    fill(y, from, 0.0f);
    for (size_t i = from; i < n; i++) y[i] = scale * x[i] == INFINITY ? share : 0.0f;
}

int sdpa_softmax_nonfinite(float *y, const float *x, size_t n, float scale) {
    sdpa_softmax_nonfinite_from(y, x, n, scale, 0, 0);
    return 0;
}
