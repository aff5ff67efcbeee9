/* Hardware limits measured at start-up (roofline.h): the core clock, the FMA peak of one ISA
 * (independent FMA chains held in registers, enough of them to cover latency times pipes) and the
 * read bandwidth of L1, L2, L3 and DRAM (independent vector adds fed from working sets of
 * 16 KiB, 512 KiB, 8 MiB and 256 MiB), and DRAM's read in random 256-byte rows. Each figure is the
 * best of several short runs: a limit is what the core reaches when nothing disturbs it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "rng.h"
#include "roofline.h"

const char *const ROOF_LEVEL_NAMES[ROOF_LEVELS] = {"L1", "L2", "L3", "DRAM"};

static const size_t PROBE_BYTES[ROOF_LEVELS] = {16u << 10, 512u << 10, 8u << 20, 256u << 20};
/* bytes read per timed trial, and trials per level: about 5-20 ms each */
static const double TRIAL_BYTES[ROOF_LEVELS] = {1e9, 5e8, 5e8, 256.0 * (1 << 20)};
static const int TRIALS[ROOF_LEVELS] = {15, 11, 5, 3};

#define CHAINS 12 /* FMA latency (4 cycles on Zen 4/5) times pipes (2), with room */

static double cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static volatile float sink;

/* Portable fallbacks: the scalar backend's peak (mul + add, as its kernels do) and a read loop. */
static double flops_per_ns_scalar(size_t iters) {
    float acc[CHAINS];
    for (int k = 0; k < CHAINS; k++) acc[k] = (float)k;
    double t0 = cpu_ns();
    for (size_t i = 0; i < iters; i++)
        for (int k = 0; k < CHAINS; k++) acc[k] = acc[k] * 0.999999f + 1e-7f;
    double t = cpu_ns() - t0;
    float s = 0;
    for (int k = 0; k < CHAINS; k++) s += acc[k];
    sink = s;
    return (double)iters * CHAINS * 2 / t;
}

/* The read probes sum p[0..n) reps times into independent accumulators that stay in registers
 * across the repetitions, so a small working set pays no per-pass reduction. */
static float read_sum_scalar(const float *p, size_t n, size_t reps) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t r = 0; r < reps; r++)
        for (size_t i = 0; i + 4 <= n; i += 4)
            s0 += p[i], s1 += p[i + 1], s2 += p[i + 2], s3 += p[i + 3];
    return s0 + s1 + s2 + s3;
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

__attribute__((target("avx512f"))) static double flops_per_ns_avx512(size_t iters) {
    __m512 acc[CHAINS];
    for (int k = 0; k < CHAINS; k++) acc[k] = _mm512_set1_ps((float)k);
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    double t0 = cpu_ns();
    for (size_t i = 0; i < iters; i++)
        for (int k = 0; k < CHAINS; k++) acc[k] = _mm512_fmadd_ps(acc[k], m, c);
    double t = cpu_ns() - t0;
    for (int k = 1; k < CHAINS; k++) acc[0] = _mm512_add_ps(acc[0], acc[k]);
    sink = _mm512_reduce_add_ps(acc[0]);
    return (double)iters * CHAINS * 16 * 2 / t;
}

__attribute__((target("avx2,fma"))) static double flops_per_ns_avx2(size_t iters) {
    __m256 acc[CHAINS];
    for (int k = 0; k < CHAINS; k++) acc[k] = _mm256_set1_ps((float)k);
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    double t0 = cpu_ns();
    for (size_t i = 0; i < iters; i++)
        for (int k = 0; k < CHAINS; k++) acc[k] = _mm256_fmadd_ps(acc[k], m, c);
    double t = cpu_ns() - t0;
    for (int k = 1; k < CHAINS; k++) acc[0] = _mm256_add_ps(acc[0], acc[k]);
    float out[8];
    _mm256_storeu_ps(out, acc[0]);
    sink = out[0];
    return (double)iters * CHAINS * 8 * 2 / t;
}

/* SSE4.1 has no FMA: a multiply and an add per lane, the peak of the "sse" backend's kernels. */
__attribute__((target("sse4.1"))) static double flops_per_ns_sse(size_t iters) {
    __m128 acc[CHAINS];
    for (int k = 0; k < CHAINS; k++) acc[k] = _mm_set1_ps((float)k);
    const __m128 m = _mm_set1_ps(0.999999f), c = _mm_set1_ps(1e-7f);
    double t0 = cpu_ns();
    for (size_t i = 0; i < iters; i++)
        for (int k = 0; k < CHAINS; k++) acc[k] = _mm_add_ps(_mm_mul_ps(acc[k], m), c);
    double t = cpu_ns() - t0;
    for (int k = 1; k < CHAINS; k++) acc[0] = _mm_add_ps(acc[0], acc[k]);
    sink = _mm_cvtss_f32(acc[0]);
    return (double)iters * CHAINS * 4 * 2 / t;
}

