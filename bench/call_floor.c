/* A function that does nothing, in a shared library of its own: what any call into a shared
 * library costs (the PLT's indirect jump and the return), measured beside sdpa's short dots,
 * which pay it before their work. It is most of a 16-float dot (bench.c's "empty call" row;
 * docs/performance.md has the figures). */
#include "call_floor.h"

float bench_call_floor(const float *a, const float *b, size_t n) {
    (void)a, (void)b, (void)n;
    return 0.0f;
}
