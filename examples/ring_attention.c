/* Context-parallel (ring) attention over MPI, built on sdpa's log-sum-exp output and merge.
 *
 * P ranks split one long sequence: each holds a shard of the rows of Q, K and V for every
 * (batch, head). In P steps every rank computes its query shard against one K/V shard with
 * sdpa_mha_f32 (desc.lse set), merges that partial into its running result with
 * sdpa_attention_merge_f32, and passes the K/V shard it holds to the next rank in the ring while
 * it computes. After the last step each rank holds the exact attention of its query rows over
 * the whole sequence. sdpa has no networking of its own: this file is all of it.
 *
 * Causal attention skips (query shard, key shard) pairs above the diagonal. With contiguous
 * shards that leaves rank r with r full blocks and half of one, and rank P - 1 bounds the run
 * (--bench prints the imbalance); the zigzag assignment (the ring-attention literature's load
 * balancing) gives rank r chunks r and 2P - 1 - r of 2P equal chunks, so that every rank does
 * the same work at every step.
 *
 * Build: mpicc examples/ring_attention.c $(pkg-config --cflags --libs sdpa) -lm, with an rpath
 * for a prefix the loader does not search (README, "Using sdpa in your build"); or meson:
 * examples/ring_attention, built when MPI is found.
 *   mpirun --oversubscribe -np 4 ring_attention --selftest
 *          every layout, head grouping and causal mode, each rank checking its rows against one
 *          process; --oversubscribe where the machine has fewer cores than ranks
 *   mpirun -np 2 ring_attention --bench --heads-q 8 --heads-kv 8 --len 8192 --d 128
 *          time per step, compute and communication
 *   ring_attention --single --threads 2 ...    the same problem in one process, for comparison
 * As root, Open MPI refuses to start unless OMPI_ALLOW_RUN_AS_ROOT=1 and
 * OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 are set. README, "Beyond one machine", has the loopback-only
 * flags the tests use and what changes across hosts. --help lists every option. */
/* clock_gettime and CLOCK_PROCESS_CPUTIME_ID under strict C11 */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sdpa.h"

/* sdpa.h's attention bound: |error| <= 1e-5 max|v| per output (for len_kv <= 4096, d_k <= 256,
   unit-normal inputs and the default scale) */
static double bound_attention(double max_abs_v) { return 1e-5 * max_abs_v; }

/* ---- Errors: every failure ends the whole job with a message, never a hang. ---- */

static int world_rank = 0;

