/* ggml's CPU flash attention (ggml_flash_attn_ext, GGML_PREC_F32) against sdpa_mha on the same
 * values, in one process. Each row alternates the two, one call each per round (who goes first
 * alternates too), after a warm-up whose outputs are checked once against each other and against
 * a double-precision attention on sampled rows. It prints both medians of the wall time, their
 * GFLOP/s and ggml's time over sdpa's (above 1: sdpa faster), and that ratio in the process's CPU
 * time too. scripts/ggml-peer builds ggml and this file; sdpa is used through include/sdpa.h
 * only. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-cpu.h"
#include "ggml.h"
#include "rng.h"
#include "sdpa.h"

#ifndef GGML_PEER_COMMIT
#define GGML_PEER_COMMIT "unknown"
#endif

/* How a row stores K and V: f32 on sdpa's side (ggml's type is --ggml-kv), f16 on both, or 8-bit
 * (ggml's q8_0, sdpa's fp8 e4m3 with a scale each for K and V). */
typedef enum kv_kind { KV_F32, KV_F16, KV_8BIT } kv_kind;

typedef struct row_spec {
    const char *id; /* for --rows */
    const char *name;
    size_t heads_q, heads_kv, len_q, len_kv, d;
    int causal, sinks, two_threads;
    float softcap;
    kv_kind kv;
} row_spec;

static const row_spec ROWS[] = {
    {.id = "prefill",
     .name = "prefill 8 heads 1024x1024 d=128",
     .heads_q = 8,
     .heads_kv = 8,
     .len_q = 1024,
     .len_kv = 1024,
     .d = 128,
     .two_threads = 1,
     .kv = KV_F32},
    {.id = "decode",
     .name = "GQA 32/8 decode 1x4096 d=128",
     .heads_q = 32,
     .heads_kv = 8,
     .len_q = 1,
     .len_kv = 4096,
     .d = 128,
     .two_threads = 1,
     .kv = KV_F16},
    {.id = "softcap",
     .name = "causal 2 heads 4096 d=128, softcap 30 + sinks",
     .heads_q = 2,
     .heads_kv = 2,
     .len_q = 4096,
     .len_kv = 4096,
     .d = 128,
     .causal = 1,
     .sinks = 1,
     .softcap = 30.0f,
     .kv = KV_F32},
    {.id = "q8-decode",
     .name = "GQA 32/8 decode 1x4096 d=128, 8-bit K/V",
     .heads_q = 32,
     .heads_kv = 8,
     .len_q = 1,
     .len_kv = 4096,
     .d = 128,
     .kv = KV_8BIT},
    {.id = "q8-prefill",
     .name = "prefill 8 heads 1024x1024 d=128, 8-bit K/V",
     .heads_q = 8,
     .heads_kv = 8,
     .len_q = 1024,
     .len_kv = 1024,
     .d = 128,
     .kv = KV_8BIT},
};
#define N_ROWS (sizeof ROWS / sizeof ROWS[0])

typedef struct options {
    int reps, max_threads, causal, markdown;
    enum ggml_type f32_row_kv; /* ggml's K/V type on the rows where sdpa's is f32 */
    const char *rows;          /* comma-separated ids, or NULL for all */
} options;

/* One row's values, in ggml's layouts: q [head][row][d], k and v [kv head][row][d], out
 * [row][head][d]. kf/vf are the values both sides are given, except for 8-bit rows, where each
 * side has its own quantization (k_ggml/v_ggml and k_sdpa/v_sdpa dequantized). */
typedef struct problem {
    row_spec s;
    size_t n_q, n_kv, n_out;
    float scale;
    float *q, *kf, *vf, *sinks;
    float *k_ggml, *v_ggml, *k_sdpa, *v_sdpa; /* the values each side computes with */
    double pairs;                             /* (query, key) pairs a row sees, over all rows */
} problem;