__attribute__((target("avx512f"))) static float read_sum_avx512(const float *p, size_t n,
                                                                size_t reps) {
    __m512 s[8];
    for (int k = 0; k < 8; k++) s[k] = _mm512_setzero_ps();
    for (size_t r = 0; r < reps; r++)
        for (size_t i = 0; i + 128 <= n; i += 128)
            for (int k = 0; k < 8; k++) s[k] = _mm512_add_ps(s[k], _mm512_load_ps(p + i + 16 * k));
    for (int k = 1; k < 8; k++) s[0] = _mm512_add_ps(s[0], s[k]);
    return _mm512_reduce_add_ps(s[0]);
}

__attribute__((target("avx2"))) static float read_sum_avx2(const float *p, size_t n, size_t reps) {
    __m256 s[8];
    for (int k = 0; k < 8; k++) s[k] = _mm256_setzero_ps();
    for (size_t r = 0; r < reps; r++)
        for (size_t i = 0; i + 64 <= n; i += 64)
            for (int k = 0; k < 8; k++) s[k] = _mm256_add_ps(s[k], _mm256_load_ps(p + i + 8 * k));
    for (int k = 1; k < 8; k++) s[0] = _mm256_add_ps(s[0], s[k]);
    float out[8];
    _mm256_storeu_ps(out, s[0]);
    return out[0] + out[7];
}

static float read_sum(const float *p, size_t n, size_t reps, const char **isa) {
    if (__builtin_cpu_supports("avx512f")) return *isa = "avx512", read_sum_avx512(p, n, reps);
    if (__builtin_cpu_supports("avx2")) return *isa = "avx2", read_sum_avx2(p, n, reps);
    return *isa = "scalar", read_sum_scalar(p, n, reps);
}

static double flops_per_ns(const char *isa, size_t iters, const char **used) {
    if (strcmp(isa, "avx512") == 0 && __builtin_cpu_supports("avx512f"))
        return *used = "avx512", flops_per_ns_avx512(iters);
    if (strcmp(isa, "avx2") == 0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return *used = "avx2", flops_per_ns_avx2(iters);
    if (strcmp(isa, "sse") == 0 && __builtin_cpu_supports("sse4.1"))
        return *used = "sse", flops_per_ns_sse(iters);
    return *used = "scalar", flops_per_ns_scalar(iters);
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

#elif defined(__aarch64__)
#include <arm_neon.h>

static double clock_ghz_once(void) { return 0; }

static double flops_per_ns_neon(size_t iters) {
    float32x4_t acc[CHAINS];
    for (int k = 0; k < CHAINS; k++) acc[k] = vdupq_n_f32((float)k);
    const float32x4_t m = vdupq_n_f32(0.999999f), c = vdupq_n_f32(1e-7f);
    double t0 = cpu_ns();
    for (size_t i = 0; i < iters; i++)
        for (int k = 0; k < CHAINS; k++) acc[k] = vfmaq_f32(c, acc[k], m);
    double t = cpu_ns() - t0;
    for (int k = 1; k < CHAINS; k++) acc[0] = vaddq_f32(acc[0], acc[k]);
    sink = vaddvq_f32(acc[0]);
    return (double)iters * CHAINS * 4 * 2 / t;
}

static float read_sum(const float *p, size_t n, size_t reps, const char **isa) {
    float32x4_t s[8];
    for (int k = 0; k < 8; k++) s[k] = vdupq_n_f32(0);
    for (size_t r = 0; r < reps; r++)
        for (size_t i = 0; i + 32 <= n; i += 32)
            for (int k = 0; k < 8; k++) s[k] = vaddq_f32(s[k], vld1q_f32(p + i + 4 * k));
    for (int k = 1; k < 8; k++) s[0] = vaddq_f32(s[0], s[k]);
    *isa = "neon";
    (void)read_sum_scalar;
    return vaddvq_f32(s[0]);
}

static double flops_per_ns(const char *isa, size_t iters, const char **used) {
    if (strcmp(isa, "neon") == 0) return *used = "neon", flops_per_ns_neon(iters);
    return *used = "scalar", flops_per_ns_scalar(iters);
}

float roof_load_sum(const float *a, const float *b, size_t n) {
    float s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] + b[i];
    return s;
}

#else
static double clock_ghz_once(void) { return 0; }

static float read_sum(const float *p, size_t n, size_t reps, const char **isa) {
    *isa = "scalar";
    return read_sum_scalar(p, n, reps);
}

static double flops_per_ns(const char *isa, size_t iters, const char **used) {
    (void)isa;
    *used = "scalar";
    return flops_per_ns_scalar(iters);
}

float roof_load_sum(const float *a, const float *b, size_t n) {
    float s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] + b[i];
    return s;
}
#endif

#define ROW_BYTES  256 /* a token table's key: 128 halves */
#define ROWS_AHEAD 32

