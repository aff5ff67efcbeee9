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
static double dot_d(const double *a, const double *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static double dot_abs_d(const double *a, const double *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += fabs(a[i] * b[i]);
    return s;
}

void ref_attention_grads(double *dq, double *dk, double *dv, double *out, double *tq, double *tk,
                         double *tv, const double *q, const double *k, const double *v,
                         const double *dout, const float *mask, size_t len_q, size_t len_kv,
                         size_t d_k, size_t d_v, double scale, int causal) {
    const size_t n = len_kv ? len_kv : 1;
    double *s = malloc(n * sizeof *s), *dp = malloc(n * sizeof *dp), *e = malloc(n * sizeof *e);
    double *o = malloc((d_v ? d_v : 1) * sizeof *o);
    unsigned char *seen = malloc(n);
    for (size_t x = 0; x < len_kv * d_k; x++) dk[x] = 0.0;
    for (size_t x = 0; x < len_kv * d_v; x++) dv[x] = 0.0;
    if (tk)
        for (size_t x = 0; x < len_kv * d_k; x++) tk[x] = 0.0;
    if (tv)
        for (size_t x = 0; x < len_kv * d_v; x++) tv[x] = 0.0;
    for (size_t i = 0; i < len_q; i++) {
        const double *qi = q + i * d_k, *gi = dout + i * d_v;
        double *dqi = dq + i * d_k;
        for (size_t c = 0; c < d_k; c++) dqi[c] = 0.0;
        if (tq)
            for (size_t c = 0; c < d_k; c++) tq[i * d_k + c] = 0.0;
        for (size_t c = 0; c < d_v; c++) o[c] = 0.0;
        double m = -INFINITY;
        for (size_t j = 0; j < len_kv; j++) {
            seen[j] = (!causal || j + len_q <= i + len_kv) &&
                      !(mask && mask[i * len_kv + j] == -INFINITY);
            if (!seen[j]) continue;
            s[j] = scale * dot_d(qi, k + j * d_k, d_k) + (mask ? mask[i * len_kv + j] : 0.0);
            if (s[j] > m) m = s[j];
        }
        if (m != -INFINITY) {
            double sum = 0.0;
            for (size_t j = 0; j < len_kv; j++)
                if (seen[j]) sum += (s[j] = exp(s[j] - m));
            double dd = 0.0, dd_abs = 0.0;
            for (size_t j = 0; j < len_kv; j++) {
                if (!seen[j]) continue;
                s[j] /= sum; /* P_ij */
                dp[j] = dot_d(gi, v + j * d_v, d_v);
                dd += s[j] * dp[j];
                for (size_t c = 0; c < d_v; c++) o[c] += s[j] * v[j * d_v + c];
            }
            dd_abs = dot_abs_d(gi, o, d_v);
            for (size_t j = 0; j < len_kv; j++) {
                if (!seen[j]) continue;
                const double p = s[j], ds = p * (dp[j] - dd);
                e[j] = p * (fabs(dp[j]) + fabs(dd) + dot_abs_d(gi, v + j * d_v, d_v) + dd_abs);
                for (size_t c = 0; c < d_k; c++) {
                    dqi[c] += scale * ds * k[j * d_k + c];
                    dk[j * d_k + c] += scale * ds * qi[c];
                    if (tq) tq[i * d_k + c] += fabs(scale) * e[j] * fabs(k[j * d_k + c]);
                    if (tk) tk[j * d_k + c] += fabs(scale) * e[j] * fabs(qi[c]);
                }
                for (size_t c = 0; c < d_v; c++) {
                    dv[j * d_v + c] += p * gi[c];
                    if (tv) tv[j * d_v + c] += p * fabs(gi[c]);
                }
            }
        }
        if (out)
            for (size_t c = 0; c < d_v; c++) out[i * d_v + c] = o[c];
    }
    free(s);
    free(dp);
    free(e);
    free(o);
    free(seen);
}

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