typedef struct ggml_side {
    struct ggml_context *ctx;
    struct ggml_tensor *q, *k, *v, *mask, *sinks, *out;
    struct ggml_cgraph *graph;
} ggml_side;

typedef struct sdpa_side {
    sdpa_mha_desc desc;
    sdpa_score_mods mods;
    const void *k, *v;
    void *k_own, *v_own; /* buffers the side owns (freed), when not ggml's */
    float *out;
} sdpa_side;

static void *xalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "ggml_peer: out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

static double seconds(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A call's wall time, and the CPU time its process spent meanwhile: on 1 thread, the second
 * leaves out the time other processes took the core, a check on a loaded machine. */
typedef struct timing {
    double wall, cpu;
} timing;

static timing clock_start(void) {
    return (timing){seconds(CLOCK_MONOTONIC), seconds(CLOCK_PROCESS_CPUTIME_ID)};
}

static timing clock_since(timing t0) {
    return (timing){seconds(CLOCK_MONOTONIC) - t0.wall, seconds(CLOCK_PROCESS_CPUTIME_ID) - t0.cpu};
}

/* Keys row i sees (a prefix of the keys: causal or all). */
static size_t visible(const row_spec *s, size_t i) {
    if (!s->causal) return s->len_kv;
    const size_t last = i + s->len_kv - s->len_q; /* len_q <= len_kv in every row */
    return last + 1 < s->len_kv ? last + 1 : s->len_kv;
}

static float absmax(const float *x, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

/* sdpa's e4m3 copy of x with a scale that maps its largest magnitude to 448, and the values it
 * stands for (scale times the exactly widened codes). */
static void *to_e4m3(const float *x, size_t n, float *scale, float *dequantized) {
    *scale = absmax(x, n) / 448.0f;
    float *scaled = xalloc(n * sizeof(float));
    uint8_t *codes = xalloc(n);
    for (size_t i = 0; i < n; i++) scaled[i] = x[i] / *scale;
    if (sdpa_convert(codes, SDPA_FP8_E4M3, scaled, SDPA_F32, n) != SDPA_OK ||
        sdpa_convert(dequantized, SDPA_F32, codes, SDPA_FP8_E4M3, n) != SDPA_OK) {
        fprintf(stderr, "ggml_peer: sdpa_convert to e4m3: %s\n", sdpa_last_error_detail());
        exit(2);
    }
    for (size_t i = 0; i < n; i++) dequantized[i] *= *scale;
    free(scaled);
    return codes;
}

static void problem_init(problem *p, const row_spec *s, const options *o) {
    memset(p, 0, sizeof *p);
    p->s = *s;
    p->s.causal = s->causal || (o->causal && s->len_q > 1);
    p->n_q = s->heads_q * s->len_q * s->d;
    p->n_kv = s->heads_kv * s->len_kv * s->d;
    p->n_out = p->n_q;
    p->scale = 1.0f / sqrtf((float)s->d);
    p->q = xalloc(p->n_q * sizeof(float));
    p->kf = xalloc(p->n_kv * sizeof(float));
    p->vf = xalloc(p->n_kv * sizeof(float));
    p->sinks = xalloc(s->heads_q * sizeof(float));
    uint64_t rng = RNG_SEED; /* reseeded: the same values whichever rows run */
    /* with a softcap, scores large enough (up to about 15) that it changes them much: a check
       that missed a dropped softcap would prove little */
    const float q_range = s->softcap != 0.0f ? 8.0f : 2.0f;
    for (size_t i = 0; i < p->n_q; i++) p->q[i] = rng_uniform(&rng, -q_range, q_range);
    for (size_t i = 0; i < p->n_kv; i++) p->kf[i] = rng_uniform(&rng, -1.0f, 1.0f);
    for (size_t i = 0; i < p->n_kv; i++) p->vf[i] = rng_uniform(&rng, -1.0f, 1.0f);
    for (size_t h = 0; h < s->heads_q; h++) p->sinks[h] = rng_uniform(&rng, -1.0f, 3.0f);
    if (s->kv != KV_8BIT) {
        /* through f16 and back, so that the f16 and f32 copies hold the same values */
        ggml_fp16_t *h = xalloc(p->n_kv * sizeof(ggml_fp16_t));
        float *arrays[2] = {p->kf, p->vf};
        for (int a = 0; a < 2; a++) {
            ggml_fp32_to_fp16_row(arrays[a], h, (int64_t)p->n_kv);
            ggml_fp16_to_fp32_row(h, arrays[a], (int64_t)p->n_kv);
        }
        free(h);
        p->k_ggml = p->k_sdpa = p->kf;
        p->v_ggml = p->v_sdpa = p->vf;
    }
    for (size_t i = 0; i < s->len_q; i++) p->pairs += (double)visible(&p->s, i);
    p->pairs *= (double)s->heads_q;
}

static void problem_free(problem *p) {
    if (p->k_ggml != p->kf) free(p->k_ggml), free(p->v_ggml);
    if (p->k_sdpa != p->kf) free(p->k_sdpa), free(p->v_sdpa);
    free(p->q), free(p->kf), free(p->vf), free(p->sinks);
}

static enum ggml_type kv_type_of_ggml(const problem *p, const options *o) {
    return p->s.kv == KV_8BIT ? GGML_TYPE_Q8_0 : p->s.kv == KV_F16 ? GGML_TYPE_F16 : o->f32_row_kv;
}

/* Writes x into t in t's type; for q8_0, also what it stands for into dequantized. */
static void fill_tensor(struct ggml_tensor *t, const float *x, size_t n, float **dequantized) {
    if (t->type == GGML_TYPE_F32) {
        memcpy(t->data, x, n * sizeof(float));
    } else if (t->type == GGML_TYPE_F16) {
        ggml_fp32_to_fp16_row(x, t->data, (int64_t)n);
    } else {
        const int64_t row = t->ne[0];
        ggml_quantize_chunk(t->type, x, t->data, 0, (int64_t)n / row, row, NULL);
        *dequantized = xalloc(n * sizeof(float));
        ggml_get_type_traits(t->type)->to_float(t->data, *dequantized, (int64_t)n);
    }
}

static void ggml_side_init(ggml_side *g, problem *p, const options *o) {
    const row_spec *s = &p->s;
    const enum ggml_type kt = kv_type_of_ggml(p, o);
    const size_t kv_bytes = ggml_row_size(kt, (int64_t)s->d) * s->len_kv * s->heads_kv;
    const size_t bytes = 2 * p->n_q * sizeof(float) + 2 * kv_bytes +
                         s->len_q * s->len_kv * sizeof(ggml_fp16_t) + s->heads_q * sizeof(float) +
                         8 * ggml_tensor_overhead() + ggml_graph_overhead() + (1u << 20);
    struct ggml_init_params params = {bytes, NULL, false};
    g->ctx = ggml_init(params);
    if (!g->ctx) {
        fprintf(stderr, "ggml_peer: ggml_init of %zu bytes failed\n", bytes);
        exit(2);
    }
    const int64_t d = (int64_t)s->d;
    g->q = ggml_new_tensor_4d(g->ctx, GGML_TYPE_F32, d, (int64_t)s->len_q, (int64_t)s->heads_q, 1);
    g->k = ggml_new_tensor_4d(g->ctx, kt, d, (int64_t)s->len_kv, (int64_t)s->heads_kv, 1);
    g->v = ggml_new_tensor_4d(g->ctx, kt, d, (int64_t)s->len_kv, (int64_t)s->heads_kv, 1);
    memcpy(g->q->data, p->q, p->n_q * sizeof(float));
    fill_tensor(g->k, p->kf, p->n_kv, &p->k_ggml);
    fill_tensor(g->v, p->vf, p->n_kv, &p->v_ggml);
    g->mask = NULL;
    if (s->causal) { /* ggml has no causal flag: an f16 mask of 0 and -inf, shared by the heads */
        g->mask =
            ggml_new_tensor_4d(g->ctx, GGML_TYPE_F16, (int64_t)s->len_kv, (int64_t)s->len_q, 1, 1);
        ggml_fp16_t *m = g->mask->data;
        const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), minus_inf = ggml_fp32_to_fp16(-INFINITY);
        for (size_t i = 0; i < s->len_q; i++)
            for (size_t j = 0; j < s->len_kv; j++)
                m[i * s->len_kv + j] = j < visible(s, i) ? zero : minus_inf;
    }
    g->out = ggml_flash_attn_ext(g->ctx, g->q, g->k, g->v, g->mask, p->scale, 0.0f, s->softcap);
    ggml_flash_attn_ext_set_prec(g->out, GGML_PREC_F32);
    g->sinks = NULL;
    if (s->sinks) {
        g->sinks = ggml_new_tensor_1d(g->ctx, GGML_TYPE_F32, (int64_t)s->heads_q);
        memcpy(g->sinks->data, p->sinks, s->heads_q * sizeof(float));
        ggml_flash_attn_ext_add_sinks(g->out, g->sinks);
    }
    g->graph = ggml_new_graph(g->ctx);
    ggml_build_forward_expand(g->graph, g->out);
}

static void sdpa_check(sdpa_status st, const char *what) {
    if (st != SDPA_OK) {
        fprintf(stderr, "ggml_peer: %s: %s (%s)\n", what, sdpa_status_string(st),
                sdpa_last_error_detail());
        exit(2);
    }
}

/* The sdpa call on the same q (ggml's buffer) and the same K/V values, writing out in ggml's
 * [row][head][d] layout so that the two outputs compare element by element. */
static void sdpa_side_init(sdpa_side *z, problem *p, const ggml_side *g) {
    const row_spec *s = &p->s;
    memset(z, 0, sizeof *z);
    sdpa_check(sdpa_mha_desc_dense(&z->desc, 1, s->heads_q, s->heads_kv, s->len_q, s->len_kv, s->d,
                                   s->d, p->scale, s->causal ? SDPA_CAUSAL : 0),
               "sdpa_mha_desc_dense");
    z->desc.out_stride[0] = p->n_out;
    z->desc.out_stride[1] = s->d;
    z->desc.out_stride[2] = s->heads_q * s->d;
    z->out = xalloc(p->n_out * sizeof(float));
    z->mods.struct_size = sizeof z->mods;
    z->mods.window_left = z->mods.window_right = -1;
    z->mods.softcap = s->softcap;
    z->mods.sinks = s->sinks ? p->sinks : NULL;
    const int any_mod = s->softcap != 0.0f || s->sinks;
    if (any_mod || s->kv == KV_8BIT)
        sdpa_check(sdpa_mha_desc_set_mods(&z->desc, any_mod ? &z->mods : NULL), "set_mods");
    if (s->kv == KV_F16) {
        z->desc.kv_type = SDPA_F16;
        z->k = g->k->data, z->v = g->v->data;
    } else if (s->kv == KV_F32) {
        z->k = p->kf, z->v = p->vf;
    } else {
        z->desc.kv_type = SDPA_FP8_E4M3;
        p->k_sdpa = xalloc(p->n_kv * sizeof(float));
        p->v_sdpa = xalloc(p->n_kv * sizeof(float));
        z->k = z->k_own = to_e4m3(p->kf, p->n_kv, &z->desc.k_scale, p->k_sdpa);
        z->v = z->v_own = to_e4m3(p->vf, p->n_kv, &z->desc.v_scale, p->v_sdpa);
    }
}

static void sdpa_side_free(sdpa_side *z) { free(z->k_own), free(z->v_own), free(z->out); }

static timing time_ggml(ggml_side *g, struct ggml_cplan *plan) {
    const timing t0 = clock_start();
    const enum ggml_status st = ggml_graph_compute(g->graph, plan);
    const timing t = clock_since(t0);
    if (st != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "ggml_peer: ggml_graph_compute: %s\n", ggml_status_to_string(st));
        exit(2);
    }
    return t;
}

