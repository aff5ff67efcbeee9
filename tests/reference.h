/* Double-precision references, written from the textbook formulas and independent of every
 * backend (none of them calls into the library). */
#ifndef SDPA_TESTS_REFERENCE_H
#define SDPA_TESTS_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

double ref_dot(const float *a, const float *b, size_t n);
double ref_dot_abs(const float *a, const float *b, size_t n); /* sum |a_i b_i| */
/* softmax of z_i = (float)(scale * x_i), with the special-value rules of sdpa.h */
void ref_softmax(double *y, const float *x, size_t n, float scale);

/* Attention of one head by the textbook formula, in double: for query row i, the keys it sees
 * are j <= i + len_kv - len_q when causal, and those whose mask entry is not -inf;
 * s_j = scale * q_i . k_j + mask_ij, out_i = sum_j exp(s_j - max s) v_j / sum_j exp(s_j - max s).
 * A row that sees no key is zeros. Rows of each array are `*_stride` floats apart; mask may be
 * NULL. */
void ref_attention(double *out, size_t out_stride, const float *q, size_t q_stride, const float *k,
                   size_t k_stride, const float *v, size_t v_stride, const float *mask,
                   size_t mask_stride, size_t len_q, size_t len_kv, size_t d_k, size_t d_v,
                   double scale, int causal);

/* The gradients of one head's attention, L = sum out * dout, by the textbook formulas in double,
 * from double inputs (dense rows: q[len_q][d_k], k[len_kv][d_k], v and dk, dv [len_kv][...],
 * dout, out [len_q][d_v]; mask [len_q][len_kv] or NULL), with the same keys seen as
 * ref_attention. For row i and a key j it sees: P_ij = softmax_j(s_ij), dP_ij = dout_i . v_j,
 * D_i = sum_j P_ij dP_ij, dS_ij = P_ij (dP_ij - D_i); dq_i = scale sum_j dS_ij k_j,
 * dk_j = scale sum_i dS_ij q_i, dv_j = sum_i P_ij dout_i (dq, dk, dv are written). A row that
 * sees no key adds nothing. out, when not NULL, receives the forward's output (zeros for such a
 * row). The t* arrays (not NULL) receive the bounds' terms of include/sdpa.h: tv_jc = sum_i P_ij
 * |dout_ic|, tk_jc = |scale| sum_i E_ij |q_ic|, tq_ic = |scale| sum_j E_ij |k_jc|. */
void ref_attention_grads(double *dq, double *dk, double *dv, double *out, double *tq, double *tk,
                         double *tv, const double *q, const double *k, const double *v,
                         const double *dout, const float *mask, size_t len_q, size_t len_kv,
                         size_t d_k, size_t d_v, double scale, int causal);

/* The value of an f16 (IEEE binary16) or bf16 (the upper half of a binary32) bit pattern, from
 * its sign, exponent and significand fields; NaN for a NaN. */
double ref_f16(uint16_t h);
double ref_bf16(uint16_t h);

#endif
