/* The accuracy bounds of include/sdpa.h, written once for every test, the plugin host and the
 * fuzzers: each gives the largest error the contract allows for one output, from quantities
 * the caller computes with the double-precision reference. */
#ifndef SDPA_TESTS_BOUNDS_H
#define SDPA_TESTS_BOUNDS_H

#include <float.h>
#include <math.h>
#include <stddef.h>

/* dot and scores: |error| <= 1e-5 * sum_i |a_i b_i| (abs_sum) for n <= 4096, and for scores the
 * same times |scale|; the tiny floor lets an exact 0 compare as 0 */
static inline double bound_dot(double abs_sum) { return 1e-5 * abs_sum + 1e-30; }

/* softmax: relative error per weight, for |scale x| <= 80 */
static inline double bound_softmax_rel(size_t n) { return n <= 4096 ? 2e-5 : 1e-4; }

/* softmax_backward, output i: terms = |dy_i| + sum_j |y_j dy_j|, sy = |scale y_i|; the FLT_MIN
 * terms are what flush-to-zero can lose (products, sums and the last three operations) */
static inline double bound_backward(double terms, double sy, size_t n) {
    return (1e-5 * sy + FLT_MIN) * terms + FLT_MIN * (1.0 + (2.0 * (double)n + 1.0) * sy);
}

/* attention: |error| <= 1e-5 * max|v| per output, for len_kv <= 4096, d_k <= 256, unit-normal
 * inputs and the default scale */
static inline double bound_attention(double max_abs_v) { return 1e-5 * max_abs_v; }

/* attention with scores of any size (sdpa.h: the error grows with the scores): the bound above
 * plus what rounding the scores to float adds. An absolute error delta in the scores moves each
 * weight by about delta relative, and the output by at most 2 max|v| max delta. A float dot of
 * d_k terms is within d_k 2^-24 sum |q_p k_p| (more than |s| where terms cancel: found by the
 * fuzzer at d_k 257, scale 2); the scale and mask roundings add a few |s| 2^-24. max_abs_s is
 * the row's largest |score|, max_terms its largest |scale| sum_p |q_p k_jp|. */
static inline double bound_attention_scores(double max_abs_v, double max_abs_s, double max_terms,
                                            size_t d_k) {
    return bound_attention(max_abs_v) +
           max_abs_v * (8.0 * 0x1p-24 * max_abs_s + 2.0 * (double)(d_k + 2) * 0x1p-24 * max_terms);
}

#endif