static timing time_sdpa(sdpa_side *z, const float *q) {
    const timing t0 = clock_start();
    const sdpa_status st = sdpa_mha(&z->desc, z->out, q, z->k, z->v);
    const timing t = clock_since(t0);
    sdpa_check(st, "sdpa_mha");
    return t;
}

/* Query row i of head h in double, from the formulas: s = scale q.k, the softcap, causal
 * visibility, the softmax with e^sink in its denominator. */
static void reference_row(const problem *p, const float *k, const float *v, size_t h, size_t i,
                          double *out) {
    const row_spec *s = &p->s;
    const float *q = p->q + (h * s->len_q + i) * s->d;
    const size_t hk = h / (s->heads_q / s->heads_kv), n = visible(s, i);
    double *w = xalloc(n * sizeof(double)), max = s->sinks ? p->sinks[h] : -INFINITY;
    for (size_t j = 0; j < n; j++) {
        const float *kj = k + (hk * s->len_kv + j) * s->d;
        double dot = 0.0;
        for (size_t c = 0; c < s->d; c++) dot += (double)q[c] * kj[c];
        w[j] = p->scale * dot;
        if (s->softcap != 0.0f) w[j] = s->softcap * tanh(w[j] / s->softcap);
        max = w[j] > max ? w[j] : max;
    }
    double sum = s->sinks ? exp(p->sinks[h] - max) : 0.0;
    for (size_t c = 0; c < s->d; c++) out[c] = 0.0;
    for (size_t j = 0; j < n; j++) {
        w[j] = exp(w[j] - max), sum += w[j];
        const float *vj = v + (hk * s->len_kv + j) * s->d;
        for (size_t c = 0; c < s->d; c++) out[c] += w[j] * vj[c];
    }
    for (size_t c = 0; c < s->d; c++) out[c] /= sum;
    free(w);
}

