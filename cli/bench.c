/* sdpa bench: a quick timing of dot, softmax, the fused attention (f32, and over f16 and bf16
 * K/V) and its backward pass on every backend this CPU runs, with the speedup over scalar. The
 * full benchmark is bench/. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct bench_data {
    size_t n;
    float *a, *b, *y;
    /* attention, fused: len_q x len_kv, d_k = d_v = d */
    size_t lq, lkv, d;
    uint32_t flags;
    sdpa_dtype kv_type; /* f32: sdpa_attention_f32 over k, v; else sdpa_mha over k16, v16 */
    float *q, *k, *v, *out;
    uint16_t *k16, *v16;
    /* backward: the upstream gradient, the forward's lse, the gradients */
    float *dout, *lse, *dq, *dk, *dv;
} bench_data;

enum { KERNEL_DOT, KERNEL_SOFTMAX, KERNEL_ATTENTION, KERNEL_BACKWARD };
static const char *const KERNEL_NAMES[] = {"dot", "softmax", "attention", "backward"};

/* One dense head of bd's shape, with lse, and its gradients' views. */
static void backward_views(const bench_data *bd, sdpa_mha_desc *desc, sdpa_mha_grads *g) {
    api->mha_desc_dense(desc, 1, 1, 1, bd->lq, bd->lkv, bd->d, bd->d, SDPA_DEFAULT_SCALE,
                        bd->flags);
    desc->lse = bd->lse;
    desc->lse_stride[0] = desc->lse_stride[1] = bd->lq;
    memset(g, 0, sizeof *g);
    g->struct_size = sizeof *g;
    g->dq = bd->dq, g->dk = bd->dk, g->dv = bd->dv, g->dout = bd->dout;
    memcpy(g->dq_stride, desc->q_stride, sizeof g->dq_stride);
    memcpy(g->dk_stride, desc->k_stride, sizeof g->dk_stride);
    memcpy(g->dv_stride, desc->v_stride, sizeof g->dv_stride);
    memcpy(g->dout_stride, desc->out_stride, sizeof g->dout_stride);
}

static void run_once(int kernel, bench_data *bd) {
    float r;
    switch (kernel) {
    case KERNEL_DOT: api->dot_f32(bd->a, bd->b, bd->n, &r); break;
    case KERNEL_SOFTMAX: api->softmax_f32(bd->y, bd->a, bd->n, 0.125f); break;
    case KERNEL_ATTENTION:
        if (bd->kv_type == SDPA_F32) {
            api->attention_f32(bd->out, bd->q, bd->k, bd->v, bd->lq, bd->lkv, bd->d, bd->d,
                               SDPA_DEFAULT_SCALE, bd->flags);
        } else {
            sdpa_mha_desc desc;
            api->mha_desc_dense(&desc, 1, 1, 1, bd->lq, bd->lkv, bd->d, bd->d, SDPA_DEFAULT_SCALE,
                                bd->flags);
            desc.kv_type = bd->kv_type;
            api->mha(&desc, bd->out, bd->q, bd->k16, bd->v16);
        }
        break;
    case KERNEL_BACKWARD: {
        sdpa_mha_desc desc;
        sdpa_mha_grads g;
        backward_views(bd, &desc, &g);
        api->mha_backward_f32(&desc, &g, bd->q, bd->k, bd->v, bd->out);
        break;
    }
    }
}

/* Best time of 5 runs of enough calls for about 4 ms each, in nanoseconds per call. */
static double time_kernel(int kernel, bench_data *bd) {
    long calls = 1;
    for (;;) {
        double t0 = now_seconds();
        for (long i = 0; i < calls; i++) run_once(kernel, bd);
        double dt = now_seconds() - t0;
        if (dt > 0.004 || calls > (1L << 24)) break;
        calls *= dt > 0.0005 ? (long)(0.004 / dt) + 1 : 8;
    }
    double best = INFINITY;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_seconds();
        for (long i = 0; i < calls; i++) run_once(kernel, bd);
        double dt = (now_seconds() - t0) / (double)calls;
        best = dt < best ? dt : best;
    }
    return best * 1e9;
}

/* One row of the table: a kernel at a size (an attention shape in the benchdnn style). */
typedef struct bench_row {
    int kernel;
    size_t n, lq, lkv, d;
    uint32_t flags;
    sdpa_dtype kv_type;
    char label[32];
} bench_row;

static double row_flops(const bench_row *row) {
    if (row->kernel == KERNEL_DOT) return 2.0 * (double)row->n;
    if (row->kernel == KERNEL_SOFTMAX) return 0; /* not a flop-bound kernel: ns/element */
    double pairs = (double)row->lq * (double)row->lkv;
    if (row->flags & SDPA_CAUSAL) pairs = (double)row->lq * ((double)row->lq + 1) / 2;
    /* Q K^T and P V; the backward's five products (FlashAttention-2's count) */
    return (row->kernel == KERNEL_BACKWARD ? 10.0 : 4.0) * pairs * (double)row->d;
}

