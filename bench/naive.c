/* The "naive C loop" peer: what a user writes without a library, compiled with
 * -O3 -march=native -ffast-math so the compiler vectorizes it as well as it can (glibc's
 * libmvec supplies a vector expf under -ffast-math). */
#include <math.h>

#include "peers.h"

const char NAIVE_FLAGS[] = "-O3 -march=native -ffast-math";

float naive_dot(const float *a, const float *b, size_t n) {
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void naive_softmax(float *y, const float *x, size_t n, float scale) {
    float m = -INFINITY;
    for (size_t i = 0; i < n; i++) m = fmaxf(m, scale * x[i]);
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) {
        y[i] = expf(scale * x[i] - m);
        s += y[i];
    }
    float r = 1.0f / s;
    for (size_t i = 0; i < n; i++) y[i] *= r;
}

void naive_scale(float *y, const float *x, size_t n, float alpha) {
    for (size_t i = 0; i < n; i++) y[i] = alpha * x[i];
}

void naive_scores(float *s, const float *q, const float *k, size_t n_keys, size_t d,
                  size_t k_stride, float scale) {
    for (size_t j = 0; j < n_keys; j++) {
        float acc = 0.0f;
        for (size_t i = 0; i < d; i++) acc += q[i] * k[j * k_stride + i];
        s[j] = scale * acc;
    }
}