typedef struct errors {
    double ggml, sdpa, between; /* largest |difference| over the largest |reference| */
} errors;

/* Both outputs against the double reference on a few rows of every head (each on the values it
 * was given), and against each other everywhere. */
static errors check(const problem *p, const float *out_ggml, const float *out_sdpa) {
    const row_spec *s = &p->s;
    const size_t rows[4] = {0, s->len_q / 3, 2 * s->len_q / 3, s->len_q - 1};
    double *ref = xalloc(s->d * sizeof(double)), err_g = 0, err_s = 0, ref_max = 0, between = 0;
    for (size_t h = 0; h < s->heads_q; h++) {
        for (size_t r = 0; r < 4; r++) {
            const size_t at = (rows[r] * s->heads_q + h) * s->d;
            reference_row(p, p->k_ggml, p->v_ggml, h, rows[r], ref);
            for (size_t c = 0; c < s->d; c++) {
                err_g = fmax(err_g, fabs(out_ggml[at + c] - ref[c]));
                ref_max = fmax(ref_max, fabs(ref[c]));
            }
            reference_row(p, p->k_sdpa, p->v_sdpa, h, rows[r], ref);
            for (size_t c = 0; c < s->d; c++) err_s = fmax(err_s, fabs(out_sdpa[at + c] - ref[c]));
        }
    }
    for (size_t i = 0; i < p->n_out; i++)
        between = fmax(between, fabs((double)out_ggml[i] - out_sdpa[i]));
    free(ref);
    return (errors){err_g / ref_max, err_s / ref_max, between / ref_max};
}