/* Bytes per ns of reading `rows` rows of pool in the random order `order`, each copied into a
 * tile, every line prefetched ROWS_AHEAD rows ahead into L1 (l2: into L2 alone). */
static double random_rows_once(const char *pool, const int32_t *order, size_t rows, int l2) {
    static char tile[64 * ROW_BYTES];
    const double t0 = cpu_ns();
    for (size_t i = 0; i < rows; i++) {
        const char *ahead = pool + (size_t)order[(i + ROWS_AHEAD) % rows] * ROW_BYTES;
        for (size_t b = 0; b < ROW_BYTES; b += 64) {
            if (l2)
                __builtin_prefetch(ahead + b, 0, 2);
            else
                __builtin_prefetch(ahead + b);
        }
        memcpy(tile + i % 64 * ROW_BYTES, pool + (size_t)order[i] * ROW_BYTES, ROW_BYTES);
    }
    const double bw = (double)rows * ROW_BYTES / (cpu_ns() - t0);
    sink += tile[rows % sizeof tile];
    return bw;
}

/* The best of three runs each way over a random order of the pool's rows. */
static double random_rows(const char *pool, size_t bytes) {
    const size_t rows = bytes / ROW_BYTES;
    int32_t *order = malloc(rows * sizeof *order);
    if (!order) return 0;
    rng_permutation(order, rows, POOL_SEED);
    double best = 0;
    for (int t = 0; t < 6; t++) {
        const double bw = random_rows_once(pool, order, rows, t & 1);
        if (bw > best) best = bw;
    }
    free(order);
    return best;
}

/* Cache capacities from sysconf. Virtual machines often report the host's whole L3 (hundreds of
 * MiB) to every guest core: a value above 128 MiB is taken as that and replaced by 32 MiB, one
 * Zen 4/5 CCD's L3, the share a single thread can actually use. */
static void level_sizes(roofline *r) {
    long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE),
         l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    r->level_source = "sysconf";
    if (l1 <= 0) l1 = 32 << 10, r->level_source = "defaults (sysconf gave none)";
    if (l2 <= 0) l2 = 1 << 20, r->level_source = "defaults (sysconf gave none)";
    if (l3 <= 0) l3 = 32 << 20, r->level_source = "defaults (sysconf gave none)";
    if (l3 > (128l << 20))
        l3 = 32 << 20, r->level_source = "sysconf; its L3 (> 128 MiB, a VM's host total) as 32 MiB";
    r->level_bytes[ROOF_L1] = (size_t)l1;
    r->level_bytes[ROOF_L2] = (size_t)l2;
    r->level_bytes[ROOF_L3] = (size_t)l3;
    r->level_bytes[ROOF_DRAM] = SIZE_MAX;
}

enum roof_level roofline_level(const roofline *r, size_t working_set) {
    for (int l = 0; l < ROOF_DRAM; l++)
        if (working_set <= r->level_bytes[l]) return (enum roof_level)l;
    return ROOF_DRAM;
}

roofline roofline_measure(const char *isa) {
    roofline r = {0};
    level_sizes(&r);
#if defined(__x86_64__)
    __builtin_cpu_init();
#endif
    for (int i = 0; i < 5; i++) {
        double g = clock_ghz_once();
        if (g > r.clock_ghz) r.clock_ghz = g;
    }
    for (int i = 0; i < 7; i++) {
        double g = flops_per_ns(isa, 2u * 1000 * 1000, &r.fma_isa);
        if (g > r.fma_gflops) r.fma_gflops = g;
    }
    float *buf = xalloc_bytes(PROBE_BYTES[ROOF_DRAM], 64); /* --huge-pages applies */
    size_t floats = PROBE_BYTES[ROOF_DRAM] / sizeof(float);
    for (size_t i = 0; i < floats; i++) buf[i] = (float)(i & 1023);
    float s = 0;
    for (int l = 0; l < ROOF_LEVELS; l++) {
        size_t n = PROBE_BYTES[l] / sizeof(float);
        size_t reps = (size_t)(TRIAL_BYTES[l] / (double)PROBE_BYTES[l]);
        if (reps < 1) reps = 1;
        r.probe_bytes[l] = PROBE_BYTES[l];
        s += read_sum(buf, n, 1, &r.read_isa); /* brings the working set into its level */
        for (int t = 0; t < TRIALS[l]; t++) {
            double t0 = cpu_ns();
            s += read_sum(buf, n, reps, &r.read_isa);
            double bw = (double)reps * (double)PROBE_BYTES[l] / (cpu_ns() - t0);
            if (bw > r.read_gbytes_per_s[l]) r.read_gbytes_per_s[l] = bw;
        }
    }
    sink = s;
    r.rows_gbytes_per_s = random_rows((const char *)buf, PROBE_BYTES[ROOF_DRAM]);
    free(buf);
    return r;
}
