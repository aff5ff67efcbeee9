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
 * Ops (ops.c, kv_store.c, attention.c): dot, scale, softmax (both exp modes), scores, to_f16,
 * from_f16, kv_store (sdpa_kv_cache_store against memcpy), attention (shapes in
 * the benchdnn style: decode, prefill, causal, MHA and GQA, f32 or 16-bit; a 16-bit shape also
 * times sdpa_mha_f32 on the same values in the same rounds, its "vs f32" column); each row also
 * says how close it came to the limit that binds it (roofline.h, measured at start-up).
 *
 *   bench [--op NAME]... [--backend NAME]... [--n N]... [--d D]... [--shape SHAPE]...
 *         [--reps R] [--min-ms MS]
 *         [--cpu C] [--wall] [--no-peers] [--no-roofline] [--openblas-core NAME]
 *         [--csv FILE] [--json FILE] [--plot DIR] [--smoke] [--threads LIST]
 *
 * Threads: every row runs with sdpa_set_num_threads(1) unless it says otherwise. --threads 1,2
 * adds, for the attention op, a row of the active backend at each listed count above 1 (labelled
 * "avx512 x2"); the run is then pinned to as many cores as the largest count, and timed by the
 * wall clock (a thread's CPU time would miss its pool's work), every row alike, each timed batch
 * after one untimed call of the same row.
 *
 * Against: --against LIB (another build's libsdpa.so.1, loaded with dlmopen and called through
 * its sdpa_get_api table) adds its row beside the first backend's in every op and size, on the
 * same inputs; the two take turns to go first, and "vs old" is the median over pairs of rounds of
 * the geometric mean of the pair's old / new: a change's cost within a percent or two on a
 * machine whose run-to-run drift is larger.
 *
 * Memory: --cold times one call a batch, each after a read of twice the largest cache, so that a
 * decode's K and V come from memory as they do in a serving engine, whatever the size of this
 * machine's last-level cache (a warm batch of a 256 MiB decode on a 300 MiB L3 finds much of it
 * there). --huge-pages puts arrays of 2 MiB and more in 2 MiB pages.
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

#include "backends.h"
#include "bench.h"
#include "call_floor.h"
#include "options.h"
#include "output.h"
#include "peers.h"
#include "roofline.h"
#include "sdpa.h"

#define MAX_IMPLS 16

typedef struct impl {
    enum kind kind;
    char label[24];
    const char *backend; /* KIND_SDPA, KIND_F32 */
    const char *exp;     /* KIND_SDPA softmax: "fast" or "sleef"; NULL otherwise */
    size_t threads;      /* sdpa_set_num_threads for its calls; 0 counts as 1 */
    size_t iters;        /* calls per timed batch */
    double ns[MAX_REPS]; /* ns per call, one per round */
    double median, min, max;
    int reps; /* rounds in ns */
    int checked_ok;
} impl;

/* The thread's CPU time by default: on a machine shared with other jobs, time the scheduler gives
 * them is then not charged to the kernel under test (--wall measures elapsed time instead). */
static clockid_t bench_clock = CLOCK_THREAD_CPUTIME_ID;

