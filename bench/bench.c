/* sdpa benchmark: every backend this CPU runs, forced in turn through the public API, against
 * the peers found at configure time (peers.h), on the same inputs, each result checked against
 * the scalar backend before it is timed.
 *
 * Method: pinned to one core; each implementation is checked (which also warms it up), then
 * calibrated to a batch of calls lasting at least --min-ms; then --reps rounds time one batch of
 * every implementation in turn (round-robin, so a noisy neighbour hits all of them alike); the
 * table gives the median time per call, the spread (min and max) of the rounds, and ratios of
 * medians measured in this same run.
 *
 *   bench [--op dot|softmax]... [--backend NAME]... [--n N]... [--reps R] [--min-ms MS]
 *         [--cpu C] [--wall] [--no-peers] [--openblas-core NAME] [--csv FILE] [--json FILE]
 *         [--plot DIR] [--smoke]
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <sched.h>
#include <sleef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "output.h"
#include "peers.h"
#include "roofline.h"
#include "sdpa.h"

#define MAX_REPS  101
#define MAX_IMPLS 16
#define MAX_SIZES 16

enum op { OP_DOT, OP_SOFTMAX, N_OPS };
static const char *const OP_NAMES[N_OPS] = {"dot", "softmax"};
/* From L1 through L2 and L3 to DRAM (inputs of 2^24 floats are 64 MiB each). */
static const size_t DEFAULT_SIZES[N_OPS][MAX_SIZES] = {
    {16, 64, 128, 1024, 4096, 16384, 65536, 262144, 1u << 20, 1u << 22, 1u << 24},
    {128, 1024, 4096, 16384, 65536, 262144, 1u << 20},
};
static const size_t SMOKE_SIZES[N_OPS][MAX_SIZES] = {{16, 129}, {129}};

enum kind { KIND_SDPA, KIND_OPENBLAS, KIND_DNNL, KIND_NAIVE, KIND_ROOF };
/* The peers of each op, in the order of their "vs" columns. */
static const enum kind OP_PEERS[N_OPS][2] = {{KIND_OPENBLAS, KIND_NAIVE}, {KIND_DNNL, KIND_NAIVE}};
static const char *const KIND_NAMES[] = {"sdpa", "openblas", "onednn", "naive", "roof"};

typedef struct job {
    enum op op;
    size_t n;
    float *a, *b; /* dot inputs */
    float *x, *y; /* softmax input and output */
    float scale;
    float sink;
    peer_dnnl_softmax *dnnl;
} job;

typedef struct impl {
    enum kind kind;
    char label[24];
    const char *backend; /* KIND_SDPA */
    const char *exp;     /* KIND_SDPA softmax: "fast" or "sleef"; NULL otherwise */
    size_t iters;        /* calls per timed batch */
    double ns[MAX_REPS]; /* ns per call, one per round */
    double median, min, max;
    int checked_ok;
} impl;

typedef struct options {
    int ops[N_OPS];
    const char *backends[8];
    size_t n_backends;
    size_t sizes[MAX_SIZES];
    size_t n_sizes;
    int reps;
    double min_ms;
    int cpu;
    int peers;
    int smoke;
    const char *csv, *json, *plot;
} options;

/* The thread's CPU time by default: on a machine shared with other jobs, time the scheduler gives
 * them is then not charged to the kernel under test (--wall measures elapsed time instead). */
static clockid_t bench_clock = CLOCK_THREAD_CPUTIME_ID;

