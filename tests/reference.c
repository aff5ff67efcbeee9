#include "reference.h"

#include <math.h>

double ref_dot(const float *a, const float *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
    return s;
}

double ref_dot_abs(const float *a, const float *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += fabs((double)a[i] * (double)b[i]);
    return s;
}

void ref_softmax(double *y, const float *x, size_t n, float scale) {
    double m = -INFINITY;
    size_t n_pos_inf = 0;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        float z = scale * x[i];
        if (isnan(z)) nan = 1;
        if (z == INFINITY) n_pos_inf++;
        if (z > m) m = z;
    }
    for (size_t i = 0; i < n; i++) {
        float z = scale * x[i];
        if (nan)
            y[i] = NAN;
        else if (n_pos_inf)
            y[i] = z == INFINITY ? 1.0 / (double)n_pos_inf : 0.0;
        else if (m == -INFINITY)
            y[i] = 0.0;
        else
            y[i] = exp((double)z - m);
    }
    if (nan || n_pos_inf || m == -INFINITY) return;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += y[i];
    for (size_t i = 0; i < n; i++) y[i] /= sum;
}
