/* Hardware limits measured at start-up, so each row can say how close it came: the core clock
 * (a chain of dependent integer adds, one per cycle on every x86-64 core) and the L1 load
 * bandwidth of the widest vector this CPU runs (independent adds fed from a 16 KiB buffer). */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "roofline.h"

static double cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

#if defined(__x86_64__)
#include <immintrin.h>

static double clock_ghz_once(void) {
    const uint64_t iters = 50u * 1000 * 1000;
    double t0 = cpu_ns();
    uint64_t x = iters;
    /* four dependent decrements per iteration: four cycles, the fused cmp/branch is free */
    __asm__ volatile("1:\n\tdec %0\n\tdec %0\n\tdec %0\n\tdec %0\n\tjnz 1b" : "+r"(x));
    return (double)iters / (cpu_ns() - t0);
}

#define L1_FLOATS 4096

__attribute__((target("avx512f"))) static double l1_bytes_per_ns_avx512(const float *buf) {
    __m512 a[8];
    for (int k = 0; k < 8; k++) a[k] = _mm512_setzero_ps();
    const int reps = 20000;
    double t0 = cpu_ns();
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < L1_FLOATS; i += 8 * 16)
            for (int k = 0; k < 8; k++)
                a[k] = _mm512_add_ps(a[k], _mm512_loadu_ps(buf + i + 16 * k));
    double t = cpu_ns() - t0;
    for (int k = 1; k < 8; k++) a[0] = _mm512_add_ps(a[0], a[k]);
    volatile float sink = _mm512_reduce_add_ps(a[0]);
    (void)sink;
    return (double)reps * L1_FLOATS * 4 / t;
}

__attribute__((target("avx2"))) static double l1_bytes_per_ns_avx2(const float *buf) {
    __m256 a[8];
    for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_ps();
    const int reps = 20000;
    double t0 = cpu_ns();
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < L1_FLOATS; i += 8 * 8)
            for (int k = 0; k < 8; k++)
                a[k] = _mm256_add_ps(a[k], _mm256_loadu_ps(buf + i + 8 * k));
    double t = cpu_ns() - t0;
    for (int k = 1; k < 8; k++) a[0] = _mm256_add_ps(a[0], a[k]);
    float out[8];
    _mm256_storeu_ps(out, a[0]);
    volatile float sink = out[0];
    (void)sink;
    return (double)reps * L1_FLOATS * 4 / t;
}

roofline roofline_measure(void) {
    roofline r = {0};
    double best = 0;
    for (int i = 0; i < 3; i++) {
        double g = clock_ghz_once();
        if (g > best) best = g;
    }
    r.clock_ghz = best;
    static float buf[L1_FLOATS] __attribute__((aligned(64)));
    for (int i = 0; i < L1_FLOATS; i++) buf[i] = (float)i;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        r.l1_isa = "avx512";
        r.l1_bytes_per_ns = l1_bytes_per_ns_avx512(buf);
    } else if (__builtin_cpu_supports("avx2")) {
        r.l1_isa = "avx2";
        r.l1_bytes_per_ns = l1_bytes_per_ns_avx2(buf);
    }
    return r;
}
#else
roofline roofline_measure(void) {
    roofline r = {0};
    (void)cpu_ns;
    return r;
}
#endif
