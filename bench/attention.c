/* Attention benchmark: single thread, median of repeated runs, every backend this CPU supports,
 * and (when built with OpenBLAS) the sgemm + softmax + sgemm composite in the same run.
 *
 *   build/bench/bench_attention [--quick] [--shape=TEXT] [backend ...]
 *   OPENBLAS_CORETYPE=SkylakeX build/bench/bench_attention   # OpenBLAS with its AVX-512 kernels
 *
 * GFLOP/s counts 4 * len_q * len_kv * d per head (two matrix products), also for causal runs
 * (the dense-equivalent rate; the table says how much of that causal skips). "peak" is the
 * fraction of one core's FMA peak (PEAK_GFLOPS, measured on the reference machine: AMD Zen 5,
 * AVX-512); for decode, "bound" is the fraction of the rate at which K and V stream from L3
 * (L3_GBS). Times are the calling thread's CPU time (see now()). */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sdpa.h"

#ifdef SDPA_BENCH_OPENBLAS
#include <cblas.h>
#endif

#define PEAK_GFLOPS 254.0
#define L3_GBS      115.0

typedef struct shape {
    const char *name;
    size_t heads_q, heads_kv, len_q, len_kv, d;
    uint32_t flags;
} shape;

static const shape SHAPES[] = {
    {"decode 1x4096 d128", 1, 1, 1, 4096, 128, 0},
    {"GQA decode 32q/8kv 1024", 32, 8, 1, 1024, 128, 0},
    {"prefill 1024 d64", 1, 1, 1024, 1024, 64, 0},
    {"prefill 1024 d128", 1, 1, 1024, 1024, 128, 0},
    {"causal 1024 d128", 1, 1, 1024, 1024, 128, SDPA_CAUSAL},
    {"MHA 8h 512 d128", 8, 8, 512, 512, 128, 0},
    {"GQA 8q/2kv 512 d128", 8, 2, 512, 512, 128, 0},
};
#define N_SHAPES (sizeof SHAPES / sizeof SHAPES[0])

/* CPU time of this thread: on a machine shared with other jobs, time spent descheduled does not
 * count (their cache and SMT-sibling traffic still does; the median damps the rest). */
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct problem {
    const shape *s;
    float *q, *k, *v, *out, *scores;
    sdpa_mha_desc desc;
} problem;

static float *random_array(size_t n, unsigned *seed) {
    float *x = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    for (size_t i = 0; i < n; i++) x[i] = (float)rand_r(seed) / (float)RAND_MAX * 2.0f - 1.0f;
    return x;
}

static void problem_init(problem *p, const shape *s, unsigned seed) {
    p->s = s;
    p->q = random_array(s->heads_q * s->len_q * s->d, &seed);
    p->k = random_array(s->heads_kv * s->len_kv * s->d, &seed);
    p->v = random_array(s->heads_kv * s->len_kv * s->d, &seed);
    p->out = random_array(s->heads_q * s->len_q * s->d, &seed);
    p->scores = random_array(s->len_q * s->len_kv, &seed);
    sdpa_mha_desc_dense(&p->desc, 1, s->heads_q, s->heads_kv, s->len_q, s->len_kv, s->d, s->d,
                        SDPA_DEFAULT_SCALE, s->flags);
}

static void problem_free(problem *p) {
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->out);
    free(p->scores);
}

static void run_sdpa(problem *p) {
    if (sdpa_mha_f32(&p->desc, p->out, p->q, p->k, p->v) != SDPA_OK) {
        fprintf(stderr, "sdpa_mha_f32 failed\n");
        exit(1);
    }
}

#ifdef SDPA_BENCH_OPENBLAS
/* The composite an engine would write without sdpa: S = scale Q K^T (sgemm), a softmax per row
 * (sdpa_softmax_f32 on the active backend), O = S V (sgemm); sgemv for one query. Causal runs
 * use the full product and a -inf upper triangle, as a composite would. */
static void run_composite(problem *p) {
    const shape *s = p->s;
    const float scale = 1.0f / sqrtf((float)s->d);
    const size_t group = s->heads_q / s->heads_kv;
    for (size_t h = 0; h < s->heads_q; h++) {
        const float *q = p->q + h * s->len_q * s->d;
        const float *k = p->k + h / group * s->len_kv * s->d;
        const float *v = p->v + h / group * s->len_kv * s->d;
        float *o = p->out + h * s->len_q * s->d;
        int n = (int)s->len_kv, d = (int)s->d, m = (int)s->len_q;
        if (m == 1) {
            cblas_sgemv(CblasRowMajor, CblasNoTrans, n, d, scale, k, d, q, 1, 0.0f, p->scores, 1);
        } else {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, d, scale, q, d, k, d, 0.0f,
                        p->scores, n);
        }
        for (size_t i = 0; i < s->len_q; i++) {
            float *row = p->scores + i * s->len_kv;
            if (s->flags & SDPA_CAUSAL)
                for (size_t j = i + s->len_kv - s->len_q + 1; j < s->len_kv; j++)
                    row[j] = -INFINITY;
            sdpa_softmax_f32(row, row, s->len_kv, 1.0f);
        }
        if (m == 1) {
            cblas_sgemv(CblasRowMajor, CblasTrans, n, d, 1.0f, v, d, p->scores, 1, 0.0f, o, 1);
        } else {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, d, n, 1.0f, p->scores, n, v,
                        d, 0.0f, o, d);
        }
    }
}
#endif