static double now_ns(void) {
    struct timespec t;
    clock_gettime(bench_clock, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void *xalloc(size_t n_floats) {
    void *p = NULL;
    size_t bytes = (n_floats * sizeof(float) + 63) / 64 * 64;
    if (posix_memalign(&p, 64, bytes ? bytes : 64)) {
        fprintf(stderr, "bench: out of memory (%zu floats)\n", n_floats);
        exit(2);
    }
    return p;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15u;
static float uniform(float lo, float hi) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return lo + (hi - lo) * (float)((double)(rng_state >> 11) * 0x1p-53);
}

/* ---- one batch of `iters` calls of an implementation ---- */

static void select_impl(const impl *im) {
    if (im->kind != KIND_SDPA) return;
    if (sdpa_set_backend(im->backend) != SDPA_OK ||
        (im->exp && sdpa_set_exp_mode(im->exp) != SDPA_OK)) {
        fprintf(stderr, "bench: cannot select %s\n", im->label);
        exit(2);
    }
}

static void run(const impl *im, job *j, size_t iters) {
    float acc = 0.0f, r = 0.0f;
    switch (j->op) {
    case OP_DOT:
        switch (im->kind) {
        case KIND_SDPA:
            for (size_t i = 0; i < iters; i++) sdpa_dot_f32(j->a, j->b, j->n, &r), acc += r;
            break;
        case KIND_OPENBLAS:
            for (size_t i = 0; i < iters; i++) acc += peer_openblas_sdot(j->a, j->b, j->n);
            break;
        case KIND_NAIVE:
            for (size_t i = 0; i < iters; i++) acc += naive_dot(j->a, j->b, j->n);
            break;
        case KIND_ROOF:
            for (size_t i = 0; i < iters; i++) acc += roof_load_sum(j->a, j->b, j->n);
            break;
        case KIND_DNNL: break;
        }
        break;
    case OP_SOFTMAX:
        switch (im->kind) {
        case KIND_SDPA:
            for (size_t i = 0; i < iters; i++) sdpa_softmax_f32(j->y, j->x, j->n, j->scale);
            break;
        case KIND_DNNL:
            for (size_t i = 0; i < iters; i++) peer_dnnl_softmax_run(j->dnnl);
            break;
        case KIND_NAIVE:
            for (size_t i = 0; i < iters; i++) naive_softmax(j->y, j->x, j->n, j->scale);
            break;
        case KIND_OPENBLAS:
        case KIND_ROOF: break;
        }
        acc = j->y[0];
        break;
    case N_OPS: break;
    }
    j->sink += acc;
}

static double time_batch(const impl *im, job *j, size_t iters) {
    double t0 = now_ns();
    run(im, j, iters);
    return (now_ns() - t0) / (double)iters;
}

/* Doubles (or scales up) the batch until one batch lasts at least min_ms. */
static size_t calibrate(const impl *im, job *j, double min_ms) {
    size_t iters = 1;
    for (;;) {
        double total = time_batch(im, j, iters) * (double)iters;
        if (total >= min_ms * 1e6 || iters >= ((size_t)1 << 40)) return iters;
        double grow = total > 0 ? min_ms * 1e6 / total * 1.1 : 16;
        iters = (size_t)((double)iters * (grow < 2 ? 2 : grow > 100 ? 100 : grow));
    }
}

/* ---- checking against the scalar backend ---- */

static float dot_abs_sum(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += fabs((double)a[i] * b[i]);
    return (float)s;
}

/* The documented bound (1e-5 * sum|a_i b_i| up to n = 4096) for each result, grown like the
 * random walk of rounding errors beyond it. */
static int dot_close(float got, float ref, float abs_sum, size_t n) {
    double grow = n > 4096 ? sqrt((double)n / 4096.0) : 1.0;
    return fabs((double)got - ref) <= 2 * 1e-5 * abs_sum * grow;
}

/* Relative error per element within twice the documented bound (two results, each within it),
 * absolute 2 * FLT_MIN where the reference is that small. */
static int softmax_close(const float *got, const float *ref, size_t n) {
    double tol = 2 * (n <= 4096 ? 2e-5 : 1e-4);
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (ref[i] >= 2 * FLT_MIN ? d > tol * ref[i] : d > 2 * FLT_MIN) return 0;
    }
    return 1;
}

static int check(const impl *im, job *j, const float *ref_y, float ref_dot, float abs_sum) {
    select_impl(im);
    if (j->op == OP_DOT) {
        float r = 0;
        switch (im->kind) {
        case KIND_SDPA: sdpa_dot_f32(j->a, j->b, j->n, &r); break;
        case KIND_OPENBLAS: r = peer_openblas_sdot(j->a, j->b, j->n); break;
        case KIND_NAIVE: r = naive_dot(j->a, j->b, j->n); break;
        case KIND_ROOF: return 1; /* not a dot: nothing to check */
        case KIND_DNNL: break;
        }
        return dot_close(r, ref_dot, abs_sum, j->n);
    }
    memset(j->y, 0xff, j->n * sizeof(float)); /* NaN: a kernel that writes nothing fails */
    run(im, j, 1);
    return softmax_close(j->y, ref_y, j->n);
}

/* ---- output ---- */

static int cmp_double(const void *p, const void *q) {
    double a = *(const double *)p, b = *(const double *)q;
    return (a > b) - (a < b);
}

static void summarize(impl *im, int reps) {
    double s[MAX_REPS];
    memcpy(s, im->ns, (size_t)reps * sizeof(double));
    qsort(s, (size_t)reps, sizeof(double), cmp_double);
    im->median = reps % 2 ? s[reps / 2] : (s[reps / 2 - 1] + s[reps / 2]) / 2;
    im->min = s[0];
    im->max = s[reps - 1];
}

static const impl *find_impl(const impl *ims, size_t n_impls, enum kind kind, const char *backend,
                             const char *exp) {
    for (size_t i = 0; i < n_impls; i++)
        if (ims[i].kind == kind && (!backend || strcmp(ims[i].backend, backend) == 0) &&
            (!exp || !ims[i].exp || strcmp(ims[i].exp, exp) == 0))
            return &ims[i];
    return NULL;
}

static void print_ratio(FILE *f, const impl *base, const impl *im, const char *fmt_missing) {
    if (base && base->median > 0)
        fprintf(f, f == stdout ? " %9.2fx" : ",%.4f", base->median / im->median);
    else
        fprintf(f, "%s", fmt_missing);
}

/* Measured at start-up and printed in the header. */
static roofline roof;

static void print_header_row(enum op op, int peers) {
    printf("\n%-8s %9s %-13s %10s %17s %9s %8s %8s %6s %10s", "op", "n", "impl", "ns/call",
           "spread min..max", "ns/elem", "GFLOP/s", "GB/s", "roof%", "vs scalar");
    if (peers)
        for (int p = 0; p < 2; p++) printf(" vs %-7s", KIND_NAMES[OP_PEERS[op][p]]);
    printf("\n");
}

static void print_rows(FILE *csv, const job *j, const impl *ims, size_t n_impls, int peers) {
    for (size_t i = 0; i < n_impls; i++) {
        const impl *im = &ims[i];
        double n = (double)j->n, ns = im->median;
        /* dot: one multiply and one add per element, two floats read; softmax: one float read
           and one written (its extra passes over y are its own cost, not counted as traffic) */
        double flops = j->op == OP_DOT ? 2 * n : 0, bytes = 8 * n;
        const impl *scalar = find_impl(ims, n_impls, KIND_SDPA, "scalar", im->exp);
        char spread[40];
        snprintf(spread, sizeof spread, "%+.1f%%..%+.1f%%", 100 * (im->min / ns - 1),
                 100 * (im->max / ns - 1));
        printf("%-8s %9zu %-13s %10.*f %17s %9.4f ", OP_NAMES[j->op], j->n, im->label,
               ns < 100   ? 2
               : ns < 1e5 ? 1
                          : 0,
               ns, spread, ns / n);
        if (flops)
            printf("%8.1f", flops / ns);
        else
            printf("%8s", "-");
        printf(" %8.1f", bytes / ns);
        const impl *limit = find_impl(ims, n_impls, KIND_ROOF, NULL, NULL);
        double roof_pct = limit && j->op == OP_DOT ? 100 * limit->median / ns : -1;
        if (roof_pct >= 0)
            printf(" %6.0f", roof_pct);
        else
            printf(" %6s", "-");
        print_ratio(stdout, scalar, im, "          -");
        if (peers)
            for (int p = 0; p < 2; p++)
                print_ratio(stdout, find_impl(ims, n_impls, OP_PEERS[j->op][p], NULL, NULL), im,
                            "          -");
        printf("%s\n", im->checked_ok ? "" : "  WRONG RESULT");
        bench_record rec = {.op = OP_NAMES[j->op],
                            .n = j->n,
                            .ns = ns,
                            .ns_min = im->min,
                            .ns_max = im->max,
                            .per_ns = flops ? flops / ns : n / ns,
                            .vs_scalar = scalar ? scalar->median / ns : 0,
                            .ok = im->checked_ok};
        snprintf(rec.impl, sizeof rec.impl, "%s", im->label);
        record_add(&rec);
        if (csv) {
            fprintf(csv, "%s,%zu,%s,%s,%s,%.3f,%.3f,%.3f,%.5f,%.3f,%.3f", OP_NAMES[j->op], j->n,
                    KIND_NAMES[im->kind], im->kind == KIND_SDPA ? im->backend : "",
                    im->exp ? im->exp : "", ns, im->min, im->max, ns / n, flops / ns, bytes / ns);
            print_ratio(csv, scalar, im, ",");
            for (int p = 0; p < 2; p++)
                print_ratio(csv, find_impl(ims, n_impls, OP_PEERS[j->op][p], NULL, NULL), im, ",");
            if (roof_pct >= 0)
                fprintf(csv, ",%.1f", roof_pct);
            else
                fprintf(csv, ",");
            fprintf(csv, ",%s\n", im->checked_ok ? "ok" : "wrong");
        }
    }
}

/* ---- one (op, n) group: allocate, reference, check, calibrate, time, print ---- */

static int bench_one(const options *o, enum op op, size_t n, FILE *csv) {
    job j = {.op = op, .n = n, .scale = 1.0f};
    impl ims[MAX_IMPLS];
    size_t n_impls = 0;
    static const char *const EXPS[] = {"fast", "sleef"};
    for (size_t b = 0; b < o->n_backends; b++)
        for (int e = 0; e < (op == OP_SOFTMAX ? 2 : 1); e++) {
            impl *im = &ims[n_impls++];
            *im = (impl){.kind = KIND_SDPA, .backend = o->backends[b]};
            im->exp = op == OP_SOFTMAX ? EXPS[e] : NULL;
            snprintf(im->label, sizeof im->label, "%s%s%s", im->backend, im->exp ? " " : "",
                     im->exp ? im->exp : "");
        }

    float *ref_y = NULL, ref_dot = 0, abs_sum = 0;
    if (op == OP_DOT) {
        j.a = xalloc(n), j.b = xalloc(n);
        for (size_t i = 0; i < n; i++) j.a[i] = uniform(-1, 1), j.b[i] = uniform(-1, 1);
        abs_sum = dot_abs_sum(j.a, j.b, n);
    } else {
        j.x = xalloc(n), j.y = xalloc(n), ref_y = xalloc(2 * n);
        for (size_t i = 0; i < n; i++) j.x[i] = uniform(-8, 8);
    }
    if (o->peers) {
        if (op == OP_DOT && peer_openblas_describe())
            ims[n_impls++] = (impl){.kind = KIND_OPENBLAS, .label = "openblas"};
        if (op == OP_SOFTMAX && (j.dnnl = peer_dnnl_softmax_create(j.y, j.x, n)))
            ims[n_impls++] = (impl){.kind = KIND_DNNL, .label = "onednn"};
        ims[n_impls++] = (impl){.kind = KIND_NAIVE, .label = "naive"};
    }
    /* the loads alone, for dots whose inputs fit in L1 (32 KiB of the 48 KiB of Zen 5) */
    if (op == OP_DOT && n * 8 <= 32768)
        ims[n_impls++] = (impl){.kind = KIND_ROOF, .label = "L1 loads"};

    /* references: the scalar backend, in each exp mode for softmax */
    if (sdpa_set_backend("scalar") != SDPA_OK) return 1;
    if (op == OP_DOT)
        sdpa_dot_f32(j.a, j.b, n, &ref_dot);
    else
        for (int e = 0; e < 2; e++) {
            sdpa_set_exp_mode(EXPS[e]);
            sdpa_softmax_f32(ref_y + (size_t)e * n, j.x, n, j.scale);
        }

    int failures = 0;
    for (size_t i = 0; i < n_impls; i++) {
        impl *im = &ims[i];
        const float *ref = ref_y ? ref_y + (im->exp && strcmp(im->exp, "fast") == 0 ? 0 : n) : 0;
        im->checked_ok = check(im, &j, ref, ref_dot, abs_sum);
        failures += !im->checked_ok;
        im->iters = o->smoke ? 1 : (select_impl(im), calibrate(im, &j, o->min_ms));
    }
    for (int r = 0; r < o->reps; r++)
        for (size_t i = 0; i < n_impls; i++) {
            select_impl(&ims[i]);
            ims[i].ns[r] = time_batch(&ims[i], &j, ims[i].iters);
        }
    for (size_t i = 0; i < n_impls; i++) summarize(&ims[i], o->reps);
    print_rows(csv, &j, ims, n_impls, o->peers);
    fflush(stdout);

    peer_dnnl_softmax_destroy(j.dnnl);
    free(j.a), free(j.b), free(j.x), free(j.y), free(ref_y);
    return failures;
}

/* ---- set-up: environment for the peers, pinning, options, header ---- */

/* OpenBLAS reads OPENBLAS_CORETYPE and its thread count when it is loaded, and oneDNN's OpenMP
 * its thread count, both before main: so set them and re-execute once. Debian's OpenBLAS 0.3.21
 * takes Zen 5 for Haswell (AVX2 kernels); on a CPU with AVX-512 we ask for SkylakeX, replacing
 * any value in the environment (--openblas-core NAME chooses another). The value found is kept
 * in SDPA_BENCH_CORETYPE_WAS for the header. */
static void set_peer_environment(int argc, char **argv) {
    if (getenv("SDPA_BENCH_REEXEC")) return;
    setenv("SDPA_BENCH_REEXEC", "1", 1);
    const char *was = getenv("OPENBLAS_CORETYPE"), *core = NULL;
    setenv("SDPA_BENCH_CORETYPE_WAS", was ? was : "(unset)", 1);
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--openblas-core") == 0) core = argv[i + 1];
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (!core && __builtin_cpu_supports("avx512f")) core = "SkylakeX";
#endif
    if (core) setenv("OPENBLAS_CORETYPE", core, 1);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    execv("/proc/self/exe", argv);
    fprintf(stderr, "bench: re-exec failed (%s); peers run with their default settings\n",
            strerror(errno));
}

static int pin(int cpu) {
    if (cpu < 0) cpu = sched_getcpu();
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (cpu < 0 || sched_setaffinity(0, sizeof set, &set) != 0) return -1;
    return cpu;
}

static void cpu_model(char *out, size_t len) {
    snprintf(out, len, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0) {
            char *v = strchr(line, ':');
            if (v) snprintf(out, len, "%s", v + 2 + strspn(v + 2, " "));
            out[strcspn(out, "\n")] = 0;
            break;
        }
    fclose(f);
}

static void usage(int status) {
    fprintf(status ? stderr : stdout,
            "usage: bench [--op dot|softmax]... [--backend NAME]... [--n N]...\n"
            "             [--reps R] [--min-ms MS] [--cpu C] [--wall] [--no-peers]\n"
            "             [--openblas-core NAME] [--csv FILE] [--json FILE] [--plot DIR]\n"
            "             [--smoke]\n");
    exit(status);
}

static options parse(int argc, char **argv) {
    options o = {.reps = 11, .min_ms = 4, .cpu = -1, .peers = 1};
    int any_op = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0)
            usage(0);
        else if (strcmp(a, "--smoke") == 0)
            o.smoke = 1;
        else if (strcmp(a, "--wall") == 0)
            bench_clock = CLOCK_MONOTONIC;
        else if (strcmp(a, "--no-peers") == 0)
            o.peers = 0;
        else if (!v)
            usage(2);
        else if (++i, strcmp(a, "--op") == 0) {
            int k = strcmp(v, "dot") == 0 ? OP_DOT : strcmp(v, "softmax") == 0 ? OP_SOFTMAX : -1;
            if (k < 0) usage(2);
            o.ops[k] = any_op = 1;
        } else if (strcmp(a, "--backend") == 0 && o.n_backends < 8) {
            if (!sdpa_backend_supported(v)) {
                fprintf(stderr, "bench: backend %s cannot run here\n", v);
                exit(2);
            }
            o.backends[o.n_backends++] = v;
        } else if (strcmp(a, "--n") == 0 && o.n_sizes < MAX_SIZES)
            o.sizes[o.n_sizes++] = strtoull(v, NULL, 0);
        else if (strcmp(a, "--reps") == 0)
            o.reps = atoi(v);
        else if (strcmp(a, "--min-ms") == 0)
            o.min_ms = atof(v);
        else if (strcmp(a, "--openblas-core") == 0)
            continue; /* used by set_peer_environment */
        else if (strcmp(a, "--cpu") == 0)
            o.cpu = atoi(v);
        else if (strcmp(a, "--csv") == 0)
            o.csv = v;
        else if (strcmp(a, "--json") == 0)
            o.json = v;
        else if (strcmp(a, "--plot") == 0)
            o.plot = v;
        else
            usage(2);
    }
    if (o.smoke) o.reps = 1;
    if (o.reps < 1 || o.reps > MAX_REPS) usage(2);
    if (!any_op) o.ops[OP_DOT] = o.ops[OP_SOFTMAX] = 1;
    if (!o.n_backends) {
        /* scalar is always measured: it is the baseline of every ratio */
        for (size_t i = 0; sdpa_backend_name(i); i++)
            if (sdpa_backend_supported(sdpa_backend_name(i)))
                o.backends[o.n_backends++] = sdpa_backend_name(i);
    } else if (!sdpa_backend_supported("scalar") || o.n_backends == 8) {
        usage(2);
    } else {
        int has_scalar = 0;
        for (size_t i = 0; i < o.n_backends; i++) has_scalar |= !strcmp(o.backends[i], "scalar");
        if (!has_scalar) o.backends[o.n_backends++] = "scalar";
    }
    return o;
}

