/* The attention op of the benchmark: sdpa_mha_f32 on shapes in the benchdnn style. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "peers.h"
#include "sdpa.h"

/* ---- attention: sdpa_mha_f32 on a shape in the benchdnn style ----
 * b<batch>h<heads_q>[kv<heads_kv>]q<len_q>k<len_kv>d<d>[causal], d_k = d_v = d, dense
 * [batch][head][row][col] tensors, scale 1/sqrt(d), exp "fast". The op's sizes are 1-based
 * indices into attention_shapes; --shape replaces the defaults. */

typedef struct att_shape {
    char name[40];
    size_t batch, heads_q, heads_kv, len_q, len_kv, d;
    uint32_t flags;
} att_shape;

static att_shape attention_shapes[MAX_SHAPES] = {
    {"b1h1q1k4096d128", 1, 1, 1, 1, 4096, 128, 0},       /* decode, one head */
    {"b1h8q1k4096d128", 1, 8, 8, 1, 4096, 128, 0},       /* decode, MHA */
    {"b1h32kv8q1k1024d128", 1, 32, 8, 1, 1024, 128, 0},  /* decode, GQA */
    {"b1h1q1024k1024d64", 1, 1, 1, 1024, 1024, 64, 0},   /* prefill */
    {"b1h1q1024k1024d128", 1, 1, 1, 1024, 1024, 128, 0}, /* prefill */
    {"b1h1q1024k1024d128causal", 1, 1, 1, 1024, 1024, 128, SDPA_CAUSAL},
    {"b1h8q512k512d128", 1, 8, 8, 512, 512, 128, 0},            /* MHA prefill */
    {"b1h8kv2q512k512d128", 1, 8, 2, 512, 512, 128, 0},         /* GQA prefill */
    {"b2h4kv2q3k33d17causal", 2, 4, 2, 3, 33, 17, SDPA_CAUSAL}, /* --smoke: tails */
    {"b1h2kv1q1k70d8", 1, 2, 1, 1, 70, 8, 0},                   /* --smoke: grouped decode */
};
static size_t n_attention_shapes = 10;
enum { ATT_SMOKE_FIRST = 9 }; /* 1-based index of the first smoke shape */

/* Parses "b1h8kv2q512k512d128causal" into s; 0 if it is not one. */
static int parse_shape(const char *text, att_shape *s) {
    memset(s, 0, sizeof *s);
    const char *p = text;
    size_t *field[] = {&s->batch, &s->heads_q, &s->heads_kv, &s->len_q, &s->len_kv, &s->d};
    static const char *const tags[] = {"b", "h", "kv", "q", "k", "d"};
    for (int f = 0; f < 6; f++) {
        size_t len = strlen(tags[f]);
        if (strncmp(p, tags[f], len) != 0) {
            if (f == 2) continue; /* kv is optional: heads_kv = heads_q */
            return 0;
        }
        p += len;
        char *end;
        errno = 0;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || errno || v == 0 || v > (1u << 24)) return 0;
        *field[f] = (size_t)v;
        p = end;
    }
    if (!s->heads_kv) s->heads_kv = s->heads_q;
    if (strcmp(p, "causal") == 0)
        s->flags = SDPA_CAUSAL;
    else if (*p)
        return 0;
    if (s->heads_q % s->heads_kv) return 0;
    snprintf(s->name, sizeof s->name, "%s", text);
    return 1;
}

typedef struct att_state {
    const att_shape *shape;
    sdpa_mha_desc desc;
    float *q, *k, *v, *scores; /* scores: the OpenBLAS composite's len_q x len_kv matrix */
    size_t n_out;
    double pairs; /* (query, key) pairs computed, per head: causal skips the rest */
} att_state;