/* Median seconds per call over at least min_reps calls and about min_time seconds. */
static double time_median(void (*fn)(problem *), problem *p, int min_reps, double min_time) {
    enum { MAX_REPS = 201 };
    double t[MAX_REPS];
    fn(p); /* warm caches and pages */
    int n = 0;
    double start = now();
    while (n < MAX_REPS && (n < min_reps || now() - start < min_time)) {
        double t0 = now();
        fn(p);
        t[n++] = now() - t0;
    }
    qsort(t, (size_t)n, sizeof t[0], cmp_double);
    return t[n / 2];
}

static double flops(const shape *s) {
    return 4.0 * (double)s->heads_q * (double)s->len_q * (double)s->len_kv * (double)s->d;
}

/* Fraction of the score matrix that causal masking removes. */
static double causal_skipped(const shape *s) {
    if (!(s->flags & SDPA_CAUSAL)) return 0.0;
    double seen = 0.0;
    for (size_t i = 0; i < s->len_q; i++) {
        double n = (double)(i + 1 + s->len_kv) - (double)s->len_q;
        seen += n < 0 ? 0 : n > (double)s->len_kv ? (double)s->len_kv : n;
    }
    return 1.0 - seen / ((double)s->len_q * (double)s->len_kv);
}

int main(int argc, char **argv) {
    int quick = 0;
    const char *shape_filter = NULL; /* --shape=TEXT: only shapes whose name contains TEXT */
    const char *only[8];
    int n_only = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if (strncmp(argv[i], "--shape=", 8) == 0)
            shape_filter = argv[i] + 8;
        else if (n_only < 8)
            only[n_only++] = argv[i];
    }
    const double min_time = quick ? 0.05 : 0.3;
    printf("sdpa %s attention benchmark, single thread, median; exp=%s\n", sdpa_version(),
           sdpa_exp_mode());
    printf("%-22s %-8s %10s %9s %7s %10s %s\n", "shape", "backend", "ms/call", "GFLOP/s", "peak",
           "vs comp.", "notes");
    for (size_t si = 0; si < N_SHAPES; si++) {
        const shape *s = &SHAPES[si];
        if (shape_filter && !strstr(s->name, shape_filter)) continue;
        problem p;
        problem_init(&p, s, 1234u + (unsigned)si);
        double t_comp = 0.0;
#ifdef SDPA_BENCH_OPENBLAS
        openblas_set_num_threads(1);
        sdpa_set_backend("auto");
        t_comp = time_median(run_composite, &p, 5, min_time);
        printf("%-22s %-8s %10.3f %9.1f %6.1f%% %10s %s\n", s->name, "openblas", t_comp * 1e3,
               flops(s) / t_comp * 1e-9, 100.0 * flops(s) / t_comp * 1e-9 / PEAK_GFLOPS, "1.00x",
               "sgemm/sgemv + sdpa softmax + sgemm/sgemv");
#endif
        for (size_t b = 0; sdpa_backend_name(b); b++) {
            const char *name = sdpa_backend_name(b);
            int wanted = n_only == 0;
            for (int i = 0; i < n_only; i++) wanted |= strcmp(only[i], name) == 0;
            if (!wanted || !sdpa_backend_supported(name)) continue;
            sdpa_set_backend(name);
            double t = time_median(run_sdpa, &p, strcmp(name, "scalar") == 0 ? 3 : 5, min_time);
            double gf = flops(s) / t * 1e-9;
            char frac[32], notes[96] = "";
            if (s->len_q == 1) {
                double gbs =
                    2.0 * (double)s->heads_kv * (double)s->len_kv * (double)s->d * 4.0 / t * 1e-9;
                snprintf(frac, sizeof frac, "%5.1f%%", 100.0 * gbs / L3_GBS);
                snprintf(notes, sizeof notes, "K+V %.1f GB/s of %.0f (bound)", gbs, L3_GBS);
            } else {
                snprintf(frac, sizeof frac, "%5.1f%%", 100.0 * gf / PEAK_GFLOPS);
            }
            if (s->flags & SDPA_CAUSAL) {
                /* the same shape without the mask, in the same run */
                problem full;
                shape fs = *s;
                fs.flags = 0;
                problem_init(&full, &fs, 99u);
                double tf = time_median(run_sdpa, &full, 3, min_time);
                problem_free(&full);
                snprintf(notes, sizeof notes,
                         "skips %.3f of %.3f GFLOP (%.1f%%); %.2fx faster than full",
                         causal_skipped(s) * flops(s) * 1e-9, flops(s) * 1e-9,
                         100.0 * causal_skipped(s), tf / t);
            }
            char vs[16] = "-";
            if (t_comp > 0.0) snprintf(vs, sizeof vs, "%.2fx", t_comp / t);
            printf("%-22s %-8s %10.3f %9.1f %7s %10s %s\n", s->name, name, t * 1e3, gf, frac, vs,
                   notes);
            fflush(stdout);
        }
        problem_free(&p);
    }
    sdpa_set_backend("auto");
    return 0;
}
