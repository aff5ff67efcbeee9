/* Contract checks shared by the hardening tests (test_guards.c, test_fpenv.c, test_threads.c):
 * each compares one entry point's output with the double-precision reference under the bounds
 * of include/sdpa.h, for inputs in range. They return 0 when the output holds and otherwise
 * write why into `why` (so threads can report without asserting); CHECK_OK asserts. */
#ifndef SDPA_TESTS_CHECKS_H
#define SDPA_TESTS_CHECKS_H

#include <stddef.h>

#define WHY_LEN 256

int check_dot(float got, const float *a, const float *b, size_t n, char *why);
/* bit-exact against one multiply in the caller's current rounding mode */
int check_scale(const float *y, const float *x, size_t n, float alpha, char *why);
int check_softmax(const float *y, const float *x, size_t n, float scale, char *why);
int check_backward(const float *dx, const float *y, const float *dy, size_t n, float scale,
                   char *why);
int check_scores(const float *s, const float *q, const float *k, size_t n_keys, size_t d,
                 size_t stride, float scale, char *why);
/* One head of attention (rows *_stride floats apart; mask NULL or [len_q][mask_stride]) against
 * ref_attention: |out - ref| <= 1e-5 * max|v| per output (finite inputs of moderate size).
 * scale is the argument as passed (SDPA_DEFAULT_SCALE means 1/sqrt(d_k)). */
int check_attention(const float *out, size_t out_stride, const float *q, size_t q_stride,
                    const float *k, size_t k_stride, const float *v, size_t v_stride,
                    const float *mask, size_t mask_stride, size_t len_q, size_t len_kv, size_t d_k,
                    size_t d_v, float scale, int causal, char *why);

/* Fails the current Criterion test unless fn(args..., why) passes: CHECK_OK(check_dot, "ctx", got,
 * a, b, n). */
#define CHECK_OK(fn, context, ...)                                                                 \
    do {                                                                                           \
        char why_[WHY_LEN] = "";                                                                   \
        if (fn(__VA_ARGS__, why_)) cr_assert_fail("%s: %s", context, why_);                        \
    } while (0)

#endif