static void attention_prepare(job *j) {
    att_state *st = calloc(1, sizeof *st);
    if (!st) exit(2);
    const att_shape *s = st->shape = &attention_shapes[j->n - 1];
    j->extra = st;
    snprintf(j->size_label, sizeof j->size_label, "%s", s->name);
    size_t nq = s->batch * s->heads_q * s->len_q * s->d;
    size_t nkv = s->batch * s->heads_kv * s->len_kv * s->d;
    st->q = xalloc(nq), st->k = xalloc(nkv), st->v = xalloc(nkv);
    st->scores = xalloc(s->len_q * s->len_kv);
    fill(st->q, nq, -1, 1), fill(st->k, nkv, -1, 1), fill(st->v, nkv, -1, 1);
    st->n_out = nq;
    j->y = xalloc(nq), j->ref = xalloc(nq), j->y_len = nq;
    sdpa_mha_desc_dense(&st->desc, s->batch, s->heads_q, s->heads_kv, s->len_q, s->len_kv, s->d,
                        s->d, SDPA_DEFAULT_SCALE, s->flags);
    for (size_t i = 0; i < s->len_q; i++) {
        double seen = (double)s->len_kv;
        if (s->flags & SDPA_CAUSAL) {
            seen = (double)(i + 1 + s->len_kv) - (double)s->len_q;
            seen = seen < 0 ? 0 : seen > (double)s->len_kv ? (double)s->len_kv : seen;
        }
        st->pairs += seen;
    }
    /* ns/elem is per (query, key) pair of every head */
    j->n = (size_t)st->pairs * s->batch * s->heads_q;
    sdpa_set_exp_mode("fast");
    use_scalar();
    if (sdpa_mha_f32(&st->desc, j->ref, st->q, st->k, st->v) != SDPA_OK) {
        fprintf(stderr, "bench: sdpa_mha_f32 refused %s\n", s->name);
        exit(2);
    }
}

static void attention_run(enum kind kind, job *j, size_t iters) {
    att_state *st = j->extra;
    const att_shape *s = st->shape;
    switch (kind) {
    case KIND_SDPA:
        for (size_t i = 0; i < iters; i++) sdpa_mha_f32(&st->desc, j->y, st->q, st->k, st->v);
        break;
    case KIND_OPENBLAS:
        for (size_t i = 0; i < iters; i++)
            peer_openblas_attention(j->y, st->q, st->k, st->v, st->scores, s->batch, s->heads_q,
                                    s->heads_kv, s->len_q, s->len_kv, s->d,
                                    (s->flags & SDPA_CAUSAL) != 0);
        break;
    default: break;
    }
    j->sink += j->y[0];
}

/* Twice the documented bound (1e-5 max|v|, v in [-1, 1)) against the scalar backend. */
static int attention_verify(const job *j, int exp_index) {
    (void)exp_index;
    const att_state *st = j->extra;
    for (size_t i = 0; i < st->n_out; i++)
        if (!(fabs((double)j->y[i] - j->ref[i]) <= 2e-5)) return 0;
    return 1;
}

/* Two FMAs per (query, key) pair and column (Q K^T and P V); Q, K, V and out are the traffic. */
static void attention_cost(const job *j, double *flops, double *bytes, double *working_set) {
    const att_state *st = j->extra;
    const att_shape *s = st->shape;
    double heads = (double)(s->batch * s->heads_q);
    *flops = 4 * heads * st->pairs * (double)s->d;
    *bytes = *working_set =
        4.0 * (double)(2 * st->n_out + 2 * s->batch * s->heads_kv * s->len_kv * s->d);
}

static void attention_release(job *j) {
    att_state *st = j->extra;
    free(st->q), free(st->k), free(st->v), free(st->scores), free(st);
}
/* Sizes are 1-based indices into attention_shapes. */
const op_def ATTENTION_OP = {
    .name = "attention",
    .sizes = {1, 2, 3, 4, 5, 6, 7, 8},
    .smoke_sizes = {ATT_SMOKE_FIRST, ATT_SMOKE_FIRST + 1},
    .peers = {KIND_OPENBLAS, KIND_NONE},
    .exp_modes = 1,
    .plot_unit = "GFLOP/s",
    .shaped = 1,
    .prepare = attention_prepare,
    .run = attention_run,
    .verify = attention_verify,
    .cost = attention_cost,
    .release = attention_release,
};

int attention_set_shape(size_t index, const char *text) {
    return index >= 1 && index <= MAX_SHAPES && parse_shape(text, &attention_shapes[index - 1]);
}

void attention_use_shapes(size_t n) { n_attention_shapes = n; }