static double now_ns(void) {
    struct timespec t;
    clock_gettime(bench_clock, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* ---- timing ---- */

/* sdpa's own rows, which must be right, against the peers, which may drift */
static int is_ours(const impl *im) {
    return im->kind == KIND_SDPA || im->kind == KIND_F32 || im->kind == KIND_DENSE ||
           im->kind == KIND_OLD;
}

/* A row's settings, through the table its calls take (bench_api; the other build's for its
   row): the thread count; sdpa's rows their backend, peers that call sdpa (the attention
   composite's softmax) the default one; and the exp mode, fast for a row that names none,
   whatever the row before set. */
static void select_impl(const impl *im) {
    const sdpa_api *api = bench_api(im->kind);
    if (api->set_num_threads(im->threads ? im->threads : 1) != SDPA_OK ||
        api->set_backend(is_ours(im) ? im->backend : "auto") != SDPA_OK ||
        api->set_exp_mode(im->exp ? im->exp : "fast") != SDPA_OK) {
        fprintf(stderr, "bench: cannot select %s\n", im->label);
        exit(2);
    }
}

static double time_batch(const impl *im, job *j, size_t iters) {
    double t0 = now_ns();
    j->op->run(im->kind, j, iters);
    return (now_ns() - t0) / (double)iters;
}

/* --cold: a buffer twice the largest cache the OS reports (at least 64 MiB), read a line at a
   time before each timed call, so that the call finds none of its inputs in any cache, as a
   serving engine's decode finds a layer's K/V cache after the other layers ran. Read, not
   written: dirty lines would be written back during the timed call. */
static const unsigned char *evict_buf;
static size_t evict_bytes;

/* the largest cache of cpu 0 in sysfs, in bytes (0 if none is listed) */
static size_t largest_cache(void) {
    size_t best = 0;
    for (int i = 0; i < 16; i++) {
        char path[96], unit = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        unsigned long long v = 0;
        if (fscanf(f, "%llu%c", &v, &unit) >= 1) {
            const size_t bytes = (size_t)v << (unit == 'K' ? 10 : unit == 'M' ? 20 : 0);
            if (bytes > best) best = bytes;
        }
        fclose(f);
    }
    return best;
}

static void evict_setup(void) {
    evict_bytes = 2 * largest_cache();
    if (evict_bytes < ((size_t)64 << 20)) evict_bytes = (size_t)64 << 20;
    unsigned char *b = malloc(evict_bytes);
    if (!b) {
        fprintf(stderr, "bench: --cold cannot allocate %zu bytes\n", evict_bytes);
        exit(2);
    }
    memset(b, 1, evict_bytes);
    evict_buf = b;
}

static void evict_caches(void) {
    unsigned sum = 0;
    for (size_t i = 0; i < evict_bytes; i += 64)
        sum += ((const volatile unsigned char *)evict_buf)[i];
    __asm__ volatile("" ::"r"(sum));
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

/* One call on poisoned outputs (NaN: a kernel that writes nothing fails), then the op's check. */
static int check(const impl *im, job *j) {
    select_impl(im);
    if (j->y) memset(j->y, 0xff, (j->y_len ? j->y_len : j->n) * sizeof(float));
    j->result = NAN;
    j->op->run(im->kind, j, 1);
    return j->op->verify(j, im->exp && strcmp(im->exp, "sleef") == 0);
}

/* ---- output ---- */

static int cmp_double(const void *p, const void *q) {
    double a = *(const double *)p, b = *(const double *)q;
    return (a > b) - (a < b);
}

/* the median of n sorted values */
static double median_of(const double *s, int n) {
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

static void summarize(impl *im, int reps) {
    double s[MAX_REPS];
    memcpy(s, im->ns, (size_t)reps * sizeof(double));
    qsort(s, (size_t)reps, sizeof(double), cmp_double);
    im->median = median_of(s, reps);
    im->reps = reps;
    im->min = s[0];
    im->max = s[reps - 1];
}

static const impl *find_impl(const impl *ims, size_t n_impls, enum kind kind, const char *backend,
                             const char *exp) {
    if (kind == KIND_NONE) return NULL;
    for (size_t i = 0; i < n_impls; i++)
        if (ims[i].kind == kind && (!backend || strcmp(ims[i].backend, backend) == 0) &&
            (!exp || !ims[i].exp || strcmp(ims[i].exp, exp) == 0))
            return &ims[i];
    return NULL;
}

static double ratio(const impl *base, const impl *im) {
    return base && base->median > 0 && im->median > 0 ? base->median / im->median : 0;
}

/* base's time / im's, where the two took turns to go first: the median over pairs of rounds of
   the geometric mean of the pair's two ratios, so that what going first or second costs cancels
   (a lone round where there is one), and the machine's drift between rounds does not count. */
static double round_ratio(const impl *base, const impl *im) {
    double r[MAX_REPS];
    const int n = im->reps > 1 ? im->reps / 2 : 1;
    for (int i = 0; i < n; i++)
        r[i] = im->reps > 1
                   ? sqrt(base->ns[2 * i] / im->ns[2 * i] * base->ns[2 * i + 1] / im->ns[2 * i + 1])
                   : base->ns[0] / im->ns[0];
    qsort(r, (size_t)n, sizeof(double), cmp_double);
    return median_of(r, n);
}

static void print_ratio(FILE *f, double r) {
    if (f == stdout)
        r > 0 ? printf(" %9.2fx", r) : printf(" %10s", "-");
    else
        r > 0 ? fprintf(f, ",%.4f", r) : fprintf(f, ",");
}

/* Measured at start-up and printed in the header. */
static roofline roof;
static int have_roof;

/* The time the binding limit allows and which limit that is: bytes over the bandwidth of the
 * level the working set lives in, or flops over the FMA peak, whichever is longer. */
static double roof_ns(const job *j, const char **limit) {
    double flops, bytes, ws;
    j->op->cost(j, &flops, &bytes, &ws);
    *limit = "-";
    if (!have_roof) return 0;
    enum roof_level l = roofline_level(&roof, (size_t)ws);
    double t_mem = roof.read_gbytes_per_s[l] > 0 ? bytes / roof.read_gbytes_per_s[l] : 0;
    double t_fma = roof.fma_gflops > 0 ? flops / roof.fma_gflops : 0;
    *limit = t_fma > t_mem ? "FMA" : ROOF_LEVEL_NAMES[l];
    return t_fma > t_mem ? t_fma : t_mem;
}

static void op_display_name(const job *j, char *out, size_t len) {
    if (j->d)
        snprintf(out, len, "%s d%zu", j->op->name, j->d);
    else
        snprintf(out, len, "%s", j->op->name);
}

/* Width of the size column: attention's are shape names. */
static int size_width(const op_def *op) { return op->shaped ? 26 : 9; }

/* The "vs" column of peer p: the outside peers' with peers on, the f32 yardstick's always. */
static int shows_peer(const op_def *op, int p, int peers) {
    return op->peers[p] != KIND_NONE && (peers || op->peers[p] == KIND_F32);
}

static void print_header_row(const op_def *op, int peers) {
    printf("\n%-12s %*s %-13s %10s %17s %9s %8s %8s %6s %-5s %10s", "op", size_width(op),
           op->shaped ? "shape" : "n", "impl", "ns/call", "spread min..max", "ns/elem", "GFLOP/s",
           "GB/s", "roof%", "limit", "vs scalar");
    for (int p = 0; p < 2; p++)
        if (shows_peer(op, p, peers)) printf(" vs %-7s", KIND_NAMES[op->peers[p]]);
    printf("\n");
}

static void print_rows(FILE *csv, const job *j, const impl *ims, size_t n_impls, int peers) {
    char name[32];
    op_display_name(j, name, sizeof name);
    double flops, bytes, ws;
    j->op->cost(j, &flops, &bytes, &ws);
    const char *limit;
    double bound_ns = roof_ns(j, &limit);
    for (size_t i = 0; i < n_impls; i++) {
        const impl *im = &ims[i];
        double n = (double)j->n, ns = im->median;
        const impl *scalar = find_impl(ims, n_impls, KIND_SDPA, "scalar", im->exp);
        double vs[2] = {0, 0};
        for (int p = 0; p < 2; p++)
            vs[p] = ratio(find_impl(ims, n_impls, j->op->peers[p], NULL, NULL), im);
        double roof_pct = bound_ns > 0 ? 100 * bound_ns / ns : -1;
        char spread[40];
        snprintf(spread, sizeof spread, "%+.1f%%..%+.1f%%", 100 * (im->min / ns - 1),
                 100 * (im->max / ns - 1));
        printf("%-12s %*s %-13s %10.*f %17s %9.4f ", name, size_width(j->op), j->size_label,
               im->label,
               ns < 100   ? 2
               : ns < 1e5 ? 1
                          : 0,
               ns, spread, ns / n);
        if (flops)
            printf("%8.1f", flops / ns);
        else
            printf("%8s", "-");
        printf(" %8.1f", bytes / ns);
        if (roof_pct >= 0)
            printf(" %6.0f %-5s", roof_pct, limit);
        else
            printf(" %6s %-5s", "-", "-");
        print_ratio(stdout, ratio(scalar, im));
        for (int p = 0; p < 2; p++)
            if (shows_peer(j->op, p, peers)) print_ratio(stdout, vs[p]);
        /* a paged row against the dense call of its backend, in the same rounds */
        const impl *dense = find_impl(ims, n_impls, KIND_DENSE, im->backend, NULL);
        if (im->kind == KIND_SDPA && !im->threads && dense)
            printf("  vs dense %.2fx", ratio(dense, im));
        /* this library's row against the other build's, in the same rounds */
        const impl *old = find_impl(ims, n_impls, KIND_OLD, im->backend, NULL);
        if (im->kind == KIND_SDPA && !im->threads && old && old->exp == im->exp)
            printf("  vs old %.3fx", round_ratio(old, im));
        printf("%s\n", im->checked_ok ? ""
                       : is_ours(im)  ? "  WRONG RESULT"
                                      : "  INACCURATE (outside sdpa's tolerance)");
        bench_record rec = {.n = j->n,
                            .d = j->d,
                            .ns = ns,
                            .ns_min = im->min,
                            .ns_max = im->max,
                            .gflops = flops / ns,
                            .gbytes_per_s = bytes / ns,
                            .roof_percent = roof_pct,
                            .vs_scalar = ratio(scalar, im),
                            .ok = im->checked_ok};
        snprintf(rec.op, sizeof rec.op, "%s", name);
        snprintf(rec.size, sizeof rec.size, "%s", j->size_label);
        snprintf(rec.impl, sizeof rec.impl, "%s", im->label);
        snprintf(rec.limit, sizeof rec.limit, "%s", limit);
        rec.per_ns = strcmp(j->op->plot_unit, "GFLOP/s") == 0 ? rec.gflops : rec.gbytes_per_s;
        rec.unit = j->op->plot_unit;
        record_add(&rec);
        if (csv) {
            fprintf(csv, "%s,%zu,%zu,%s,%s,%s,%s,%s,%.3f,%.3f,%.3f,%.5f,%.3f,%.3f", j->op->name,
                    j->d, j->n, j->size_label, im->label, KIND_NAMES[im->kind],
                    is_ours(im) ? im->backend : "", im->exp ? im->exp : "", ns, im->min, im->max,
                    ns / n, flops / ns, bytes / ns);
            if (roof_pct >= 0)
                fprintf(csv, ",%.1f,%s", roof_pct, limit);
            else
                fprintf(csv, ",,");
            print_ratio(csv, ratio(scalar, im));
            for (int p = 0; p < 2; p++) {
                print_ratio(csv, vs[p]);
                fprintf(csv, ",%s",
                        j->op->peers[p] == KIND_NONE ? "" : KIND_NAMES[j->op->peers[p]]);
            }
            fprintf(csv, ",%s\n", im->checked_ok ? "ok" : is_ours(im) ? "wrong" : "inaccurate");
        }
    }
}

/* ---- one (op, size) group: prepare, check, calibrate, time, print ---- */

static int inaccurate_peers;

static int bench_one(const options *o, const op_def *op, size_t n, size_t d, FILE *csv) {
    job j = {.op = op, .n = n, .d = d};
    snprintf(j.size_label, sizeof j.size_label, "%zu", n);
    op->prepare(&j);
    impl ims[MAX_IMPLS];
    size_t n_impls = 0;
    for (size_t b = 0; b < o->n_backends; b++)
        for (int e = 0; e < op->exp_modes; e++) {
            impl *im = &ims[n_impls++];
            *im = (impl){.kind = KIND_SDPA, .backend = o->backends[b]};
            im->exp = op->exp_modes > 1 ? EXPS[e] : NULL;
            snprintf(im->label, sizeof im->label, "%s%s%s", im->backend, im->exp ? " " : "",
                     im->exp ? im->exp : "");
        }
    /* --against: the other build's call on the first backend, next to this one's row: the two
       take turns to go first (the rounds below), as a row after another's (which read other
       arrays, or ran long) measured slower here even after an untimed call */
    const int against = op->against && op->against(&j);
    if (against) {
        memmove(&ims[2], &ims[1], (n_impls - 1) * sizeof *ims);
        ims[1] = (impl){.kind = KIND_OLD, .backend = o->backends[0], .exp = ims[0].exp};
        snprintf(ims[1].label, sizeof ims[1].label, "%s%s%s old", ims[1].backend,
                 ims[1].exp ? " " : "", ims[1].exp ? ims[1].exp : "");
        n_impls++;
    }
    if (op->shaped) /* the first (best) backend again at each thread count above 1 */
        for (size_t t = 0; t < o->n_threads && n_impls < MAX_IMPLS - 4; t++) {
            if (o->threads[t] < 2) continue;
            impl *im = &ims[n_impls++];
            *im = (impl){.kind = KIND_SDPA, .backend = o->backends[0], .threads = o->threads[t]};
            snprintf(im->label, sizeof im->label, "%s x%zu", im->backend, im->threads);
        }
    if (o->peers)
        for (int p = 0; p < 2; p++) {
            enum kind k = op->peers[p];
            /* the composite knows no score modifier and no mixed batch */
            if (k == KIND_OPENBLAS && (op != &ATTENTION_OP || attention_uniform(&j)) &&
                peer_openblas_describe())
                ims[n_impls++] = (impl){.kind = KIND_OPENBLAS, .label = "openblas"};
            if (k == KIND_DNNL && (j.dnnl = peer_dnnl_softmax_create(j.y, j.x, n)))
                ims[n_impls++] = (impl){.kind = KIND_DNNL, .label = "onednn"};
            if (k == KIND_NAIVE) ims[n_impls++] = (impl){.kind = KIND_NAIVE, .label = "naive"};
        }
    /* 16-bit attention: the f32 call on the same values, in the same rounds, so that the ratio
       of the two is not the drift of a shared machine between two groups of rows */
    if (op == &ATTENTION_OP && attention_typed(&j)) {
        impl *im = &ims[n_impls++];
        *im = (impl){.kind = KIND_F32, .backend = o->backends[0]};
        snprintf(im->label, sizeof im->label, "%s f32", im->backend);
    }
    /* a paged shape: sdpa_mha on its values laid out densely, in the same rounds */
    if (op == &ATTENTION_OP && attention_paged(&j)) {
        impl *im = &ims[n_impls++];
        *im = (impl){.kind = KIND_DENSE, .backend = o->backends[0]};
        snprintf(im->label, sizeof im->label, "%s dense", im->backend);
    }
    /* the loads alone, for dots whose inputs fit in L1 (32 KiB of the 48 KiB of Zen 5) */
    if (op == &DOT_OP && n * 8 <= 32768)
        ims[n_impls++] = (impl){.kind = KIND_ROOF, .label = "L1 loads"};
    /* the cost of the call alone, for dots short enough that it matters */
    if (op == &DOT_OP && n <= 128)
        ims[n_impls++] = (impl){.kind = KIND_CALL, .label = "empty call"};

    int failures = 0;
    for (size_t i = 0; i < n_impls; i++) {
        impl *im = &ims[i];
        im->checked_ok = check(im, &j);
        /* a wrong sdpa result fails the run; a peer outside sdpa's documented tolerance (the
           naive loop's and oneDNN's float sums drift on rows of millions) is flagged and timed */
        if (is_ours(im))
            failures += !im->checked_ok;
        else
            inaccurate_peers += !im->checked_ok;
        im->iters = o->smoke || o->cold ? 1 : (select_impl(im), calibrate(im, &j, o->min_ms));
    }
    const int warm_first =
        !o->cold && (o->max_threads > 1 || find_impl(ims, n_impls, KIND_F32, NULL, NULL) ||
                     find_impl(ims, n_impls, KIND_DENSE, NULL, NULL) ||
                     find_impl(ims, n_impls, KIND_OLD, NULL, NULL));
    for (int r = 0; r < o->reps; r++)
        for (size_t k = 0; k < n_impls; k++) {
            const size_t i = against && r % 2 && k < 2 ? 1 - k : k;
            select_impl(&ims[i]);
            /* an untimed call first, with threads or an f32 row: the rows before left the other
               cores idle, and a VM's idle vCPU can take milliseconds to be scheduled again, which
               a batch of one prefill call would count; and the row before read other arrays (an
               f32 row's K and V are not the 16-bit row's), so a batch of a few decode calls would
               count its own first pass from memory; every row gets the same, so ratios stay
               fair */
            if (warm_first) time_batch(&ims[i], &j, 1);
            if (o->cold) evict_caches();
            ims[i].ns[r] = time_batch(&ims[i], &j, ims[i].iters);
        }
    for (size_t i = 0; i < n_impls; i++) summarize(&ims[i], o->reps);
    print_rows(csv, &j, ims, n_impls, o->peers);
    fflush(stdout);

    peer_dnnl_softmax_destroy(j.dnnl);
    if (op->release) op->release(&j);
    free(j.a), free(j.b), free(j.x), free(j.y), free(j.ref), free(j.bound);
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

/* Pins to the first n CPUs of the affinity mask (for runs with threads); -1 on failure. */
static int pin_many(size_t n) {
    cpu_set_t have, set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof have, &have) != 0) return -1;
    size_t got = 0;
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE && got < n; c++)
        if (CPU_ISSET(c, &have)) {
            CPU_SET(c, &set);
            first = first < 0 ? c : first;
            got++;
        }
    if (got < n || sched_setaffinity(0, sizeof set, &set) != 0) return -1;
    return first;
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

#ifndef BENCH_COMPILER
#define BENCH_COMPILER "unknown compiler"
#endif
#ifndef BENCH_BUILD_FLAGS
#define BENCH_BUILD_FLAGS "unknown flags"
#endif

static void print_roofline(void) {
    if (!have_roof) {
        printf("roofline: not measured (--no-roofline or --smoke): roof%% is left empty\n");
        return;
    }
    printf("roofline (best of short runs at start-up): FMA peak (%s, independent chains) %.1f "
           "GFLOP/s",
           roof.fma_isa, roof.fma_gflops);
    if (roof.clock_ghz > 0)
        printf(" = %.1f FLOP/cycle at the measured core clock %.2f GHz",
               roof.fma_gflops / roof.clock_ghz, roof.clock_ghz);
    printf("\nroofline read bandwidth (%s loads):", roof.read_isa);
    for (int l = 0; l < ROOF_LEVELS; l++)
        printf(" %s %.0f GB/s (%zu KiB)%s", ROOF_LEVEL_NAMES[l], roof.read_gbytes_per_s[l],
               roof.probe_bytes[l] >> 10, l + 1 < ROOF_LEVELS ? ";" : "");
    printf("; DRAM in random 256-byte rows (a token table's keys, every line prefetched) %.1f GB/s",
           roof.rows_gbytes_per_s);
    printf("\nroofline levels: a row's working set lives in L1 up to %zu KiB, L2 up to %zu KiB, "
           "L3 up to %zu MiB, else DRAM (%s)\n",
           roof.level_bytes[ROOF_L1] >> 10, roof.level_bytes[ROOF_L2] >> 10,
           roof.level_bytes[ROOF_L3] >> 20, roof.level_source);
    printf("roof%%: the time the binding limit allows over the row's median: bytes moved / "
           "bandwidth of the level the working set lives in, or flops / FMA peak, whichever is "
           "longer (limit column); scale is counted by bytes only, softmax by bytes and its exp's "
           "FMA-pipe work\n");
}

int main(int argc, char **argv) {
    set_peer_environment(argc, argv);
    options o = options_parse(argc, argv);
    if (o.wall) bench_clock = CLOCK_MONOTONIC;
    if (o.against) against_load(o.against);
    int cpu;
    if (o.max_threads > 1) {
        cpu = pin_many(o.max_threads);
        bench_clock = CLOCK_MONOTONIC;
    } else {
        cpu = pin(o.cpu);
    }

    char model[128], date[32];
    cpu_model(model, sizeof model);
    time_t t = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&t));
    printf("sdpa %s benchmark, %s\n", sdpa_version(), date);
    if (o.max_threads > 1)
        printf("cpu: %s; pinned to %zu cores from core %d%s\n", model, o.max_threads, cpu,
               cpu < 0 ? " (pinning FAILED)" : "");
    else
        printf("cpu: %s; pinned to core %d%s\n", model, cpu, cpu < 0 ? " (pinning FAILED)" : "");
    printf("active backend (auto): %s; measured:", sdpa_backend());
    for (size_t i = 0; i < o.n_backends; i++) printf(" %s", o.backends[i]);
        /* the add-ons' variables, which change what a backend runs (sdpa info: whether in use) */
#define ADDON_ENV_(unused, name, kind, built, table, backend, requires, env, default_on,           \
                   description)                                                                    \
    printf("; %s of %s: %s=%s (default %s)", #name, #backend, env,                                 \
           getenv(env) && *getenv(env) ? getenv(env) : "unset",                                    \
           default_on < 0 ? "per CPU, sdpa info"                                                   \
           : default_on   ? "on"                                                                   \
                          : "off");
    SDPA_ADDONS(ADDON_ENV_, )
#undef ADDON_ENV_
    printf("\ncompiler: %s; flags: %s\nSLEEF %d.%d.%d\n", BENCH_COMPILER, BENCH_BUILD_FLAGS,
           SLEEF_VERSION_MAJOR, SLEEF_VERSION_MINOR, SLEEF_VERSION_PATCHLEVEL);
    if (o.peers) {
        const char *blas = peer_openblas_describe(), *dnnl = peer_dnnl_describe();
        printf("peer openblas: %s\n", blas ? blas : "not built in");
        printf("peer onednn: %s\n", dnnl ? dnnl : "not built in");
        printf("peer naive: C loops, %s\n", NAIVE_FLAGS);
    }
    if (bench_against)
        printf("against: %s, sdpa %s (its rows: \"old\", each taking turns with this "
               "library's row of the same backend to go first; vs old = the median over pairs of "
               "rounds of the geometric mean of old / new)\n",
               o.against, bench_against->version());
    printf("clock: %s\n", bench_clock == CLOCK_MONOTONIC
                              ? "wall (CLOCK_MONOTONIC)"
                              : "thread CPU time (CLOCK_THREAD_CPUTIME_ID; --wall for elapsed)");
    if (o.cold) evict_setup();
    printf("memory: %s\n", bench_uses_huge_pages()
                               ? "arrays of 2 MiB and more in 2 MiB pages (--huge-pages; madvise, "
                                 "where the kernel's transparent huge pages allow)"
                               : "the allocator's pages (--huge-pages for 2 MiB ones)");
    printf("method: %d rounds of batches >= %g ms each, round-robin over implementations%s%s; "
           "median ns per call, spread = min..max round vs median; vs X = X's median / this median "
           "(> 1: faster than X); inputs 64-byte aligned (a paged pool: --pool-offset bytes past a "
           "4 KiB page); ns/elem per element (scores: per key); "
           "softmax scale 1, scale alpha 0.125, scores scale 1/sqrt(d); \"L1 loads\": the dot's "
           "inputs read with the widest vectors and nothing else; softmax GFLOP/s counts FMA-pipe "
           "work (16 flop-equivalents per element: 8 two-pipe operations per vector in the avx512 "
           "and avx2 fast exp and normalize); attention: sdpa_mha (sdpa_mha_f32 for f32), exp "
           "fast, scale 1/sqrt(d), GFLOP/s counts 4 d flops per (query, key) pair computed "
           "(causal skips hidden pairs), ns/elem is per pair; its peer is OpenBLAS sgemm (sgemv) "
           "+ sdpa softmax + sgemm (sgemv); a 16-bit shape's \"f32\" row is sdpa_mha_f32 on the "
           "same values, in the same rounds, each of the group's rows then after one untimed "
           "call (vs f32: the 16-bit rows against it); a paged shape's \"dense\" row is sdpa_mha "
           "on its values laid out densely, likewise (vs dense: the paged row against it); "
           "backward: sdpa_mha_backward_f32 (dQ, dK, dV) after an untimed forward, f32, 10 d "
           "flops per pair computed (FlashAttention-2's count)\n",
           o.reps, o.smoke || o.cold ? 0.0 : o.min_ms,
           o.max_threads > 1 && !o.cold ? " (with --threads, each after one untimed call)" : "",
           o.cold ? " (--cold: one call a batch, each after an untimed read of a buffer twice the "
                    "largest cache, so that its inputs come from memory)"
                  : "");

    if (o.roofline) roof = roofline_measure(sdpa_backend()), have_roof = 1;
    print_roofline();

    FILE *csv = NULL;
    if (o.csv) {
        if (!(csv = fopen(o.csv, "w"))) {
            fprintf(stderr, "bench: cannot write %s\n", o.csv);
            return 2;
        }
        fprintf(csv, "op,d,n,size,impl,kind,backend,exp,ns_median,ns_min,ns_max,ns_per_elem,gflops,"
                     "gbytes_per_s,roof_percent,roof_limit,vs_scalar,vs_peer1,peer1,vs_peer2,"
                     "peer2,check\n");
    }

    int failures = 0;
    for (size_t k = 0; k < N_OPS; k++) {
        const op_def *op = OPS[k];
        if (!o.ops[k]) continue;
        print_header_row(op, o.peers);
        const size_t *sizes = o.n_sizes ? o.sizes : o.smoke ? op->smoke_sizes : op->sizes;
        if (op->shaped) /* sizes are shapes: --n does not apply */
            sizes = o.n_shapes ? o.shape_sizes : o.smoke ? op->smoke_sizes : op->sizes;
        const size_t *dims = op->dims[0] && o.n_dims ? o.dims : op->dims;
        static const size_t NO_DIM[] = {0, 0};
        if (!dims[0]) dims = NO_DIM;
        for (size_t di = 0; di == 0 || dims[di]; di++)
            for (size_t s = 0; s < MAX_SIZES && sizes[s]; s++) {
                /* the mixed batch is a paged call, which has no backward */
                if (op == &BACKWARD_OP && attention_shape_mixed(sizes[s])) continue;
                failures += bench_one(&o, op, sizes[s], dims[di], csv);
            }
    }
    if (csv) fclose(csv);
    char sleef[32];
    snprintf(sleef, sizeof sleef, "%d.%d.%d", SLEEF_VERSION_MAJOR, SLEEF_VERSION_MINOR,
             SLEEF_VERSION_PATCHLEVEL);
    bench_context ctx = {.date = date,
                         .cpu = model,
                         .backend = sdpa_backend(),
                         .compiler = BENCH_COMPILER,
                         .flags = BENCH_BUILD_FLAGS,
                         .sleef = sleef,
                         .openblas = o.peers ? peer_openblas_describe() : NULL,
                         .onednn = o.peers ? peer_dnnl_describe() : NULL,
                         .naive = o.peers ? NAIVE_FLAGS : NULL,
                         .clock = bench_clock == CLOCK_MONOTONIC ? "wall" : "thread cpu time",
                         .roof = have_roof ? &roof : NULL};
    if (o.json && write_json(o.json, &ctx) != 0) failures++;
    if (o.plot && write_plots(o.plot) != 0) failures++;
    if (inaccurate_peers)
        printf("\n%d peer results differ from the scalar backend beyond sdpa's documented "
               "tolerance (flagged INACCURATE; their times are still shown)\n",
               inaccurate_peers);
    if (failures)
        printf("\n%d sdpa results differ from the scalar backend beyond tolerance\n", failures);
    return failures ? 1 : 0;
}
