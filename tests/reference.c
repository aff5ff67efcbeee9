#include "reference.h"

#include <math.h>
#include <stdlib.h>

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

void ref_attention(double *out, size_t out_stride, const float *q, size_t q_stride, const float *k,
                   size_t k_stride, const float *v, size_t v_stride, const float *mask,
                   size_t mask_stride, size_t len_q, size_t len_kv, size_t d_k, size_t d_v,
                   double scale, int causal) {
    double *s = malloc((len_kv ? len_kv : 1) * sizeof *s);
    unsigned char *seen = malloc(len_kv ? len_kv : 1);
    for (size_t i = 0; i < len_q; i++) {
        double *o = out + i * out_stride;
        double m = -INFINITY;
        int any = 0, nan = 0;
        for (size_t j = 0; j < len_kv; j++) {
            /* causal: j <= i + len_kv - len_q, written without unsigned wrap-around */
            seen[j] = !causal || j + len_q <= i + len_kv;
            if (mask && mask[i * mask_stride + j] == -INFINITY) seen[j] = 0;
            if (!seen[j]) continue;
            s[j] = scale * ref_dot(q + i * q_stride, k + j * k_stride, d_k);
            if (mask) s[j] += mask[i * mask_stride + j];
            any = 1;
            if (isnan(s[j])) nan = 1;
            if (s[j] > m) m = s[j];
        }
        for (size_t c = 0; c < d_v; c++) o[c] = 0.0;
        if (!any) continue;
        if (nan) {
            for (size_t c = 0; c < d_v; c++) o[c] = NAN;
            continue;
        }
        double sum = 0.0;
        for (size_t j = 0; j < len_kv; j++) {
            if (!seen[j]) continue;
            double w = exp(s[j] - m);
            sum += w;
            const float *vj = v + j * v_stride;
            for (size_t c = 0; c < d_v; c++) o[c] += w * vj[c];
        }
        for (size_t c = 0; c < d_v; c++) o[c] /= sum;
    }
    free(s);
    free(seen);
}

/* the fields of a 16-bit pattern with `mbits` significand bits and exponent bias `bias` */
static double ref_decode16(uint16_t h, int mbits, int bias) {
    const int ebits = 15 - mbits;
    const unsigned e = (h >> mbits) & ((1u << ebits) - 1), m = h & ((1u << mbits) - 1);
    const double sign = (h & 0x8000u) ? -1.0 : 1.0;
    if (e == (1u << ebits) - 1) return m ? NAN : sign * INFINITY;
    if (e == 0) return sign * ldexp((double)m, 1 - bias - mbits);
    return sign * ldexp(1.0 + ldexp((double)m, -mbits), (int)e - bias);
}

double ref_f16(uint16_t h) { return ref_decode16(h, 10, 15); }
double ref_bf16(uint16_t h) { return ref_decode16(h, 7, 127); }