static int compare_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of n timings' wall (or cpu) times, in ms. */
static double median_ms(const timing *t, int n, int cpu) {
    double *x = xalloc((size_t)n * sizeof(double));
    for (int i = 0; i < n; i++) x[i] = cpu ? t[i].cpu : t[i].wall;
    qsort(x, (size_t)n, sizeof *x, compare_double);
    const double m = n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
    free(x);
    return 1e3 * m;
}

/* What one (row, threads) measurement printed. */
typedef struct result {
    double ms_ggml, ms_sdpa, gflops_ggml, gflops_sdpa;
    double cpu_ms_ggml, cpu_ms_sdpa; /* medians of the process's CPU time */
    errors err;
    int ok;
} result;

/* Rounds that alternate the two calls; odd rounds run sdpa first. */
static void measure(ggml_side *g, struct ggml_cplan *plan, sdpa_side *z, const float *q, int reps,
                    timing *t_ggml, timing *t_sdpa) {
    for (int r = 0; r < reps; r++) {
        if (r % 2) t_sdpa[r] = time_sdpa(z, q);
        t_ggml[r] = time_ggml(g, plan);
        if (!(r % 2)) t_sdpa[r] = time_sdpa(z, q);
    }
}

/* Bounds of the check, relative to the output's largest magnitude: sdpa within its f32 bound
 * with room. ggml sums an f16 V in f16 on its one-row path (decode: about 2e-2 over 4096 keys)
 * and rounds q to q8_0 against a q8_0 K, hence its looser bound. Both catch a wrong layout,
 * mask or modifier, which is off by about the output's size. */
