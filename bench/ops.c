/* The one-dimensional ops of the benchmark (dot, scale, softmax, scores) and the table of all. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench.h"
#include "call_floor.h"
#include "peers.h"
#include "rng.h"
#include "roofline.h"
#include "sdpa.h"

const char *const KIND_NAMES[] = {"sdpa", "openblas", "onednn", "naive", "roof",
                                  "call", "f32",      "dense",  "old",   "-"};

/* --huge-pages: arrays of 2 MiB and more in 2 MiB pages where the kernel gives them */
#define HUGE_PAGE ((size_t)2 << 20)
static int huge_pages;
void bench_huge_pages(void) { huge_pages = 1; }
int bench_uses_huge_pages(void) { return huge_pages; }

void *xalloc_bytes(size_t bytes, size_t align) {
    void *p = NULL;
    const int huge = huge_pages && bytes >= HUGE_PAGE;
    if (huge && align < HUGE_PAGE) align = HUGE_PAGE;
    if (posix_memalign(&p, align, bytes ? bytes : 64)) {
        fprintf(stderr, "bench: out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    if (huge) madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

void *xalloc(size_t n_floats) {
    return xalloc_bytes((n_floats * sizeof(float) + 63) / 64 * 64, 64);
}

static uint64_t rng_state = RNG_SEED;
void fill(float *p, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) p[i] = rng_uniform(&rng_state, lo, hi);
}

void use_scalar(void) {
    if (sdpa_set_backend("scalar") != SDPA_OK) {
        fprintf(stderr, "bench: the scalar backend is missing\n");
        exit(2);
    }
}

/* Errors of independent roundings grow like a random walk: the documented bounds hold up to
 * `documented` elements; beyond, they are scaled by sqrt(n / documented). */
double growth(size_t n, size_t documented) {
    return n > documented ? sqrt((double)n / (double)documented) : 1.0;
}

/* ---- dot: sum a[i] * b[i] ---- */

static void dot_prepare(job *j) {
    j->a = xalloc(j->n), j->b = xalloc(j->n);
    fill(j->a, j->n, -1, 1), fill(j->b, j->n, -1, 1);
    double s = 0;
    for (size_t i = 0; i < j->n; i++) s += fabs((double)j->a[i] * j->b[i]);
    j->abs_sum = (float)s;
    use_scalar();
    sdpa_dot_f32(j->a, j->b, j->n, &j->ref_dot);
}

/* Each call's result goes to its own slot of a small ring, summed once at the end: the calls are
 * independent, as the other ops' are. An accumulator (acc += r) would chain them instead: it
 * lives in memory across the call (no float register survives one), and its store, reload and
 * add take about 12 cycles a call, as long as a whole 16-float dot, and would set one floor under
 * every row, an empty function's too. */
#define DOT_RING 16
static void dot_run(enum kind kind, job *j, size_t iters) {
    float ring[DOT_RING] = {0};
    switch (kind) {
    case KIND_SDPA:
    case KIND_OLD:
        for (size_t i = 0; i < iters; i++)
            bench_api(kind)->dot_f32(j->a, j->b, j->n, &ring[i % DOT_RING]);
        break;
    case KIND_OPENBLAS:
        for (size_t i = 0; i < iters; i++)
            ring[i % DOT_RING] = peer_openblas_sdot(j->a, j->b, j->n);
        break;
    case KIND_NAIVE:
        for (size_t i = 0; i < iters; i++) ring[i % DOT_RING] = naive_dot(j->a, j->b, j->n);
        break;
    case KIND_ROOF:
        for (size_t i = 0; i < iters; i++) ring[i % DOT_RING] = roof_load_sum(j->a, j->b, j->n);
        break;
    case KIND_CALL:
        for (size_t i = 0; i < iters; i++) ring[i % DOT_RING] = bench_call_floor(j->a, j->b, j->n);
        break;
    default: break;
    }
    /* the last call's result is checked; the loads and the empty call compute no dot */
    j->result = kind == KIND_ROOF || kind == KIND_CALL ? j->ref_dot : ring[(iters - 1) % DOT_RING];
    float acc = 0.0f;
    for (size_t i = 0; i < DOT_RING; i++) acc += ring[i];
    j->sink += acc;
}

/* Twice the documented bound (1e-5 * sum |a_i b_i| up to n = 4096): two results, each within it. */
static int dot_verify(const job *j, int exp_index) {
    (void)exp_index;
    return fabs((double)j->result - j->ref_dot) <= 2 * 1e-5 * j->abs_sum * growth(j->n, 4096);
}

/* One FMA per element; two floats read. */
static void dot_cost(const job *j, double *flops, double *bytes, double *working_set) {
    *flops = 2.0 * (double)j->n;
    *bytes = *working_set = 8.0 * (double)j->n;
}

/* ---- scale: y[i] = alpha * x[i] ---- */

static void scale_prepare(job *j) {
    j->x = xalloc(j->n), j->y = xalloc(j->n), j->ref = xalloc(j->n);
    fill(j->x, j->n, -8, 8);
    j->scale = 0.125f;
    use_scalar();
    sdpa_scale_f32(j->ref, j->x, j->n, j->scale);
}

static void scale_run(enum kind kind, job *j, size_t iters) {
    if (kind == KIND_SDPA || kind == KIND_OLD)
        for (size_t i = 0; i < iters; i++) bench_api(kind)->scale_f32(j->y, j->x, j->n, j->scale);
    else if (kind == KIND_NAIVE)
        for (size_t i = 0; i < iters; i++) naive_scale(j->y, j->x, j->n, j->scale);
    j->sink += j->y[0];
}

/* Documented bit-exact: one IEEE multiply per element everywhere. */
static int scale_verify(const job *j, int exp_index) {
    (void)exp_index;
    return memcmp(j->y, j->ref, j->n * sizeof(float)) == 0;
}

/* One float read and one written per element; a multiply is never the limit. */
static void scale_cost(const job *j, double *flops, double *bytes, double *working_set) {
    *flops = 0;
    *bytes = *working_set = 8.0 * (double)j->n;
}

/* ---- to_f16, from_f16: sdpa_convert between float and f16 ----
 * Its peer, "naive" in the table, is memcpy of the same output from a ready copy (2 n bytes to
 * f16, 4 n from it): the conversion against putting its result in place. */

/* x: floats; a: the same values as f16 (from_f16's input); ref: the scalar backend's output */
static void convert_prepare(job *j, sdpa_dtype to) {
    j->x = xalloc(j->n), j->a = xalloc(j->n), j->y = xalloc(j->n), j->ref = xalloc(j->n);
    fill(j->x, j->n, -8, 8);
    use_scalar();
    sdpa_convert(j->a, SDPA_F16, j->x, SDPA_F32, j->n);
    if (to == SDPA_F16)
        memcpy(j->ref, j->a, j->n * sizeof(uint16_t));
    else
        sdpa_convert(j->ref, SDPA_F32, j->a, SDPA_F16, j->n);
}
static void to_f16_prepare(job *j) { convert_prepare(j, SDPA_F16); }
static void from_f16_prepare(job *j) { convert_prepare(j, SDPA_F32); }

static void convert_copy(job *j, size_t iters, size_t bytes) {
    for (size_t i = 0; i < iters; i++) memcpy(j->y, j->ref, bytes);
}

static void to_f16_run(enum kind kind, job *j, size_t iters) {
    if (kind == KIND_SDPA || kind == KIND_OLD)
        for (size_t i = 0; i < iters; i++)
            bench_api(kind)->convert(j->y, SDPA_F16, j->x, SDPA_F32, j->n);
    else if (kind == KIND_NAIVE)
        convert_copy(j, iters, j->n * sizeof(uint16_t));
    j->sink += j->y[0];
}

static void from_f16_run(enum kind kind, job *j, size_t iters) {
    if (kind == KIND_SDPA || kind == KIND_OLD)
        for (size_t i = 0; i < iters; i++)
            bench_api(kind)->convert(j->y, SDPA_F32, j->a, SDPA_F16, j->n);
    else if (kind == KIND_NAIVE)
        convert_copy(j, iters, j->n * sizeof(float));
    j->sink += j->y[0];
}

/* Conversions are exact or rounded to nearest even: bit for bit the scalar backend's */
static int to_f16_verify(const job *j, int exp_index) {
    (void)exp_index;
    return memcmp(j->y, j->ref, j->n * sizeof(uint16_t)) == 0;
}
static int from_f16_verify(const job *j, int exp_index) {
    (void)exp_index;
    return memcmp(j->y, j->ref, j->n * sizeof(float)) == 0;
}

/* 4 bytes read and 2 written per element, or the reverse */
static void convert_cost(const job *j, double *flops, double *bytes, double *working_set) {
    *flops = 0;
    *bytes = *working_set = 6.0 * (double)j->n;
}

/* ---- softmax: y = softmax(scale * x), in both exp modes ---- */

const char *const EXPS[] = {"fast", "sleef"};

static void softmax_prepare(job *j) {
    j->x = xalloc(j->n), j->y = xalloc(j->n), j->ref = xalloc(2 * j->n);
    fill(j->x, j->n, -8, 8);
    j->scale = 1.0f;
    use_scalar();
    for (int e = 0; e < 2; e++) {
        sdpa_set_exp_mode(EXPS[e]);
        sdpa_softmax_f32(j->ref + (size_t)e * j->n, j->x, j->n, j->scale);
    }
}

static void softmax_run(enum kind kind, job *j, size_t iters) {
    switch (kind) {
    case KIND_SDPA:
    case KIND_OLD:
        for (size_t i = 0; i < iters; i++) bench_api(kind)->softmax_f32(j->y, j->x, j->n, j->scale);
        break;
    case KIND_DNNL:
        for (size_t i = 0; i < iters; i++) peer_dnnl_softmax_run(j->dnnl);
        break;
    case KIND_NAIVE:
        for (size_t i = 0; i < iters; i++) naive_softmax(j->y, j->x, j->n, j->scale);
        break;
    default: break;
    }
    j->sink += j->y[0];
}

/* Relative error per element within twice the documented bound (2e-5 up to n = 4096, 1e-4 up
 * to 2^20, grown like sqrt beyond), absolute 2 * FLT_MIN where the reference is that small. */
static int softmax_verify(const job *j, int exp_index) {
    const float *ref = j->ref + (size_t)exp_index * j->n;
    double tol = 2 * (j->n <= 4096 ? 2e-5 : 1e-4) * growth(j->n, 1u << 20);
    for (size_t i = 0; i < j->n; i++) {
        double d = fabs((double)j->y[i] - ref[i]);
        if (ref[i] >= 2 * FLT_MIN ? d > tol * ref[i] : d > 2 * FLT_MIN) return 0;
    }
    return 1;
}

/* Softmax is bound by its exp pass, not by a flop count: per vector, the fast exp of exp_sum
 * needs seven operations of the FMA/multiply pipes on avx512 and avx2 (the FMA that rounds
 * x K / ln2, two for the Cody-Waite reduction, three for the cubic, the multiply by the table
 * entry; the bench's scale 1 skips z = scale * x) and normalize one more. Counting each as an
 * FMA's two flops per lane gives 16 flop-equivalents per element, the limit against the FMA peak
 * (docs/performance.md, "What bounds softmax"). One float is read and one written per element
 * (the extra passes over y are its own cost, not traffic). */
static void softmax_cost(const job *j, double *flops, double *bytes, double *working_set) {
    *flops = 16.0 * (double)j->n;
    *bytes = *working_set = 8.0 * (double)j->n;
}

/* ---- scores: s[j] = scale * dot(q, K row j), one query against n keys of d floats ---- */

static void scores_prepare(job *j) {
    size_t n = j->n, d = j->d;
    j->a = xalloc(d), j->b = xalloc(n * d), j->y = xalloc(n), j->ref = xalloc(n);
    j->bound = xalloc(n);
    fill(j->a, d, -1, 1), fill(j->b, n * d, -1, 1);
    j->scale = (float)(1.0 / sqrt((double)d));
    for (size_t k = 0; k < n; k++) {
        double s = 0;
        for (size_t i = 0; i < d; i++) s += fabs((double)j->a[i] * j->b[k * d + i]);
        /* twice the documented dot bound, scaled, plus the rounding of the final multiply */
        j->bound[k] = (float)(2 * 1e-5 * j->scale * s * growth(d, 4096));
    }
    use_scalar();
    sdpa_scores_f32(j->ref, j->a, j->b, n, d, d, j->scale);
}

static void scores_run(enum kind kind, job *j, size_t iters) {
    switch (kind) {
    case KIND_SDPA:
    case KIND_OLD:
        for (size_t i = 0; i < iters; i++)
            bench_api(kind)->scores_f32(j->y, j->a, j->b, j->n, j->d, j->d, j->scale);
        break;
    case KIND_OPENBLAS:
        for (size_t i = 0; i < iters; i++)
            peer_openblas_scores(j->y, j->a, j->b, j->n, j->d, j->d, j->scale);
        break;
    case KIND_NAIVE:
        for (size_t i = 0; i < iters; i++)
            naive_scores(j->y, j->a, j->b, j->n, j->d, j->d, j->scale);
        break;
    default: break;
    }
    j->sink += j->y[0];
}

static int scores_verify(const job *j, int exp_index) {
    (void)exp_index;
    for (size_t k = 0; k < j->n; k++)
        if (!(fabs((double)j->y[k] - j->ref[k]) <= j->bound[k] + 1e-7 * fabs((double)j->ref[k])))
            return 0;
    return 1;
}

/* One FMA per element of K, plus the scaling; K, q and the scores are the traffic. */
static void scores_cost(const job *j, double *flops, double *bytes, double *working_set) {
    double n = (double)j->n, d = (double)j->d;
    *flops = 2 * n * d + n;
    *bytes = *working_set = 4 * (n * d + d + n);
}

/* ---- the ops ----
 * Sizes: powers of 4 from 16 to 2^24 floats (64 MiB per array), so each op walks from L1 through
 * L2 and L3 to DRAM; softmax adds 128 (a short row, whose calls and chain cost as much as its
 * work); scores walks 16 to 2^18 keys (K is 128 MiB at 2^18 x 128). */
const op_def DOT_OP = {
    .name = "dot",
    .sizes = {16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1u << 20, 1u << 22, 1u << 24},
    .smoke_sizes = {16, 129},
    .peers = {KIND_OPENBLAS, KIND_NAIVE},
    .exp_modes = 1,
    .plot_unit = "GFLOP/s",
    .prepare = dot_prepare,
    .run = dot_run,
    .verify = dot_verify,
    .cost = dot_cost,
    .against = against_loaded,
};
static const op_def SCALE_OP = {
    .name = "scale",
    .sizes = {16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1u << 20, 1u << 22, 1u << 24},
    .smoke_sizes = {16, 129},
    .peers = {KIND_NAIVE, KIND_NONE},
    .exp_modes = 1,
    .plot_unit = "GB/s",
    .prepare = scale_prepare,
    .run = scale_run,
    .verify = scale_verify,
    .cost = scale_cost,
    .against = against_loaded,
};
static const op_def SOFTMAX_OP = {
    .name = "softmax",
    .sizes = {16, 64, 128, 256, 1024, 4096, 16384, 65536, 262144, 1u << 20, 1u << 22, 1u << 24},
    .smoke_sizes = {129},
    .peers = {KIND_DNNL, KIND_NAIVE},
    .exp_modes = 2,
    .plot_unit = "GB/s",
    .prepare = softmax_prepare,
    .run = softmax_run,
    .verify = softmax_verify,
    .cost = softmax_cost,
    .against = against_loaded,
};
static const op_def SCORES_OP = {
    .name = "scores",
    .sizes = {16, 64, 256, 1024, 4096, 16384, 65536, 262144},
    .smoke_sizes = {5, 33},
    .dims = {64, 128},
    .peers = {KIND_OPENBLAS, KIND_NAIVE},
    .exp_modes = 1,
    .plot_unit = "GFLOP/s",
    .prepare = scores_prepare,
    .run = scores_run,
    .verify = scores_verify,
    .cost = scores_cost,
    .against = against_loaded,
};

static const op_def TO_F16_OP = {
    .name = "to_f16",
    .sizes = {4096, 65536, 1u << 20, 1u << 24},
    .smoke_sizes = {16, 129},
    .peers = {KIND_NAIVE, KIND_NONE},
    .exp_modes = 1,
    .plot_unit = "GB/s",
    .prepare = to_f16_prepare,
    .run = to_f16_run,
    .verify = to_f16_verify,
    .cost = convert_cost,
    .against = against_loaded,
};
static const op_def FROM_F16_OP = {
    .name = "from_f16",
    .sizes = {4096, 65536, 1u << 20, 1u << 24},
    .smoke_sizes = {16, 129},
    .peers = {KIND_NAIVE, KIND_NONE},
    .exp_modes = 1,
    .plot_unit = "GB/s",
    .prepare = from_f16_prepare,
    .run = from_f16_run,
    .verify = from_f16_verify,
    .cost = convert_cost,
    .against = against_loaded,
};

const op_def *const OPS[] = {&DOT_OP,      &SCALE_OP,    &SOFTMAX_OP,   &SCORES_OP,  &TO_F16_OP,
                             &FROM_F16_OP, &KV_STORE_OP, &ATTENTION_OP, &BACKWARD_OP};
const size_t N_OPS = sizeof OPS / sizeof OPS[0];
