/* Double-precision references, written from the textbook formulas and independent of every
 * backend (none of them calls into the library). */
#ifndef SDPA_TESTS_REFERENCE_H
#define SDPA_TESTS_REFERENCE_H

#include <stddef.h>

double ref_dot(const float *a, const float *b, size_t n);
double ref_dot_abs(const float *a, const float *b, size_t n); /* sum |a_i b_i| */
/* softmax of z_i = (float)(scale * x_i), with the special-value rules of sdpa.h */
void ref_softmax(double *y, const float *x, size_t n, float scale);

#endif