#define SDPA_TOLERANCE 1e-4
#define GGML_TOLERANCE 5e-2

static result run_row(const row_spec *spec, const options *o, int threads) {
    problem p;
    ggml_side g;
    sdpa_side z;
    problem_init(&p, spec, o);
    ggml_side_init(&g, &p, o);
    sdpa_side_init(&z, &p, &g);

    struct ggml_threadpool_params tp_params = ggml_threadpool_params_default(threads);
    struct ggml_threadpool *tp = ggml_threadpool_new(&tp_params);
    struct ggml_cplan plan = ggml_graph_plan(g.graph, threads, tp);
    plan.work_data = xalloc(plan.work_size);
    sdpa_check(sdpa_set_num_threads((size_t)threads), "sdpa_set_num_threads");

    const size_t slots = o->reps > 2 ? (size_t)o->reps : 2; /* the warm-up's 2 too */
    timing *t_ggml = xalloc(slots * sizeof(timing)), *t_sdpa = xalloc(slots * sizeof(timing));
    measure(&g, &plan, &z, g.q->data, 2, t_ggml, t_sdpa); /* the warm-up */
    result res;
    res.err = check(&p, g.out->data, z.out);
    res.ok = res.err.sdpa <= SDPA_TOLERANCE && res.err.ggml <= GGML_TOLERANCE &&
             (spec->kv == KV_8BIT || res.err.between <= GGML_TOLERANCE);
    measure(&g, &plan, &z, g.q->data, o->reps, t_ggml, t_sdpa);
    const double flops = 4.0 * p.pairs * (double)spec->d;
    res.ms_ggml = median_ms(t_ggml, o->reps, 0);
    res.ms_sdpa = median_ms(t_sdpa, o->reps, 0);
    res.cpu_ms_ggml = median_ms(t_ggml, o->reps, 1);
    res.cpu_ms_sdpa = median_ms(t_sdpa, o->reps, 1);
    res.gflops_ggml = flops / res.ms_ggml * 1e-6;
    res.gflops_sdpa = flops / res.ms_sdpa * 1e-6;

    free(t_ggml), free(t_sdpa), free(plan.work_data);
    ggml_threadpool_free(tp);
    sdpa_side_free(&z);
    ggml_free(g.ctx);
    problem_free(&p);
    return res;
}

static const char *kv_names(const row_spec *s, const options *o, int side_ggml) {
    if (s->kv == KV_8BIT) return side_ggml ? "q8_0" : "e4m3";
    if (s->kv == KV_F16) return "f16";
    return side_ggml ? ggml_type_name(o->f32_row_kv) : "f32";
}

