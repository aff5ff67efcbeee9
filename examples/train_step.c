/* One training step of causal self-attention: the forward keeps each row's log-sum-exp, the
 * backward recomputes the weights from it and returns dL/dq, dL/dk, dL/dv for dL/dout = out
 * (the loss L = |out|^2 / 2). Build: cc train_step.c $(pkg-config --cflags --libs sdpa) -lm
 * (or through meson: examples/train_step). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa.h"

enum { HEADS = 4, LEN = 256, D = 64, N = HEADS * LEN * D };

static double norm(const float *x, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return sqrt(s);
}

int main(void) {
    float *q = malloc(7 * N * sizeof(float)), *lse = malloc(HEADS * LEN * sizeof(float));
    if (!q || !lse) return 1;
    float *k = q + N, *v = k + N, *out = v + N, *dq = out + N, *dk = dq + N, *dv = dk + N;
    for (size_t i = 0; i < 3 * (size_t)N; i++) q[i] = (float)sin(0.37 * (double)i);

    sdpa_mha_desc desc;
    sdpa_mha_desc_dense(&desc, 1, HEADS, HEADS, LEN, LEN, D, D, SDPA_DEFAULT_SCALE, SDPA_CAUSAL);
    desc.lse = lse; /* [batch][head][row] */
    desc.lse_stride[0] = HEADS * LEN;
    desc.lse_stride[1] = LEN;
    sdpa_status st = sdpa_mha_f32(&desc, out, q, k, v);

    sdpa_mha_grads g = {.struct_size = sizeof g, .dq = dq, .dk = dk, .dv = dv, .dout = out};
    memcpy(g.dq_stride, desc.q_stride, sizeof g.dq_stride); /* each laid out like its input */
    memcpy(g.dk_stride, desc.k_stride, sizeof g.dk_stride);
    memcpy(g.dv_stride, desc.v_stride, sizeof g.dv_stride);
    memcpy(g.dout_stride, desc.out_stride, sizeof g.dout_stride);
    if (st == SDPA_OK) st = sdpa_mha_backward_f32(&desc, &g, q, k, v, out);
    if (st != SDPA_OK) {
        printf("sdpa: %s\n", sdpa_status_string(st));
        return 1;
    }
    printf("backend %s: |out| %.4f  |dq| %.4f  |dk| %.4f  |dv| %.4f\n", sdpa_backend(),
           norm(out, N), norm(dq, N), norm(dk, N), norm(dv, N));
    free(q);
    free(lse);
    return 0;
}