int main(int argc, char **argv) {
    set_peer_environment(argc, argv);
    options o = parse(argc, argv);
    int cpu = pin(o.cpu);

    char model[128], date[32];
    cpu_model(model, sizeof model);
    time_t t = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&t));
    printf("sdpa %s benchmark, %s\n", sdpa_version(), date);
    printf("cpu: %s; pinned to core %d%s\n", model, cpu, cpu < 0 ? " (pinning FAILED)" : "");
    printf("auto backend: %s; measured:", sdpa_backend());
    for (size_t i = 0; i < o.n_backends; i++) printf(" %s", o.backends[i]);
    printf("\ncompiler: %s; SLEEF %d.%d.%d\n", __VERSION__, SLEEF_VERSION_MAJOR,
           SLEEF_VERSION_MINOR, SLEEF_VERSION_PATCHLEVEL);
    if (o.peers) {
        const char *blas = peer_openblas_describe(), *dnnl = peer_dnnl_describe();
        printf("peer openblas: %s\n", blas ? blas : "not built in");
        printf("peer onednn: %s\n", dnnl ? dnnl : "not built in");
        printf("peer naive: C loops, %s\n", NAIVE_FLAGS);
    }
    printf("clock: %s\n", bench_clock == CLOCK_MONOTONIC
                              ? "wall (CLOCK_MONOTONIC)"
                              : "thread CPU time (CLOCK_THREAD_CPUTIME_ID; --wall for elapsed)");
    printf("roof%%: for dots whose inputs fit in L1, the time of the \"L1 loads\" row (the same "
           "inputs read with the widest vectors, nothing else) over the row's time\n");
    printf("method: %d rounds of batches >= %g ms each, round-robin over implementations; median "
           "ns per call, spread = min..max round vs median; vs X = X's median / this median "
           "(> 1: faster than X); inputs 64-byte aligned; softmax scale 1\n",
           o.reps, o.smoke ? 0.0 : o.min_ms);

    roof = roofline_measure();
    if (roof.l1_isa)
        printf("roofline: core clock %.2f GHz; L1 load bandwidth (%s) %.0f GB/s = %.0f B/cycle; "
               "dot in L1 can reach at most %.1f GFLOP/s (2 FLOP per 8 bytes loaded)\n",
               roof.clock_ghz, roof.l1_isa, roof.l1_bytes_per_ns,
               roof.l1_bytes_per_ns / roof.clock_ghz, roof.l1_bytes_per_ns / 4);

    FILE *csv = NULL;
    if (o.csv) {
        if (!(csv = fopen(o.csv, "w"))) {
            fprintf(stderr, "bench: cannot write %s\n", o.csv);
            return 2;
        }
        fprintf(csv, "op,n,impl,backend,exp,ns_median,ns_min,ns_max,ns_per_elem,gflops,gbytes_per_"
                     "s,vs_scalar,vs_openblas_or_onednn,vs_naive,roof_percent,check\n");
    }

    int failures = 0;
    for (int op = 0; op < N_OPS; op++) {
        if (!o.ops[op]) continue;
        print_header_row((enum op)op, o.peers);
        const size_t *sizes = o.n_sizes ? o.sizes : o.smoke ? SMOKE_SIZES[op] : DEFAULT_SIZES[op];
        size_t count = o.n_sizes ? o.n_sizes : MAX_SIZES;
        for (size_t s = 0; s < count && sizes[s]; s++)
            failures += bench_one(&o, (enum op)op, sizes[s], csv);
    }
    if (csv) fclose(csv);
    char compiler[160], sleef[32];
    snprintf(compiler, sizeof compiler, "gcc %s", __VERSION__);
    snprintf(sleef, sizeof sleef, "%d.%d.%d", SLEEF_VERSION_MAJOR, SLEEF_VERSION_MINOR,
             SLEEF_VERSION_PATCHLEVEL);
    bench_context ctx = {.date = date,
                         .cpu = model,
                         .compiler = compiler,
                         .sleef = sleef,
                         .openblas = o.peers ? peer_openblas_describe() : NULL,
                         .onednn = o.peers ? peer_dnnl_describe() : NULL,
                         .naive = o.peers ? NAIVE_FLAGS : NULL,
                         .clock = bench_clock == CLOCK_MONOTONIC ? "wall" : "thread cpu time",
                         .clock_ghz = roof.clock_ghz,
                         .l1_gbytes_per_s = roof.l1_bytes_per_ns};
    if (o.json && write_json(o.json, &ctx) != 0) failures++;
    if (o.plot && write_plots(o.plot) != 0) failures++;
    if (failures)
        printf("\n%d results differ from the scalar backend beyond tolerance\n", failures);
    return failures ? 1 : 0;
}