static void print_row(const row_spec *s, const options *o, int threads, const result *r) {
    char name[128];
    snprintf(name, sizeof name, "%s%s", s->name,
             !s->causal && o->causal && s->len_q > 1 ? ", causal" : "");
    if (o->markdown) {
        printf("| %s | %d | %s / %s | %.2f / %.2f ms | %.1f / %.1f | %.2fx | %.2fx |\n", name,
               threads, kv_names(s, o, 1), kv_names(s, o, 0), r->ms_ggml, r->ms_sdpa,
               r->gflops_ggml, r->gflops_sdpa, r->ms_ggml / r->ms_sdpa,
               r->cpu_ms_ggml / r->cpu_ms_sdpa);
    } else {
        printf("%-50s %2d  %-4s/%-4s %9.3f %9.3f %8.1f %8.1f %7.2fx %7.2fx  err %.1e %.1e %.1e "
               "%s\n",
               name, threads, kv_names(s, o, 1), kv_names(s, o, 0), r->ms_ggml, r->ms_sdpa,
               r->gflops_ggml, r->gflops_sdpa, r->ms_ggml / r->ms_sdpa,
               r->cpu_ms_ggml / r->cpu_ms_sdpa, r->err.ggml, r->err.sdpa, r->err.between,
               r->ok ? "ok" : "CHECK FAILED");
    }
    if (o->markdown && !r->ok)
        fprintf(stderr, "ggml_peer: %s, %d threads: CHECK FAILED (errors %.1e %.1e %.1e)\n", name,
                threads, r->err.ggml, r->err.sdpa, r->err.between);
    fflush(stdout);
}

/* The CPU's model name, family and model, from /proc/cpuinfo (Linux; else "unknown CPU"). */
static void cpu_name(char *name, size_t size) {
    snprintf(name, size, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512], model[256] = "", family[32] = "", number[32] = "";
    while (fgets(line, sizeof line, f) && !(model[0] && family[0] && number[0])) {
        const char *colon = strchr(line, ':');
        if (!colon) continue;
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, "model name", 10) == 0)
            snprintf(model, sizeof model, "%s", colon + 2);
        else if (strncmp(line, "cpu family", 10) == 0)
            snprintf(family, sizeof family, "%s", colon + 2);
        else if (strncmp(line, "model\t", 6) == 0)
            snprintf(number, sizeof number, "%s", colon + 2);
    }
    fclose(f);
    if (model[0]) snprintf(name, size, "%s (family %s, model %s)", model, family, number);
}

static void print_header(const options *o) {
    char cpu[256];
    cpu_name(cpu, sizeof cpu);
    const char *wait = getenv("OMP_WAIT_POLICY");
    printf("%sCPU %s; ggml %s (CPU backend, GGML_PREC_F32, %s); sdpa %s, backend %s; median of %d "
           "alternating calls; OMP_WAIT_POLICY=%s\n",
           o->markdown ? "" : "# ", cpu, GGML_PEER_COMMIT,
           ggml_cpu_has_avx512() ? "AVX-512"
           : ggml_cpu_has_avx2() ? "AVX2"
                                 : "no AVX2",
           sdpa_version(), sdpa_backend(), o->reps, wait ? wait : "(unset)");
    if (o->markdown) {
        printf("\n| case | threads | K/V ggml / sdpa | ggml / sdpa time | GFLOP/s ggml / sdpa | "
               "ggml / sdpa | in CPU time |\n| --- | --- | --- | --- | --- | --- | --- |\n");
    } else {
        printf("# %-48s %2s  %-9s %9s %9s %8s %8s %8s %8s  %s\n", "case", "th", "K/V g/s",
               "ggml ms", "sdpa ms", "ggml GF", "sdpa GF", "g/s", "cpu g/s",
               "errors: ggml, sdpa vs ref; between");
    }
}