int cmd_bench(int json) {
    static const size_t SIZES[] = {256, 4096, 65536};
    static const struct {
        int kernel;
        size_t lq, lkv, d;
        uint32_t flags;
        sdpa_dtype kv_type;
    } SHAPES[] = {{KERNEL_ATTENTION, 1, 4096, 128, 0, SDPA_F32},
                  {KERNEL_ATTENTION, 1, 4096, 128, 0, SDPA_F16},
                  {KERNEL_ATTENTION, 1, 4096, 128, 0, SDPA_BF16},
                  {KERNEL_ATTENTION, 256, 256, 64, 0, SDPA_F32},
                  {KERNEL_ATTENTION, 256, 256, 64, SDPA_CAUSAL, SDPA_F32},
                  {KERNEL_BACKWARD, 256, 256, 64, 0, SDPA_F32},
                  {KERNEL_BACKWARD, 256, 256, 64, SDPA_CAUSAL, SDPA_F32}};
    static const char *const TYPE_TAGS[] = {"", " kvf16", " kvbf16"};
    enum {
        N_SIZES = 3,
        N_SHAPES = 7,
        ROWS = 2 * N_SIZES + N_SHAPES,
        QMAX = 256 * 128,
        KMAX = 4096 * 128
    };
    size_t n_max = SIZES[N_SIZES - 1];
    if (!SDPA_API_HAS(api, attention_f32)) {
        fprintf(stderr, "sdpa bench: this library has no attention_f32\n");
        return 1;
    }
    bench_data bd = {.a = malloc(n_max * 4),
                     .b = malloc(n_max * 4),
                     .y = malloc(n_max * 4),
                     .q = malloc(QMAX * 4),
                     .k = malloc(KMAX * 4),
                     .v = malloc(KMAX * 4),
                     .out = malloc(QMAX * 4),
                     .k16 = malloc(KMAX * 2),
                     .v16 = malloc(KMAX * 2),
                     .dout = malloc(QMAX * 4),
                     .lse = malloc(256 * 4),
                     .dq = malloc(QMAX * 4),
                     .dk = malloc(KMAX * 4),
                     .dv = malloc(KMAX * 4)};
    int status = 0;
    if (!bd.a || !bd.b || !bd.y || !bd.q || !bd.k || !bd.v || !bd.out || !bd.k16 || !bd.v16 ||
        !bd.dout || !bd.lse || !bd.dq || !bd.dk || !bd.dv) {
        fprintf(stderr, "sdpa bench: out of memory\n");
        status = 1;
        goto done;
    }
    rng r = rng_seed(1);
    fill(&r, bd.a, n_max, -1, 1);
    fill(&r, bd.b, n_max, -1, 1);
    fill(&r, bd.q, QMAX, -1, 1);
    fill(&r, bd.k, KMAX, -1, 1);
    fill(&r, bd.v, KMAX, -1, 1);
    fill(&r, bd.dout, QMAX, -1, 1);
    /* a library without the 16-bit types times f32 rows only; one without the backward, no
       backward rows */
    const int typed = SDPA_API_HAS(api, mha) && SDPA_API_HAS(api, convert);
    const int backward = SDPA_API_HAS(api, mha_backward_f32);

    bench_row rows[ROWS];
    int n_rows = 0;
    for (int i = 0; i < ROWS; i++) {
        bench_row *row = &rows[n_rows];
        memset(row, 0, sizeof *row);
        if (i < 2 * N_SIZES) {
            row->kernel = i / N_SIZES;
            row->n = SIZES[i % N_SIZES];
            snprintf(row->label, sizeof row->label, "n=%zu", row->n);
        } else {
            int sh = i - 2 * N_SIZES;
            row->kernel = SHAPES[sh].kernel;
            row->lq = SHAPES[sh].lq;
            row->lkv = SHAPES[sh].lkv;
            row->d = SHAPES[sh].d;
            row->flags = SHAPES[sh].flags;
            row->kv_type = SHAPES[sh].kv_type;
            if ((row->kv_type != SDPA_F32 && !typed) ||
                (row->kernel == KERNEL_BACKWARD && !backward))
                continue;
            snprintf(row->label, sizeof row->label, "q%zuk%zud%zu%s%s", row->lq, row->lkv, row->d,
                     row->flags & SDPA_CAUSAL ? " causal" : "", TYPE_TAGS[row->kv_type]);
        }
        n_rows++;
    }

    char initial[32];
    snprintf(initial, sizeof initial, "%s", api->backend());
    const char *names[MAX_BACKENDS];
    size_t n_backends = 0;
    for (size_t i = 0; api->backend_name(i) && n_backends < MAX_BACKENDS; i++)
        if (api->backend_supported(api->backend_name(i)))
            names[n_backends++] = api->backend_name(i);

    double ns[ROWS][MAX_BACKENDS];
    for (size_t b = 0; b < n_backends; b++) {
        api->set_backend(names[b]);
        for (int i = 0; i < n_rows; i++) {
            bd.n = rows[i].n;
            bd.lq = rows[i].lq;
            bd.lkv = rows[i].lkv;
            bd.d = rows[i].d;
            bd.flags = rows[i].flags;
            bd.kv_type = rows[i].kv_type;
            if (bd.kv_type != SDPA_F32) { /* the same values as the f32 rows, rounded */
                api->convert(bd.k16, bd.kv_type, bd.k, SDPA_F32, KMAX);
                api->convert(bd.v16, bd.kv_type, bd.v, SDPA_F32, KMAX);
            }
            if (rows[i].kernel == KERNEL_BACKWARD) { /* the forward's out and lse, untimed */
                sdpa_mha_desc desc;
                sdpa_mha_grads g;
                backward_views(&bd, &desc, &g);
                api->mha_f32(&desc, bd.out, bd.q, bd.k, bd.v);
            }
            ns[i][b] = time_kernel(rows[i].kernel, &bd);
        }
    }
    api->set_backend(initial);
    size_t scalar = 0;
    for (size_t b = 0; b < n_backends; b++)
        if (strcmp(names[b], "scalar") == 0) scalar = b;

    if (json) {
        printf("{\n  \"library_version\": ");
        json_string(api->version());
        printf(",\n  \"backends\": [");
        for (size_t b = 0; b < n_backends; b++) {
            printf("%s", b ? ", " : "");
            json_string(names[b]);
        }
        printf("],\n  \"results\": [\n");
        for (int i = 0; i < n_rows; i++) {
            const bench_row *row = &rows[i];
            for (size_t b = 0; b < n_backends; b++) {
                printf("    {\"kernel\": \"%s\", ", KERNEL_NAMES[row->kernel]);
                if (row->kernel >= KERNEL_ATTENTION)
                    printf("\"len_q\": %zu, \"len_kv\": %zu, \"d\": %zu, \"causal\": %s, "
                           "\"kv_type\": \"%s\", ",
                           row->lq, row->lkv, row->d, row->flags & SDPA_CAUSAL ? "true" : "false",
                           row->kv_type == SDPA_F32   ? "f32"
                           : row->kv_type == SDPA_F16 ? "f16"
                                                      : "bf16");
                else
                    printf("\"n\": %zu, ", row->n);
                printf("\"backend\": \"%s\", \"ns_per_call\": %.1f, ", names[b], ns[i][b]);
                if (row_flops(row) > 0) printf("\"gflops\": %.2f, ", row_flops(row) / ns[i][b]);
                printf("\"speedup_vs_scalar\": %.3f}%s\n", ns[i][scalar] / ns[i][b],
                       i + 1 == n_rows && b + 1 == n_backends ? "" : ",");
            }
        }
        printf("  ]\n}\n");
    } else {
        printf("sdpa bench: best of 5 runs; dot and attention in GFLOP/s, softmax in ns per\n"
               "element; in parentheses the speedup over scalar. Attention is the fused\n"
               "sdpa_attention_f32, shapes q<len_q>k<len_kv>d<d_k = d_v>, scale 1/sqrt(d); kvf16\n"
               "and kvbf16 rows are sdpa_mha over K and V of that type; backward is\n"
               "sdpa_mha_backward_f32 (dQ, dK, dV; 10 len_q len_kv d flops, causal: the pairs "
               "seen).\n\n");
        printf("  %-10s %-18s", "kernel", "size");
        for (size_t b = 0; b < n_backends; b++) printf(" %17s", names[b]);
        printf("\n");
        for (int i = 0; i < n_rows; i++) {
            const bench_row *row = &rows[i];
            printf("  %-10s %-18s", KERNEL_NAMES[row->kernel], row->label);
            for (size_t b = 0; b < n_backends; b++) {
                double f = row_flops(row);
                double shown = f > 0 ? f / ns[i][b] : ns[i][b] / (double)row->n;
                printf(" %8.*f (%5.1fx)", f > 0 ? 1 : 3, shown, ns[i][scalar] / ns[i][b]);
            }
            printf("\n");
        }
        printf("\nThe full benchmark, with peers and a roofline, is in bench/ "
               "(docs/performance.md).\n");
    }
done:
    free(bd.a);
    free(bd.b);
    free(bd.y);
    free(bd.q);
    free(bd.k);
    free(bd.v);
    free(bd.out);
    free(bd.k16);
    free(bd.v16);
    free(bd.dout);
    free(bd.lse);
    free(bd.dq);
    free(bd.dk);
    free(bd.dv);
    return status;
}