static void die(const char *what, const char *detail) {
    fprintf(stderr, "ring_attention: rank %d: %s: %s\n", world_rank, what, detail);
    fflush(stderr);
    /* MPI_Abort kills every rank, so the others do not wait for a message that never comes */
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

static void check_mpi(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
    die(what, msg);
}

static void check_sdpa(sdpa_status st, const char *what) {
    if (st != SDPA_OK) die(what, sdpa_status_string(st));
}

static void *xmalloc(size_t n, const char *what) {
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory", what);
    return p;
}

/* ---- The problem ---- */

enum shard_kind { SHARD_CONTIGUOUS, SHARD_ZIGZAG };

typedef struct problem {
    size_t batch, heads_q, heads_kv, len, d_k, d_v; /* len: the whole sequence */
    int bshd;                                       /* layout: BSHD if 1, else BHSD */
    int causal;
    enum shard_kind shard;
    uint64_t seed;
} problem;

/* Rows of the sequence each rank holds, and which global row its local row i is. Zigzag cuts
 * the sequence into 2P chunks of c rows and gives rank r chunks r and 2P - 1 - r, in that order:
 * local order follows global order, so causal masking within a shard is plain SDPA_CAUSAL. */
typedef struct sharding {
    int rank, size;
    size_t rows; /* local rows per rank */
    size_t c;    /* zigzag chunk: rows / 2 */
} sharding;

static size_t global_row(const problem *p, const sharding *s, int rank, size_t i) {
    if (p->shard == SHARD_CONTIGUOUS) return (size_t)rank * s->rows + i;
    size_t chunk = i < s->c ? (size_t)rank : 2 * (size_t)s->size - 1 - (size_t)rank;
    return chunk * s->c + i % s->c;
}

/* A deterministic unit-normal value for element (tensor, b, h, t, col), whatever the layout and
 * whoever asks: every rank makes its own shard and, to check, the whole tensor. */
static uint64_t mix(uint64_t x) { /* splitmix64 */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static float normal_at(const problem *p, unsigned tensor, size_t b, size_t h, size_t t,
                       size_t col) {
    uint64_t key = mix(p->seed ^ tensor);
    key = mix(key ^ b);
    key = mix(key ^ h);
    key = mix(key ^ t);
    uint64_t x = mix(key ^ col);
    double u1 = ((double)(x >> 11) + 0.5) * 0x1p-53;
    double u2 = (double)(mix(x) >> 11) * 0x1p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* The descriptor of a [batch][heads][rows][...] problem in the chosen layout. Its strides also
 * describe any run of rows inside those tensors: a sub-view is a pointer offset and a length. */
static sdpa_mha_desc make_desc(const problem *p, size_t len_q, size_t len_kv, uint32_t flags) {
    sdpa_mha_desc d;
    sdpa_status st = p->bshd
                         ? sdpa_mha_desc_bshd(&d, p->batch, p->heads_q, p->heads_kv, len_q, len_kv,
                                              p->d_k, p->d_v, SDPA_DEFAULT_SCALE, flags)
                         : sdpa_mha_desc_dense(&d, p->batch, p->heads_q, p->heads_kv, len_q, len_kv,
                                               p->d_k, p->d_v, SDPA_DEFAULT_SCALE, flags);
    check_sdpa(st, "sdpa_mha_desc");
    return d;
}

/* Fills a view of `heads` heads and `rows` local rows with tensor `tensor`'s values;
 * rank < 0 means the whole sequence. */
static void fill(const problem *p, const sharding *s, int rank, unsigned tensor, float *x,
                 const size_t stride[3], size_t heads, size_t rows, size_t cols) {
    for (size_t b = 0; b < p->batch; b++)
        for (size_t h = 0; h < heads; h++)
            for (size_t i = 0; i < rows; i++) {
                size_t t = rank < 0 ? i : global_row(p, s, rank, i);
                float *row = x + b * stride[0] + h * stride[1] + i * stride[2];
                for (size_t c = 0; c < cols; c++) row[c] = normal_at(p, tensor, b, h, t, c);
            }
}

/* ---- One rank's state for the ring ---- */

typedef struct ring {
    const problem *p;
    sharding s;
    sdpa_mha_desc shard; /* len_q = len_kv = the local rows: the strides of every local view */
    float *q;
    float *kv_own;              /* this rank's K then V, in one buffer: one message a step */
    float *kv[2];               /* the shards passing through, in turn */
    size_t kv_floats;           /* floats in one such buffer */
    size_t v_offset;            /* where V starts in it */
    float *out, *lse;           /* the running result: out in q's layout, lse[b][h][row] */
    float *part_out, *part_lse; /* one step's partial */
    double *t_compute, *t_wait; /* seconds per step, wall clock */
    double *t_cpu;              /* seconds per step of the rank's CPU time, all its threads */
    int poll;                   /* MPI_Testall between a step's calls (--no-poll: 0) */
} ring;

/* Partial attention of local query rows [q0, q0 + nq) against key rows [k0, k0 + nk) of the K/V
 * shard in kv, into part_out/part_lse, then merged into out/lse. Computed one (batch, kv head)
 * at a time with MPI_Testall in between: Open MPI moves a large message in pieces, and only
 * while the program is inside an MPI call, so polling is what lets the transfer overlap the
 * compute. */
static void attend(ring *R, const float *kv, size_t q0, size_t nq, size_t k0, size_t nk,
                   uint32_t flags, int n_req, MPI_Request *req) {
    const problem *p = R->p;
    const sdpa_mha_desc *sh = &R->shard;
    size_t group = p->heads_q / p->heads_kv;
    sdpa_mha_desc d = *sh;
    d.batch = 1;
    d.heads_q = group;
    d.heads_kv = 1;
    d.len_q = nq;
    d.len_kv = nk;
    d.flags = flags;
    d.lse_stride[0] = p->heads_q * R->s.rows;
    d.lse_stride[1] = R->s.rows;
    const float *k = kv, *v = kv + R->v_offset;
    for (size_t b = 0; b < p->batch; b++)
        for (size_t g = 0; g < p->heads_kv; g++) {
            size_t h = g * group;
            size_t qo = b * sh->q_stride[0] + h * sh->q_stride[1] + q0 * sh->q_stride[2];
            size_t oo = b * sh->out_stride[0] + h * sh->out_stride[1] + q0 * sh->out_stride[2];
            size_t lo = b * d.lse_stride[0] + h * d.lse_stride[1] + q0;
            d.lse = R->part_lse + lo;
            check_sdpa(
                sdpa_mha_f32(&d, R->part_out + oo, R->q + qo,
                             k + b * sh->k_stride[0] + g * sh->k_stride[1] + k0 * sh->k_stride[2],
                             v + b * sh->v_stride[0] + g * sh->v_stride[1] + k0 * sh->v_stride[2]),
                "sdpa_mha_f32");
            for (size_t j = 0; j < group; j++)
                check_sdpa(sdpa_attention_merge_f32(R->out + oo + j * sh->out_stride[1],
                                                    R->lse + lo + j * R->s.rows,
                                                    R->part_out + oo + j * sh->out_stride[1],
                                                    R->part_lse + lo + j * R->s.rows, nq, p->d_v,
                                                    sh->out_stride[2], sh->out_stride[2]),
                           "sdpa_attention_merge_f32");
            if (n_req && R->poll) {
                int done;
                check_mpi(MPI_Testall(n_req, req, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
            }
        }
}

/* This rank's work against the K/V shard that rank src holds at the start. */
static void step_compute(ring *R, const float *kv, int src, int n_req, MPI_Request *req) {
    const problem *p = R->p;
    int r = R->s.rank;
    size_t n = R->s.rows, c = R->s.c;
    if (!p->causal) {
        attend(R, kv, 0, n, 0, n, 0, n_req, req);
    } else if (src == r) {
        /* the diagonal: local order is global order, in both shardings */
        attend(R, kv, 0, n, 0, n, SDPA_CAUSAL, n_req, req);
    } else if (p->shard == SHARD_CONTIGUOUS) {
        if (src < r) attend(R, kv, 0, n, 0, n, 0, n_req, req);
        /* src > r: every key is after every query: nothing to do */
    } else if (src < r) {
        /* zigzag: chunk src precedes both of ours, chunk 2P-1-src follows both */
        attend(R, kv, 0, n, 0, c, 0, n_req, req);
    } else {
        /* chunk r precedes both of src's; chunk 2P-1-r follows both */
        attend(R, kv, c, c, 0, n, 0, n_req, req);
    }
}

/* CPU time, not the wall clock: what the work costs, whatever else runs on the rank's core. */
static double cpu_seconds(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts)) return 0;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The ring: P steps. At step i this rank holds the K/V shard of rank (r - i) mod P. It posts
 * the receive of the next shard from the previous rank and the send of the one it holds to the
 * next rank, computes on the one it holds, then waits for both. The shard computed on is the
 * one being sent, so it is only read until its send completes; the rank's own shard stays in
 * its own buffer, so the ring can run again without refilling it. */
static void run_ring(ring *R) {
    const problem *p = R->p;
    int r = R->s.rank, P = R->s.size;
    int next = (r + 1) % P, prev = (r + P - 1) % P;
    size_t rows = p->batch * p->heads_q * R->s.rows;
    memset(R->out, 0, rows * p->d_v * sizeof(float));
    /* an lse of -inf is an empty part: the first merge takes the other part bit for bit */
    for (size_t i = 0; i < rows; i++) R->lse[i] = -INFINITY;
    const float *held = R->kv_own;
    for (int i = 0; i < P; i++) {
        MPI_Request req[2];
        int n_req = 0;
        float *incoming = R->kv[i % 2];
        if (i + 1 < P) {
            check_mpi(
                MPI_Irecv(incoming, (int)R->kv_floats, MPI_FLOAT, prev, i, MPI_COMM_WORLD, &req[0]),
                "MPI_Irecv");
            check_mpi(
                MPI_Isend(held, (int)R->kv_floats, MPI_FLOAT, next, i, MPI_COMM_WORLD, &req[1]),
                "MPI_Isend");
            n_req = 2;
        }
        double c0 = cpu_seconds(), t0 = MPI_Wtime();
        step_compute(R, held, (r - i + P) % P, n_req, req);
        double t1 = MPI_Wtime();
        R->t_cpu[i] = cpu_seconds() - c0;
        if (n_req) check_mpi(MPI_Waitall(n_req, req, MPI_STATUSES_IGNORE), "MPI_Waitall");
        R->t_compute[i] = t1 - t0;
        R->t_wait[i] = MPI_Wtime() - t1;
        held = incoming;
    }
}

static int no_poll; /* --no-poll */

static void ring_init(ring *R, const problem *p, int rank, int size) {
    memset(R, 0, sizeof *R);
    R->p = p;
    R->s.rank = rank;
    R->s.size = size;
    R->poll = !no_poll;
    size_t parts = p->shard == SHARD_ZIGZAG ? 2 * (size_t)size : (size_t)size;
    if (p->len == 0 || p->len % parts)
        die("bad --len", p->shard == SHARD_ZIGZAG
                             ? "zigzag needs a length divisible by twice the number of ranks"
                             : "contiguous shards need a length divisible by the number of ranks");
    R->s.rows = p->len / (size_t)size;
    R->s.c = R->s.rows / 2;
    R->shard = make_desc(p, R->s.rows, R->s.rows, 0);
    size_t n = R->s.rows;
    size_t q_floats = p->batch * p->heads_q * n * p->d_k;
    size_t out_floats = p->batch * p->heads_q * n * p->d_v;
    R->v_offset = p->batch * p->heads_kv * n * p->d_k;
    R->kv_floats = R->v_offset + p->batch * p->heads_kv * n * p->d_v;
    /* MPI counts are ints */
    if (R->kv_floats > INT_MAX) die("bad size", "a K/V shard over 2^31 floats: use more ranks");
    R->q = xmalloc(q_floats * sizeof(float), "q");
    R->kv_own = xmalloc(R->kv_floats * sizeof(float), "k/v");
    for (int i = 0; i < 2; i++) R->kv[i] = xmalloc(R->kv_floats * sizeof(float), "k/v");
    R->out = xmalloc(out_floats * sizeof(float), "out");
    R->part_out = xmalloc(out_floats * sizeof(float), "out");
    R->lse = xmalloc(p->batch * p->heads_q * n * sizeof(float), "lse");
    R->part_lse = xmalloc(p->batch * p->heads_q * n * sizeof(float), "lse");
    R->t_compute = xmalloc((size_t)size * sizeof(double), "times");
    R->t_wait = xmalloc((size_t)size * sizeof(double), "times");
    R->t_cpu = xmalloc((size_t)size * sizeof(double), "times");
    fill(p, &R->s, rank, 0, R->q, R->shard.q_stride, p->heads_q, n, p->d_k);
    fill(p, &R->s, rank, 1, R->kv_own, R->shard.k_stride, p->heads_kv, n, p->d_k);
    fill(p, &R->s, rank, 2, R->kv_own + R->v_offset, R->shard.v_stride, p->heads_kv, n, p->d_v);
}

static void ring_free(ring *R) {
    free(R->q);
    free(R->kv_own);
    free(R->kv[0]);
    free(R->kv[1]);
    free(R->out);
    free(R->part_out);
    free(R->lse);
    free(R->part_lse);
    free(R->t_compute);
    free(R->t_wait);
    free(R->t_cpu);
}

/* ---- Checking: every rank against one process's sdpa_mha_f32 of the whole problem ---- */

/* Each result is within bound_attention of the exact attention (sdpa.h: merging the parts of a
 * split keeps the unsplit bound), so the two are within twice that of each other. */
static double check_rows(const ring *R, double *max_err_out) {
    const problem *p = R->p;
    sdpa_mha_desc full = make_desc(p, p->len, p->len, p->causal ? SDPA_CAUSAL : 0);
    size_t nq = p->batch * p->heads_q * p->len * p->d_k;
    size_t nk = p->batch * p->heads_kv * p->len * p->d_k;
    size_t nv = p->batch * p->heads_kv * p->len * p->d_v;
    size_t no = p->batch * p->heads_q * p->len * p->d_v;
    float *q = xmalloc(nq * sizeof(float), "q"), *k = xmalloc(nk * sizeof(float), "k");
    float *v = xmalloc(nv * sizeof(float), "v"), *out = xmalloc(no * sizeof(float), "out");
    fill(p, &R->s, -1, 0, q, full.q_stride, p->heads_q, p->len, p->d_k);
    fill(p, &R->s, -1, 1, k, full.k_stride, p->heads_kv, p->len, p->d_k);
    fill(p, &R->s, -1, 2, v, full.v_stride, p->heads_kv, p->len, p->d_v);
    check_sdpa(sdpa_mha_f32(&full, out, q, k, v), "sdpa_mha_f32 (whole problem)");
    double max_v = 0;
    for (size_t i = 0; i < nv; i++) max_v = fmax(max_v, fabs(v[i]));
    double max_err = 0;
    const size_t *os = R->shard.out_stride, *fs = full.out_stride;
    for (size_t b = 0; b < p->batch; b++)
        for (size_t h = 0; h < p->heads_q; h++)
            for (size_t i = 0; i < R->s.rows; i++) {
                size_t t = global_row(p, &R->s, R->s.rank, i);
                const float *mine = R->out + b * os[0] + h * os[1] + i * os[2];
                const float *ref = out + b * fs[0] + h * fs[1] + t * fs[2];
                for (size_t c = 0; c < p->d_v; c++) {
                    double e = fabs((double)mine[c] - (double)ref[c]);
                    /* NaN fails too */
                    if (!(e <= max_err)) max_err = isnan(e) ? INFINITY : e;
                }
            }
    free(q);
    free(k);
    free(v);
    free(out);
    *max_err_out = max_err;
    return 2.0 * bound_attention(max_v);
}

/* sharded: name the sharding too (not for the one-process run) */
static const char *problem_name(const problem *p, int sharded, char *buf, size_t n) {
    snprintf(buf, n, "batch %zu, heads %zu/%zu, len %zu, d %zu/%zu, %s, %s", p->batch, p->heads_q,
             p->heads_kv, p->len, p->d_k, p->d_v, p->bshd ? "bshd" : "bhsd",
             !p->causal                 ? "full"
             : !sharded                 ? "causal"
             : p->shard == SHARD_ZIGZAG ? "causal zigzag"
                                        : "causal contiguous");
    return buf;
}

/* Runs the ring on p and checks every rank's rows; returns 1 if all ranks passed. */
static int ring_check(const problem *p, int rank, int size, int verbose) {
    ring R;
    ring_init(&R, p, rank, size);
    run_ring(&R);
    double err, bound = check_rows(&R, &err);
    double worst[2] = {err / bound, err}, all[2];
    check_mpi(MPI_Allreduce(worst, all, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
    int ok = all[0] <= 1.0;
    if (rank == 0 && (verbose || !ok)) {
        char name[160];
        printf("%s  P=%d %s: max |error| %.3g, %.3f of the bound\n", ok ? "ok  " : "FAIL", size,
               problem_name(p, 1, name, sizeof name), all[1], all[0]);
    }
    ring_free(&R);
    return ok;
}

/* Every layout, head grouping and causal mode on a small problem with ragged block tails. */
static int selftest(uint64_t seed, int rank, int size) {
    static const size_t heads[][2] = {{4, 4}, {4, 2}, {3, 1}};
    int failed = 0, n = 0;
    for (int bshd = 0; bshd < 2; bshd++)
        for (size_t hg = 0; hg < sizeof heads / sizeof heads[0]; hg++)
            for (int mode = 0; mode < 3; mode++) {
                /* 19-row zigzag chunks: shards of 38 rows, one block of 32 and a tail */
                problem p = {.batch = 2,
                             .heads_q = heads[hg][0],
                             .heads_kv = heads[hg][1],
                             .len = 38 * (size_t)size,
                             .d_k = 40,
                             .d_v = 24,
                             .bshd = bshd,
                             .causal = mode > 0,
                             .shard = mode == 2 ? SHARD_ZIGZAG : SHARD_CONTIGUOUS,
                             .seed = seed + (uint64_t)n};
                failed += !ring_check(&p, rank, size, 1);
                n++;
            }
    if (rank == 0)
        printf("%d of %d cases within the bound on %d rank%s\n", n - failed, n, size,
               size == 1 ? "" : "s");
    return failed == 0;
}

/* ---- Timing ---- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* 2 (d_k + d_v) flops per (query, key) pair computed */
static double gflop(const problem *p) {
    double n = (double)p->len;
    double pairs = p->causal ? n * (n + 1) / 2 : n * n;
    return pairs * (double)(p->batch * p->heads_q) * 2.0 * (double)(p->d_k + p->d_v) * 1e-9;
}

/* Per step and rank, the run with the median total: compute (wall), its CPU time, wait. */
enum { STEP_VALUES = 3 };

static void bench(const problem *p, int reps, int rank, int size) {
    ring R;
    ring_init(&R, p, rank, size);
    size_t per_run = STEP_VALUES * (size_t)size;
    double *total = xmalloc((size_t)reps * sizeof(double), "times");
    double *cpu = xmalloc((size_t)reps * sizeof(double), "times");
    double *steps = xmalloc((size_t)reps * per_run * sizeof(double), "times");
    for (int rep = 0; rep < reps; rep++) {
        check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
        double c0 = cpu_seconds(), t0 = MPI_Wtime();
        run_ring(&R);
        double t = MPI_Wtime() - t0, c = cpu_seconds() - c0;
        /* the run ends when the slowest rank does; its cost is every rank's CPU time */
        check_mpi(MPI_Allreduce(&t, &total[rep], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD),
                  "MPI_Allreduce");
        check_mpi(MPI_Allreduce(&c, &cpu[rep], 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD),
                  "MPI_Allreduce");
        for (int i = 0; i < size; i++) {
            double *x = steps + (size_t)rep * per_run + STEP_VALUES * (size_t)i;
            x[0] = R.t_compute[i];
            x[1] = R.t_cpu[i];
            x[2] = R.t_wait[i];
        }
    }
    double *sorted = xmalloc((size_t)reps * sizeof(double), "times");
    memcpy(sorted, total, (size_t)reps * sizeof(double));
    double med = median(sorted, reps);
    int pick = 0;
    for (int rep = 0; rep < reps; rep++)
        if (fabs(total[rep] - med) < fabs(total[pick] - med)) pick = rep;
    double *all = rank == 0 ? xmalloc(per_run * (size_t)size * sizeof(double), "times") : NULL;
    check_mpi(MPI_Gather(steps + (size_t)pick * per_run, (int)per_run, MPI_DOUBLE, all,
                         (int)per_run, MPI_DOUBLE, 0, MPI_COMM_WORLD),
              "MPI_Gather");

    /* The transfer alone: one shift of a K/V shard round the ring, nothing computed. */
    enum { SHIFTS = 5 };
    double shift[SHIFTS];
    for (int i = 0; i < SHIFTS && size > 1; i++) {
        MPI_Request req[2];
        check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
        double t0 = MPI_Wtime();
        check_mpi(MPI_Irecv(R.kv[0], (int)R.kv_floats, MPI_FLOAT, (rank + size - 1) % size, 0,
                            MPI_COMM_WORLD, &req[0]),
                  "MPI_Irecv");
        check_mpi(MPI_Isend(R.kv_own, (int)R.kv_floats, MPI_FLOAT, (rank + 1) % size, 0,
                            MPI_COMM_WORLD, &req[1]),
                  "MPI_Isend");
        check_mpi(MPI_Waitall(2, req, MPI_STATUSES_IGNORE), "MPI_Waitall");
        double t = MPI_Wtime() - t0;
        check_mpi(MPI_Allreduce(&t, &shift[i], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD),
                  "MPI_Allreduce");
    }

    if (rank == 0) {
        char name[160];
        printf("ring attention, P = %d ranks, %zu threads each, backend %s\n", size,
               sdpa_num_threads(), sdpa_backend());
        printf("%s; %zu rows a rank\n", problem_name(p, 1, name, sizeof name), R.s.rows);
        printf("step  rank  compute ms  (cpu ms)  wait ms   (the run with the median total)\n");
        double sum[STEP_VALUES] = {0}, max_cpu = 0;
        for (int i = 0; i < size; i++)
            for (int j = 0; j < size; j++) {
                const double *x = all + (size_t)j * per_run + STEP_VALUES * (size_t)i;
                printf("%4d  %4d  %10.2f  %8.2f  %7.2f\n", i, j, x[0] * 1e3, x[1] * 1e3,
                       x[2] * 1e3);
                for (int k = 0; k < STEP_VALUES; k++) sum[k] += x[k];
            }
        for (int j = 0; j < size; j++) {
            double c = 0, cpu = 0;
            for (int i = 0; i < size; i++) {
                c += all[(size_t)j * per_run + STEP_VALUES * (size_t)i];
                cpu += all[(size_t)j * per_run + STEP_VALUES * (size_t)i + 1];
            }
            max_cpu = fmax(max_cpu, cpu);
            printf("rank %d: compute %.2f ms (cpu %.2f) in all\n", j, c * 1e3, cpu * 1e3);
        }
        double steps_all = (double)size * size;
        printf("a step, mean over steps and ranks: compute %.2f ms (cpu %.2f), wait %.2f ms\n",
               sum[0] / steps_all * 1e3, sum[1] / steps_all * 1e3, sum[2] / steps_all * 1e3);
        /* CPU time, so that a neighbour's job on one rank's core does not pass for imbalance */
        printf("imbalance: busiest rank's cpu / mean rank's cpu %.3f\n", max_cpu / (sum[1] / size));
        printf("whole run: median %.2f ms of %d (min %.2f), %.1f GFLOP/s; cpu, all ranks, "
               "median %.2f ms\n",
               med * 1e3, reps, sorted[0] * 1e3, gflop(p) / med, median(cpu, reps) * 1e3);
        if (size > 1)
            printf("one K/V shift alone (%.1f MB a rank): median %.2f ms of %d, %.2f GB/s a rank\n",
                   (double)R.kv_floats * 4e-6, median(shift, SHIFTS) * 1e3, SHIFTS,
                   (double)R.kv_floats * 4e-9 / median(shift, SHIFTS));
    }
    free(all);
    free(sorted);
    free(steps);
    free(total);
    free(cpu);
    ring_free(&R);
}

/* The same problem in one process, one sdpa_mha_f32 call: the baseline the ring must beat. */
static void single(const problem *p, int reps) {
    sdpa_mha_desc d = make_desc(p, p->len, p->len, p->causal ? SDPA_CAUSAL : 0);
    size_t nq = p->batch * p->heads_q * p->len * p->d_k;
    size_t nk = p->batch * p->heads_kv * p->len * p->d_k;
    size_t nv = p->batch * p->heads_kv * p->len * p->d_v;
    size_t no = p->batch * p->heads_q * p->len * p->d_v;
    sharding s = {0};
    float *q = xmalloc(nq * sizeof(float), "q"), *k = xmalloc(nk * sizeof(float), "k");
    float *v = xmalloc(nv * sizeof(float), "v"), *out = xmalloc(no * sizeof(float), "out");
    fill(p, &s, -1, 0, q, d.q_stride, p->heads_q, p->len, p->d_k);
    fill(p, &s, -1, 1, k, d.k_stride, p->heads_kv, p->len, p->d_k);
    fill(p, &s, -1, 2, v, d.v_stride, p->heads_kv, p->len, p->d_v);
    double *t = xmalloc(2 * (size_t)reps * sizeof(double), "times"), *cpu = t + reps;
    for (int rep = 0; rep < reps; rep++) {
        double c0 = cpu_seconds(), t0 = MPI_Wtime();
        check_sdpa(sdpa_mha_f32(&d, out, q, k, v), "sdpa_mha_f32");
        t[rep] = MPI_Wtime() - t0;
        cpu[rep] = cpu_seconds() - c0;
    }
    double med = median(t, reps);
    char name[160];
    printf("one process, %zu threads, backend %s\n%s\n", sdpa_num_threads(), sdpa_backend(),
           problem_name(p, 0, name, sizeof name));
    printf("whole run: median %.2f ms of %d (min %.2f), %.1f GFLOP/s; cpu, all threads, median "
           "%.2f ms\n",
           med * 1e3, reps, t[0] * 1e3, gflop(p) / med, median(cpu, reps) * 1e3);
    free(t);
    free(q);
    free(k);
    free(v);
    free(out);
}

/* ---- Options ---- */

static void usage(void) {
    printf("usage: mpirun -np P ring_attention [mode] [options]\n"
           "modes (default: check the problem the options give):\n"
           "  --selftest        every layout, head grouping and causal mode on a small problem\n"
           "  --bench           time the ring: each step's compute and wait, the whole run, and\n"
           "                    one K/V transfer alone\n"
           "  --single          time the problem in one process (run with -np 1), for comparison\n"
           "options:\n"
           "  --batch B --heads-q H --heads-kv G --len N --d D (or --d-k, --d-v)\n"
           "                    the whole problem (default 1, 8, 8, 1024, 64)\n"
           "  --layout bhsd|bshd  tensor layout (default bhsd)\n"
           "  --causal          causal mask\n"
           "  --shard contiguous|zigzag  how the sequence is split (default contiguous;\n"
           "                    zigzag balances causal work, and needs N divisible by 2P)\n"
           "  --threads T       sdpa threads per rank (default: the library's, the CPUs a rank\n"
           "                    may run on)\n"
           "  --no-poll         no MPI_Testall between a step's sdpa calls: the transfer then\n"
           "                    waits for the end of the step's compute\n"
           "  --reps R          timed runs (default 5)\n"
           "  --seed S          inputs' seed (default 1)\n");
}

static size_t parse_size(const char *opt, const char *arg) {
    char *end;
    if (!arg) die(opt, "needs a value");
    unsigned long long v = strtoull(arg, &end, 10);
    if (*arg == '-' || *end || end == arg) die(opt, "not a count");
    return (size_t)v;
}

int main(int argc, char **argv) {
    int provided;
    /* sdpa's own threads never call MPI: the main thread is the only one that does */
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "ring_attention: MPI_Init_thread failed\n");
        return 1;
    }
    /* errors come back as codes, so that check_mpi can say which call failed */
    check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN),
              "MPI_Comm_set_errhandler");
    if (provided < MPI_THREAD_FUNNELED) die("MPI_Init_thread", "no MPI_THREAD_FUNNELED");
    int size;
    check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");

    problem p = {
        .batch = 1, .heads_q = 8, .heads_kv = 8, .len = 1024, .d_k = 64, .d_v = 64, .seed = 1};
    enum { CHECK, SELFTEST, BENCH, SINGLE } mode = CHECK;
    int reps = 5;
    size_t threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            if (world_rank == 0) usage();
            check_mpi(MPI_Finalize(), "MPI_Finalize");
            return 0;
        } else if (!strcmp(a, "--selftest"))
            mode = SELFTEST;
        else if (!strcmp(a, "--bench"))
            mode = BENCH;
        else if (!strcmp(a, "--single"))
            mode = SINGLE;
        else if (!strcmp(a, "--causal"))
            p.causal = 1;
        else if (!strcmp(a, "--no-poll"))
            no_poll = 1;
        else if (!strcmp(a, "--batch"))
            p.batch = parse_size(a, next), i++;
        else if (!strcmp(a, "--heads-q"))
            p.heads_q = parse_size(a, next), i++;
        else if (!strcmp(a, "--heads-kv"))
            p.heads_kv = parse_size(a, next), i++;
        else if (!strcmp(a, "--len"))
            p.len = parse_size(a, next), i++;
        else if (!strcmp(a, "--d"))
            p.d_k = p.d_v = parse_size(a, next), i++;
        else if (!strcmp(a, "--d-k"))
            p.d_k = parse_size(a, next), i++;
        else if (!strcmp(a, "--d-v"))
            p.d_v = parse_size(a, next), i++;
        else if (!strcmp(a, "--threads"))
            threads = parse_size(a, next), i++;
        else if (!strcmp(a, "--reps"))
            reps = (int)parse_size(a, next), i++;
        else if (!strcmp(a, "--seed"))
            p.seed = parse_size(a, next), i++;
        else if (!strcmp(a, "--layout") && next && !strcmp(next, "bhsd"))
            p.bshd = 0, i++;
        else if (!strcmp(a, "--layout") && next && !strcmp(next, "bshd"))
            p.bshd = 1, i++;
        else if (!strcmp(a, "--shard") && next && !strcmp(next, "contiguous"))
            p.shard = SHARD_CONTIGUOUS, i++;
        else if (!strcmp(a, "--shard") && next && !strcmp(next, "zigzag"))
            p.shard = SHARD_ZIGZAG, i++;
        else
            die("unknown option or value (--help lists them)", a);
    }
    if (reps < 1 || reps > 1000) die("--reps", "must be 1 to 1000");
    if (!p.batch || !p.heads_q || !p.heads_kv || !p.d_k || !p.d_v || p.heads_q % p.heads_kv)
        die("bad problem", "sizes must be non-zero and heads-kv must divide heads-q");
    check_sdpa(sdpa_set_num_threads(threads), "sdpa_set_num_threads");

    int ok = 1;
    if (mode == SELFTEST)
        ok = selftest(p.seed, world_rank, size);
    else if (mode == CHECK)
        ok = ring_check(&p, world_rank, size, 1);
    else if (mode == BENCH)
        bench(&p, reps, world_rank, size);
    else if (size != 1)
        die("--single", "runs in one process: mpirun -np 1, or no mpirun");
    else
        single(&p, reps);
    check_mpi(MPI_Finalize(), "MPI_Finalize");
    return ok ? 0 : 1;
}