static void usage(FILE *f) {
    fprintf(f, "usage: ggml_peer [--reps N] [--threads N] [--rows ID,...] [--ggml-kv f16|f32]\n"
               "                 [--causal] [--markdown]\n"
               "  --reps N       timed calls of each side per row (default 20)\n"
               "  --threads N    the most threads for the prefill and decode rows (default 2);\n"
               "                 the other rows run on 1\n"
               "  --rows LIST    of prefill, decode, softcap, q8-decode, q8-prefill (default all)\n"
               "  --ggml-kv T    ggml's K/V type where sdpa's is f32 (default f16, the values\n"
               "                 being f16-exact on both sides)\n"
               "  --causal       make the prefill rows causal (ggml through a -inf mask)\n"
               "  --markdown     print a markdown table (without the checks' errors, which the\n"
               "                 plain table's last columns give)\n"
               "Exits 1 if a check failed.\n");
}

/* Whether the comma-separated list names id. */
static int listed(const char *list, const char *id) {
    const size_t n = strlen(id);
    for (const char *at = list; at; at = strchr(at, ',') ? strchr(at, ',') + 1 : NULL)
        if (strncmp(at, id, n) == 0 && (at[n] == ',' || at[n] == '\0')) return 1;
    return 0;
}

/* Every name in --rows is a row's id. */
static int rows_valid(const char *list) {
    for (const char *at = list; at; at = strchr(at, ',') ? strchr(at, ',') + 1 : NULL) {
        const size_t n = strcspn(at, ",");
        int found = 0;
        for (size_t r = 0; r < N_ROWS; r++)
            found |= strlen(ROWS[r].id) == n && strncmp(at, ROWS[r].id, n) == 0;
        if (!found) {
            fprintf(stderr, "ggml_peer: --rows: no row '%.*s'\n", (int)n, at);
            return 0;
        }
    }
    return 1;
}

static int parse(int argc, char **argv, options *o) {
    *o = (options){20, 2, 0, 0, GGML_TYPE_F16, NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--causal") == 0)
            o->causal = 1;
        else if (strcmp(a, "--markdown") == 0)
            o->markdown = 1;
        else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
            return usage(stdout), 0;
        else if (next && strcmp(a, "--reps") == 0)
            o->reps = atoi(next), i++;
        else if (next && strcmp(a, "--threads") == 0)
            o->max_threads = atoi(next), i++;
        else if (next && strcmp(a, "--rows") == 0)
            o->rows = next, i++;
        else if (next && strcmp(a, "--ggml-kv") == 0 && strcmp(next, "f32") == 0)
            o->f32_row_kv = GGML_TYPE_F32, i++;
        else if (next && strcmp(a, "--ggml-kv") == 0 && strcmp(next, "f16") == 0)
            o->f32_row_kv = GGML_TYPE_F16, i++;
        else
            return fprintf(stderr, "ggml_peer: bad argument '%s'\n", a), usage(stderr), -1;
    }
    if (o->reps < 1 || o->max_threads < 1) {
        fprintf(stderr, "ggml_peer: --reps and --threads take a positive count\n");
        return -1;
    }
    if (o->rows && !rows_valid(o->rows)) return -1;
    return 1;
}

int main(int argc, char **argv) {
    options o;
    const int parsed = parse(argc, argv, &o);
    if (parsed <= 0) return parsed < 0 ? 2 : 0;
    ggml_cpu_init();
    print_header(&o);
    int failed = 0;
    for (size_t r = 0; r < N_ROWS; r++) {
        if (o.rows && !listed(o.rows, ROWS[r].id)) continue;
        const int most = ROWS[r].two_threads ? o.max_threads : 1;
        for (int n = 1; n <= most; n = n < most ? most : n + 1) { /* 1 thread, then the most */
            const result res = run_row(&ROWS[r], &o, n);
            print_row(&ROWS[r], &o, n, &res);
            failed |= !res.ok;
        }
    }
    return failed;
}
