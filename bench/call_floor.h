/* bench_call_floor (call_floor.c, a shared library of its own): does nothing, to time a call. */
#ifndef SDPA_BENCH_CALL_FLOOR_H
#define SDPA_BENCH_CALL_FLOOR_H
#include <stddef.h>
float bench_call_floor(const float *a, const float *b, size_t n);
#endif
