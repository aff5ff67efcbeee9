/* Hardware limits measured at start-up, so each row can say how close it came: the core clock
 * (a chain of dependent integer adds, one per cycle on every x86-64 core) and the L1 load
 * bandwidth of the widest vector this CPU runs (independent adds fed from a 16 KiB buffer). */
#include <stddef.h>
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
    const uint64_t iters = 20u * 1000 * 1000;
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
    const int reps = 5000;
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
    const int reps = 5000;
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

/* Reads a and b once with independent vector adds: what a dot of the same inputs would cost if
 * its only work were the loads. */
__attribute__((target("avx512f"))) static float load_sum_avx512(const float *a, const float *b,
                                                                size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_add_ps(s0, _mm512_loadu_ps(a + i));
        s1 = _mm512_add_ps(s1, _mm512_loadu_ps(b + i));
        s2 = _mm512_add_ps(s2, _mm512_loadu_ps(a + i + 16));
        s3 = _mm512_add_ps(s3, _mm512_loadu_ps(b + i + 16));
        s4 = _mm512_add_ps(s4, _mm512_loadu_ps(a + i + 32));
        s5 = _mm512_add_ps(s5, _mm512_loadu_ps(b + i + 32));
        s6 = _mm512_add_ps(s6, _mm512_loadu_ps(a + i + 48));
        s7 = _mm512_add_ps(s7, _mm512_loadu_ps(b + i + 48));
    }
    float rest = 0;
    for (; i < n; i++) rest += a[i] + b[i];
    s0 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)),
                       _mm512_add_ps(_mm512_add_ps(s4, s5), _mm512_add_ps(s6, s7)));
    return _mm512_reduce_add_ps(s0) + rest;
}

__attribute__((target("avx2"))) static float load_sum_avx2(const float *a, const float *b,
                                                           size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(a + i));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(b + i));
        s2 = _mm256_add_ps(s2, _mm256_loadu_ps(a + i + 8));
        s3 = _mm256_add_ps(s3, _mm256_loadu_ps(b + i + 8));
        s4 = _mm256_add_ps(s4, _mm256_loadu_ps(a + i + 16));
        s5 = _mm256_add_ps(s5, _mm256_loadu_ps(b + i + 16));
        s6 = _mm256_add_ps(s6, _mm256_loadu_ps(a + i + 24));
        s7 = _mm256_add_ps(s7, _mm256_loadu_ps(b + i + 24));
    }
    float rest = 0;
    for (; i < n; i++) rest += a[i] + b[i];
    s0 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)),
                       _mm256_add_ps(_mm256_add_ps(s4, s5), _mm256_add_ps(s6, s7)));
    float out[8];
    _mm256_storeu_ps(out, s0);
    return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7] + rest;
}

float roof_load_sum(const float *a, const float *b, size_t n) {
    if (__builtin_cpu_supports("avx512f")) return load_sum_avx512(a, b, n);
    if (__builtin_cpu_supports("avx2")) return load_sum_avx2(a, b, n);
    float s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] + b[i];
    return s;
}

roofline roofline_measure(void) {
    roofline r = {0};
    double best = 0;
    for (int i = 0; i < 5; i++) {
        double g = clock_ghz_once();
        if (g > best) best = g;
    }
    r.clock_ghz = best;
    static float buf[L1_FLOATS] __attribute__((aligned(64)));
    for (int i = 0; i < L1_FLOATS; i++) buf[i] = (float)i;
    __builtin_cpu_init();
    /* the best of several short runs: a limit is what the core reaches when nothing disturbs it */
    for (int i = 0; i < 7; i++) {
        double bw = 0;
        if (__builtin_cpu_supports("avx512f")) {
            r.l1_isa = "avx512";
            bw = l1_bytes_per_ns_avx512(buf);
        } else if (__builtin_cpu_supports("avx2")) {
            r.l1_isa = "avx2";
            bw = l1_bytes_per_ns_avx2(buf);
        }
        if (bw > r.l1_bytes_per_ns) r.l1_bytes_per_ns = bw;
    }
    return r;
}
#else
float roof_load_sum(const float *a, const float *b, size_t n) {
    float s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] + b[i];
    return s;
}

roofline roofline_measure(void) {
    roofline r = {0};
    (void)cpu_ns;
    return r;
}
#endif
