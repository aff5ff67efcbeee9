/* The libraries the benchmark compares sdpa with. Each is optional (found at configure time);
 * an absent one reports itself unavailable and its rows are left out. */
#ifndef SDPA_BENCH_PEERS_H
#define SDPA_BENCH_PEERS_H

#include <stddef.h>

/* OpenBLAS cblas_sdot. describe() names the version, the core kernels chosen at load time and
 * the environment that chose them; NULL when not built in. */
const char *peer_openblas_describe(void);
float peer_openblas_sdot(const float *a, const float *b, size_t n);
/* s = scale * K q through cblas_sgemv (row-major K of n_keys rows, k_stride floats apart): the
 * BLAS way to score one query against a cache of keys. */
void peer_openblas_scores(float *s, const float *q, const float *k, size_t n_keys, size_t d,
                          size_t k_stride, float scale);
/* The attention an engine writes without sdpa, on dense [batch][head][row][col] tensors with
 * d_k = d_v = d and scale 1/sqrt(d): per head, S = scale Q K^T by cblas_sgemm (cblas_sgemv for
 * one query), a softmax per row (sdpa_softmax_f32 on the best backend; causal: the hidden keys
 * set to -inf), O = S V by sgemm (sgemv). scores holds len_q * len_kv floats. */
void peer_openblas_attention(float *out, const float *q, const float *k, const float *v,
                             float *scores, size_t batch, size_t heads_q, size_t heads_kv,
                             size_t len_q, size_t len_kv, size_t d, int causal);

/* oneDNN's softmax primitive (forward inference, accurate, axis 1 of a 1 x n f32 tensor), bound
 * to fixed x and y buffers. create() returns NULL when oneDNN is absent or refuses the shape. */
typedef struct peer_dnnl_softmax peer_dnnl_softmax;
const char *peer_dnnl_describe(void);
peer_dnnl_softmax *peer_dnnl_softmax_create(float *y, const float *x, size_t n);
void peer_dnnl_softmax_run(peer_dnnl_softmax *p);
void peer_dnnl_softmax_destroy(peer_dnnl_softmax *p);

/* The loops a user would write, compiled with -O3 -march=native -ffast-math (naive.c). */
float naive_dot(const float *a, const float *b, size_t n);
void naive_softmax(float *y, const float *x, size_t n, float scale);
void naive_scale(float *y, const float *x, size_t n, float alpha);
void naive_scores(float *s, const float *q, const float *k, size_t n_keys, size_t d,
                  size_t k_stride, float scale);
extern const char NAIVE_FLAGS[];

#endif
