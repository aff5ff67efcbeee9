/* The attention ops of the benchmark: sdpa_mha on shapes in the benchdnn style, f32 or 16-bit,
 * and the backward pass, sdpa_mha_backward_f32, on the same shapes in f32. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "peers.h"
#include "rng.h"
#include "sdpa.h"

/* ---- attention: sdpa_mha_f32 on a shape in the benchdnn style ----
 * b<batch>h<heads_q>[kv<heads_kv>]q<len_q>k<len_kv>d<d>[causal][mods][types], d_k = d_v = d,
 * dense [batch][head][row][col] tensors, scale 1/sqrt(d), exp "fast"; mods are score modifiers
 * in this order: w<left> (a window of left keys before the row), sc<cap> (softcap), alibi (the
 * slopes 2^(-8 (h + 1) / heads)), sink (a sink of 0 a head); types is kvf16 or kvbf16 (K and V
 * of that type, q and out f32; kve4m3 and kve5m2 likewise for the 8-bit floats), or f16 or bf16
 * (every view), f32 without; then paged<block> (sdpa_attention_paged over the same values, each
 * sequence's keys in blocks of that many tokens scattered in a pool: paged.c below), and after
 * it inorder for a pool whose blocks the table takes in order (a fresh token pool). A shape
 * that starts mixedh<heads_q>... in place of b<batch>..k<len_kv> is a serving engine's mixed
 * batch, paged only: seven decodes over 1024 to 8192 keys and a 512-token prefill on 1536
 * cached (MIXED_Q, MIXED_KV), its dense row sdpa_mha once per sequence. The op's sizes are
 * 1-based indices into attention_shapes; --shape replaces the defaults. */

typedef struct att_shape {
    char name[40];
    size_t batch, heads_q, heads_kv, len_q, len_kv, d;
    uint32_t flags;
    sdpa_dtype q_type, kv_type, out_type;
    int windowed; /* a window of `window` keys before each row */
    long long window;
    float softcap; /* 0: none */
    int alibi, sink;
    size_t block; /* paged<block>: tokens per block of the paged cache; 0: dense */
    int mixed;    /* the mixed batch: batch, len_q and len_kv are MIXED_*'s and their maxima */
    int in_order; /* paged<block>inorder: the table takes the pool's blocks in order */
} att_shape;

/* The mixed batch's sequences: query rows (their newest tokens) and keys. */
#define MIXED_SEQS 8
static const size_t MIXED_Q[MIXED_SEQS] = {1, 1, 1, 1, 1, 1, 1, 512};
static const size_t MIXED_KV[MIXED_SEQS] = {1024, 2048, 3072, 4096, 5120, 6144, 8192, 2048};

/* Sequence b's query rows and keys, and its first token in a packed [token] layout. */
static size_t seq_q(const att_shape *s, size_t b) { return s->mixed ? MIXED_Q[b] : s->len_q; }
static size_t seq_kv(const att_shape *s, size_t b) { return s->mixed ? MIXED_KV[b] : s->len_kv; }
static size_t seq_token(const att_shape *s, size_t b) {
    size_t t = 0;
    for (size_t c = 0; c < b; c++) t += seq_q(s, c);
    return t;
}

#define F32_     SDPA_F32, SDPA_F32, SDPA_F32
#define KV16_    SDPA_F32, SDPA_F16, SDPA_F32
#define KVBF_    SDPA_F32, SDPA_BF16, SDPA_F32
#define BF16_    SDPA_BF16, SDPA_BF16, SDPA_BF16
#define NO_MODS_ 0, 0, 0.0f, 0, 0, 0, 0, 0 /* and dense, not mixed */

static att_shape attention_shapes[MAX_SHAPES] = {
    {"b1h1q1k4096d128", 1, 1, 1, 1, 4096, 128, 0, F32_, NO_MODS_},      /* decode, one head */
    {"b1h8q1k4096d128", 1, 8, 8, 1, 4096, 128, 0, F32_, NO_MODS_},      /* decode, MHA */
    {"b1h32kv8q1k1024d128", 1, 32, 8, 1, 1024, 128, 0, F32_, NO_MODS_}, /* decode, GQA */
    {"b1h1q1024k1024d64", 1, 1, 1, 1024, 1024, 64, 0, F32_, NO_MODS_},  /* prefill */
    {"b1h1q1024k1024d128", 1, 1, 1, 1024, 1024, 128, 0, F32_, NO_MODS_},
    {"b1h1q1024k1024d128causal", 1, 1, 1, 1024, 1024, 128, SDPA_CAUSAL, F32_, NO_MODS_},
    {"b1h8q512k512d128", 1, 8, 8, 512, 512, 128, 0, F32_, NO_MODS_},    /* MHA prefill */
    {"b1h8kv2q512k512d128", 1, 8, 2, 512, 512, 128, 0, F32_, NO_MODS_}, /* GQA prefill */
    /* the 16-bit K/V caches of decode (K and V past L2), and prefill over them */
    {"b1h32kv8q1k4096d128", 1, 32, 8, 1, 4096, 128, 0, F32_, NO_MODS_},
    {"b1h32kv8q1k4096d128kvf16", 1, 32, 8, 1, 4096, 128, 0, KV16_, NO_MODS_},
    {"b1h32kv8q1k4096d128kvbf16", 1, 32, 8, 1, 4096, 128, 0, KVBF_, NO_MODS_},
    {"b1h8q1024k1024d128kvf16", 1, 8, 8, 1024, 1024, 128, 0, KV16_, NO_MODS_},
    {"b1h8q1024k1024d128bf16", 1, 8, 8, 1024, 1024, 128, 0, BF16_, NO_MODS_},
    {"b2h4kv2q3k33d17causalkvf16", 2, 4, 2, 3, 33, 17, SDPA_CAUSAL, KV16_,
     NO_MODS_},                                                    /* --smoke: tails */
    {"b1h2kv1q1k70d8bf16", 1, 2, 1, 1, 70, 8, 0, BF16_, NO_MODS_}, /* --smoke: grouped decode */
};
static size_t n_attention_shapes = 15;
enum { ATT_SMOKE_FIRST = 14 }; /* 1-based index of the first smoke shape */

/* The number after the tag at *p, past it; 0 if there is none. */
static int tagged_number(const char **p, const char *tag, double *value) {
    const size_t len = strlen(tag);
    if (strncmp(*p, tag, len) != 0 || !((*p)[len] >= '0' && (*p)[len] <= '9')) return 0;
    char *end;
    *value = strtod(*p + len, &end);
    *p = end;
    return 1;
}

/* The modifiers' part of a shape ("w512sc30alibisink"), in that order; 0 if malformed. */
static int parse_mods(const char **p, att_shape *s) {
    double x;
    if (tagged_number(p, "w", &x)) {
        if (x != (long long)x || x < 0) return 0;
        s->windowed = 1;
        s->window = (long long)x;
    }
    if (tagged_number(p, "sc", &x)) {
        if (!(x > 0 && x < 1e30)) return 0;
        s->softcap = (float)x;
    }
    if (strncmp(*p, "alibi", 5) == 0) s->alibi = 1, *p += 5;
    if (strncmp(*p, "sink", 4) == 0) s->sink = 1, *p += 4;
    return 1;
}

static int attention_has_mods(const att_shape *s) {
    return s->windowed || s->softcap != 0.0f || s->alibi || s->sink;
}

/* Parses "b1h8kv2q512k512d128causal" into s; 0 if it is not one. */
static int parse_shape(const char *text, att_shape *s) {
    memset(s, 0, sizeof *s);
    const char *p = text;
    size_t *field[] = {&s->batch, &s->heads_q, &s->heads_kv, &s->len_q, &s->len_kv, &s->d};
    static const char *const tags[] = {"b", "h", "kv", "q", "k", "d"};
    if (strncmp(p, "mixed", 5) == 0) {
        s->mixed = 1, p += 5;
        s->batch = MIXED_SEQS, s->len_q = 512, s->len_kv = 8192;
    }
    for (int f = 0; f < 6; f++) {
        size_t len = strlen(tags[f]);
        if (s->mixed && (f == 0 || f == 3 || f == 4)) continue;
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
    if (strncmp(p, "causal", 6) == 0) {
        s->flags = SDPA_CAUSAL;
        p += 6;
    }
    if (!parse_mods(&p, s)) return 0;
    /* the types' tag ends where paged<block> starts, or at the end */
    const char *paged = strstr(p, "paged");
    const size_t types_len = paged ? (size_t)(paged - p) : strlen(p);
    if (paged) {
        double x;
        const char *q = paged;
        if (!tagged_number(&q, "paged", &x) || !(x >= 1 && x <= (1u << 24)) ||
            x != (double)(size_t)x)
            return 0;
        s->block = (size_t)x;
        s->in_order = !strcmp(q, "inorder");
        if (*q && !s->in_order) return 0;
    }
    static const struct {
        const char *tag;
        sdpa_dtype q, kv, out;
    } TYPES[] = {{"", F32_},
                 {"kvf16", KV16_},
                 {"kvbf16", KVBF_},
                 {"kve4m3", SDPA_F32, SDPA_FP8_E4M3, SDPA_F32},
                 {"kve5m2", SDPA_F32, SDPA_FP8_E5M2, SDPA_F32},
                 {"f16", SDPA_F16, SDPA_F16, SDPA_F16},
                 {"bf16", BF16_}};
    size_t t = 0;
    while (t < sizeof TYPES / sizeof TYPES[0] &&
           !(strlen(TYPES[t].tag) == types_len && strncmp(p, TYPES[t].tag, types_len) == 0))
        t++;
    if (t == sizeof TYPES / sizeof TYPES[0]) return 0;
    s->q_type = TYPES[t].q, s->kv_type = TYPES[t].kv, s->out_type = TYPES[t].out;
    if (s->heads_q % s->heads_kv || (s->mixed && !s->block)) return 0;
    snprintf(s->name, sizeof s->name, "%s", text);
    return 1;
}

/* (query, key) pairs computed per head over the batch: causal and a window skip the keys a row
   does not see */
static double pairs_of(const att_shape *s) {
    double pairs = 0;
    for (size_t b = 0; b < s->batch; b++) {
        const double len_q = (double)seq_q(s, b), len_kv = (double)seq_kv(s, b);
        for (double i = 0; i < len_q; i++) {
            const double p = i + len_kv - len_q; /* the row's position */
            double end = s->flags & SDPA_CAUSAL ? p + 1 : len_kv;
            double first = s->windowed ? p - (double)s->window : 0;
            end = end > len_kv ? len_kv : end;
            first = first < 0 ? 0 : first;
            pairs += end > first ? end - first : 0;
        }
    }
    return pairs;
}

/* A shape's score modifiers, and the slopes and sinks they point at */
typedef struct bench_mods {
    sdpa_score_mods m;
    float *slopes, *sinks;
} bench_mods;

/* ---- paged<block>: the shape's values in a paged cache, for sdpa_attention_paged ----
 * Batch entry s is sequence s: its len_q query rows packed [token][head][d] (token s len_q +
 * row, out likewise) and its len_kv keys in blocks of `block` tokens, [block][head_kv][token][d]
 * as vLLM's pool. A fixed-seed random permutation places the blocks in a pool an eighth larger
 * than the batch needs; the blocks no sequence owns and the unused tail of a last block hold
 * NaN, so that a read of them shows as a wrong result. Weak: older libraries have no paged
 * call (scripts/bench-ab runs this benchmark against them). */
#pragma weak sdpa_attention_paged

/* Bytes past a 4 KiB page where a pool starts (--pool-offset): a block of 16 tokens of one head
   is 4 KiB at d = 128 in 16 bits, which at a page boundary lies in one page and otherwise in
   two. */
static size_t pool_offset;

typedef struct paged_view {
    sdpa_kv_cache cache;
    sdpa_batch batch;
    int32_t *table, *q_start, *kv_len;
    void *q, *k_pool, *v_pool; /* q: [token][head][d] */
    void *k_mem, *v_mem;       /* the pools' allocations */
} paged_view;

static size_t type_bytes(sdpa_dtype t) { return t == SDPA_F32 ? 4 : t <= SDPA_BF16 ? 2 : 1; }

/* A dense [batch][heads_kv][len_kv][d] view of type t copied into a pool of num_blocks blocks
   through table ([batch][blocks a sequence]), the rest of the pool NaN; *mem is what to free. */
static void *paged_pool(const att_shape *s, const void *dense, const int32_t *table,
                        size_t num_blocks, sdpa_dtype t, void **mem) {
    const size_t size = type_bytes(t), row = s->d * size;
    const size_t per_seq = (s->len_kv + s->block - 1) / s->block;
    const size_t block_bytes = s->heads_kv * s->block * row;
    *mem = xalloc_bytes(num_blocks * block_bytes + pool_offset, 4096);
    char *pool = (char *)*mem + pool_offset;
    const float nan = NAN;
    unsigned char one[4];
    sdpa_convert(one, t, &nan, SDPA_F32, 1);
    for (size_t i = 0; i < block_bytes; i += size) memcpy(pool + i, one, size);
    for (size_t b = 1; b < num_blocks; b++) memcpy(pool + b * block_bytes, pool, block_bytes);
    for (size_t q = 0; q < s->batch; q++)
        for (size_t h = 0; h < s->heads_kv; h++)
            for (size_t j = 0; j < seq_kv(s, q); j++) {
                const size_t b = (size_t)table[q * per_seq + j / s->block];
                memcpy(pool + b * block_bytes + (h * s->block + j % s->block) * row,
                       (const char *)dense + ((q * s->heads_kv + h) * s->len_kv + j) * row, row);
            }
    return pool;
}

/* Rows of [batch][heads][len_q][d] (elements of `size` bytes) to [token][heads][d], or back
   (to_tokens 0): sequence b's rows are its first seq_q, at its tokens from seq_token. */
static void move_rows(void *to, const void *from, const att_shape *s, size_t size, int to_tokens) {
    const size_t row = s->d * size;
    for (size_t b = 0; b < s->batch; b++) {
        const size_t first = seq_token(s, b);
        for (size_t h = 0; h < s->heads_q; h++)
            for (size_t i = 0; i < seq_q(s, b); i++) {
                const size_t dense = ((b * s->heads_q + h) * s->len_q + i) * row;
                const size_t token = ((first + i) * s->heads_q + h) * row;
                memcpy((char *)to + (to_tokens ? token : dense),
                       (const char *)from + (to_tokens ? dense : token), row);
            }
    }
}

sdpa_kv_cache bench_paged_cache(sdpa_dtype t, size_t used_blocks, size_t block, size_t heads_kv,
                                size_t d) {
    return (sdpa_kv_cache){.struct_size = sizeof(sdpa_kv_cache),
                           .kv_type = t,
                           .num_blocks = used_blocks + used_blocks / 8 + 1,
                           .block_size = block,
                           .heads_kv = heads_kv,
                           .d_k = d,
                           .d_v = d,
                           .k_stride = {heads_kv * block * d, block * d, d},
                           .v_stride = {heads_kv * block * d, block * d, d}};
}

/* The paged call's views of the shape's values: q (of q_type) and k and v (of kv_type), dense. */
static void paged_prepare(paged_view *pv, const att_shape *s, const void *q, const void *k,
                          const void *v, const sdpa_score_mods *mods) {
    if (!sdpa_attention_paged || s->batch * s->len_q > INT32_MAX || s->len_kv > INT32_MAX) {
        fprintf(stderr, "bench: %s needs sdpa_attention_paged and int32 token counts\n", s->name);
        exit(2);
    }
    const size_t per_seq = (s->len_kv + s->block - 1) / s->block;
    pv->cache = bench_paged_cache(s->kv_type, s->batch * per_seq, s->block, s->heads_kv, s->d);
    const size_t num_blocks = pv->cache.num_blocks;
    /* the pool's blocks in a random order (inorder: in order), the table the first `used` */
    pv->table = malloc(num_blocks * sizeof *pv->table);
    pv->q_start = malloc((s->batch + 1) * sizeof *pv->q_start);
    pv->kv_len = malloc(s->batch * sizeof *pv->kv_len);
    if (!pv->table || !pv->q_start || !pv->kv_len || num_blocks > INT32_MAX) exit(2);
    rng_permutation(pv->table, num_blocks, s->in_order ? 0 : POOL_SEED);
    pv->k_pool = paged_pool(s, k, pv->table, num_blocks, s->kv_type, &pv->k_mem);
    pv->v_pool = paged_pool(s, v, pv->table, num_blocks, s->kv_type, &pv->v_mem);
    const size_t nq = s->batch * s->heads_q * s->len_q * s->d;
    pv->q = xalloc(nq);
    move_rows(pv->q, q, s, type_bytes(s->q_type), 1);
    for (size_t b = 0; b <= s->batch; b++) pv->q_start[b] = (int32_t)seq_token(s, b);
    for (size_t b = 0; b < s->batch; b++) pv->kv_len[b] = (int32_t)seq_kv(s, b);
    const size_t d = s->d, token = s->heads_q * d;
    pv->cache.block_table = pv->table;
    pv->cache.block_table_stride = per_seq;
    pv->batch = (sdpa_batch){.struct_size = sizeof(sdpa_batch),
                             .flags = s->flags,
                             .num_seqs = s->batch,
                             .heads_q = s->heads_q,
                             .q_start = pv->q_start,
                             .kv_len = pv->kv_len,
                             .scale = SDPA_DEFAULT_SCALE,
                             .q_type = s->q_type,
                             .out_type = s->out_type,
                             .q_stride = {token, d},
                             .out_stride = {token, d},
                             .mods = mods};
}

static void paged_release(paged_view *pv) {
    free(pv->table), free(pv->q_start), free(pv->kv_len);
    free(pv->q), free(pv->k_mem), free(pv->v_mem);
}

typedef struct att_state {
    const att_shape *shape;
    sdpa_mha_desc desc;
    float *q, *k, *v, *scores; /* scores: the OpenBLAS composite's len_q x len_kv matrix */
    void *q16, *k16, *v16;     /* the views sdpa gets: q, k, v converted to the shape's types */
    float *peer_out;           /* the peer's float out, before it is rounded to a 16-bit out */
    bench_mods mods;           /* the shape's modifiers, when it has some */
    sdpa_mha_desc desc_f32;    /* desc with every view f32: the "vs f32" row (KIND_F32) */
    float *out_f32;            /* that row's out */
    int f32_last;              /* the last run was that row's: its out is in out_f32 */
    paged_view paged;          /* a paged shape's views (paged.q NULL for a dense shape) */
    sdpa_mha_desc seq_desc[MIXED_SEQS]; /* the mixed batch's dense calls, a sequence each */
    int paged_last; /* the last run was the paged call's: out is [token][head][d] */
    size_t n_out;
    double pairs; /* (query, key) pairs computed per head over the batch */
} att_state;

/* x's n floats as type t in an array of their own (a copy for f32); x takes the values it holds */
static void *typed_copy(float *x, size_t n, sdpa_dtype t) {
    void *p = xalloc(n);
    if (sdpa_convert(p, t, x, SDPA_F32, n) != SDPA_OK ||
        sdpa_convert(x, SDPA_F32, p, t, n) != SDPA_OK)
        exit(2);
    return p;
}

/* an out of type t, held in the first n halves of y when 16-bit, as floats in y */
static void widen_in_place(float *y, size_t n, sdpa_dtype t) {
    if (t == SDPA_F32) return;
    float *wide = xalloc(n);
    sdpa_convert(wide, SDPA_F32, y, t, n);
    memcpy(y, wide, n * sizeof *y);
    free(wide);
}

/* The shape's modifiers into bm and desc (a v3 descriptor then) */
static void set_mods(bench_mods *bm, sdpa_mha_desc *desc, const att_shape *s) {
    memset(&bm->m, 0, sizeof bm->m);
    bm->m.struct_size = sizeof bm->m;
    bm->m.window_left = s->windowed ? s->window : -1;
    bm->m.window_right = -1;
    bm->m.softcap = s->softcap;
    bm->slopes = xalloc(s->heads_q), bm->sinks = xalloc(s->heads_q);
    for (size_t h = 0; h < s->heads_q; h++) {
        bm->slopes[h] = (float)pow(2.0, -8.0 * (double)(h + 1) / (double)s->heads_q);
        bm->sinks[h] = 0.0f;
    }
    if (s->alibi) bm->m.alibi_slopes = bm->slopes;
    if (s->sink) bm->m.sinks = bm->sinks;
    sdpa_mha_desc_set_mods(desc, &bm->m);
}

/* The mixed batch's dense calls: sequence b's first rows and keys of batch entry b of desc's
   views (at element offsets b * stride[0], which mixed_dense adds). */
static void mixed_descs(att_state *st) {
    const att_shape *s = st->shape;
    for (size_t b = 0; b < s->batch; b++) {
        sdpa_mha_desc *d = &st->seq_desc[b];
        *d = st->desc;
        d->batch = 1, d->len_q = seq_q(s, b), d->len_kv = seq_kv(s, b);
    }
}

/* sdpa_mha once per sequence of the mixed batch, out [batch][heads][len_q][d] as desc's */
static void mixed_dense(const att_state *st, void *out) {
    const att_shape *s = st->shape;
    const size_t qs = type_bytes(s->q_type), ks = type_bytes(s->kv_type);
    const size_t os = type_bytes(s->out_type);
    for (size_t b = 0; b < s->batch; b++) {
        const sdpa_mha_desc *d = &st->seq_desc[b];
        sdpa_mha(d, (char *)out + b * d->out_stride[0] * os,
                 (const char *)st->q16 + b * d->q_stride[0] * qs,
                 (const char *)st->k16 + b * d->k_stride[0] * ks,
                 (const char *)st->v16 + b * d->v_stride[0] * ks);
    }
}

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
    /* 16-bit views in arrays of their own, and the float ones hold the same values (the peer
       computes on those) */
    st->q16 = typed_copy(st->q, nq, s->q_type);
    st->k16 = typed_copy(st->k, nkv, s->kv_type);
    st->v16 = typed_copy(st->v, nkv, s->kv_type);
    st->n_out = nq;
    st->peer_out = xalloc(nq);
    st->out_f32 = xalloc(nq);
    for (size_t i = 0; i < nq; i++) st->out_f32[i] = NAN; /* poisoned as check() poisons y */
    j->y = xalloc(nq), j->ref = xalloc(nq), j->y_len = nq;
    sdpa_mha_desc_dense(&st->desc, s->batch, s->heads_q, s->heads_kv, s->len_q, s->len_kv, s->d,
                        s->d, SDPA_DEFAULT_SCALE, s->flags);
    if (attention_has_mods(s)) set_mods(&st->mods, &st->desc, s);
    st->desc_f32 = st->desc;
    st->desc.q_type = s->q_type, st->desc.kv_type = s->kv_type, st->desc.out_type = s->out_type;
    if (s->mixed) mixed_descs(st);
    st->pairs = pairs_of(s);
    /* ns/elem is per (query, key) pair of every head */
    j->n = (size_t)st->pairs * s->heads_q;
    sdpa_set_exp_mode("fast");
    use_scalar();
    if (s->mixed) {
        memset(j->ref, 0, nq * sizeof(float));
        mixed_dense(st, j->ref);
    } else if (sdpa_mha(&st->desc, j->ref, st->q16, st->k16, st->v16) != SDPA_OK) {
        fprintf(stderr, "bench: sdpa_mha refused %s\n", s->name);
        exit(2);
    }
    widen_in_place(j->ref, nq, s->out_type);
    if (!s->block) return;
    const paged_view *pv = &st->paged;
    paged_prepare(&st->paged, s, st->q16, st->k16, st->v16,
                  attention_has_mods(s) ? &st->mods.m : NULL);
    if (sdpa_attention_paged(&pv->batch, &pv->cache, j->y, pv->q, pv->k_pool, pv->v_pool) !=
        SDPA_OK) {
        fprintf(stderr, "bench: sdpa_attention_paged refused %s: %s\n", s->name,
                sdpa_last_error_detail());
        exit(2);
    }
}

/* An sdpa row's call through its library's table (bench_api): the paged call for a paged shape
   (which an older build may lack: status SDPA_ERR_UNSUPPORTED), else sdpa_mha. */
static sdpa_status shape_call(const sdpa_api *api, const att_state *st, void *out) {
    const paged_view *pv = &st->paged;
    if (!st->shape->block) return api->mha(&st->desc, out, st->q16, st->k16, st->v16);
    if (api->struct_size <= offsetof(sdpa_api, attention_paged)) return SDPA_ERR_UNSUPPORTED;
    return api->attention_paged(&pv->batch, &pv->cache, out, pv->q, pv->k_pool, pv->v_pool);
}

static int attention_against(job *j) {
    att_state *st = j->extra;
    st->f32_last = 0;
    st->paged_last = st->shape->block != 0;
    return bench_against && shape_call(bench_against, st, j->y) == SDPA_OK;
}

static void attention_run(enum kind kind, job *j, size_t iters) {
    att_state *st = j->extra;
    const att_shape *s = st->shape;
    st->f32_last = kind == KIND_F32;
    st->paged_last = (kind == KIND_SDPA || kind == KIND_OLD) && s->block;
    switch (kind) {
    case KIND_SDPA:
    case KIND_OLD:
        for (size_t i = 0; i < iters; i++) shape_call(bench_api(kind), st, j->y);
        break;
    case KIND_DENSE: /* a paged shape's values, dense */
        for (size_t i = 0; i < iters; i++)
            if (s->mixed)
                mixed_dense(st, j->y);
            else
                sdpa_mha(&st->desc, j->y, st->q16, st->k16, st->v16);
        break;
    case KIND_F32: /* q, k and v hold the 16-bit views' values */
        for (size_t i = 0; i < iters; i++)
            sdpa_mha_f32(&st->desc_f32, st->out_f32, st->q, st->k, st->v);
        j->sink += st->out_f32[0];
        return;
    case KIND_OPENBLAS: /* on the float values of the 16-bit views, out rounded to its type */
        for (size_t i = 0; i < iters; i++) {
            float *out = s->out_type == SDPA_F32 ? j->y : st->peer_out;
            peer_openblas_attention(out, st->q, st->k, st->v, st->scores, s->batch, s->heads_q,
                                    s->heads_kv, s->len_q, s->len_kv, s->d,
                                    (s->flags & SDPA_CAUSAL) != 0);
            if (out != j->y) sdpa_convert(j->y, s->out_type, out, SDPA_F32, st->n_out);
        }
        break;
    default: break;
    }
    j->sink += j->y[0];
}

/* Twice the documented bound (1e-5 max|v|, v in [-1, 1)) against the scalar backend, and a
 * 16-bit out's rounding (an ULP: the two may round either side; the f32 row's out is not
 * rounded). */
static int attention_verify(const job *j, int exp_index) {
    (void)exp_index;
    const att_state *st = j->extra;
    const sdpa_dtype out_type = st->shape->out_type;
    const double ulp = out_type == SDPA_F16 ? 0x1p-10 : out_type == SDPA_BF16 ? 0x1p-7 : 0.0;
    float *y = st->f32_last ? st->out_f32 : j->y;
    if (out_type != SDPA_F32 && !st->f32_last) {
        y = xalloc(st->n_out);
        sdpa_convert(y, SDPA_F32, j->y, out_type, st->n_out);
    }
    if (st->paged_last) { /* [token][head][d] to the reference's layout */
        float *dense = xalloc(st->n_out);
        move_rows(dense, y, st->shape, sizeof(float), 0);
        if (y != j->y) free(y);
        y = dense;
    }
    int ok = 1;
    const att_shape *s = st->shape;
    const size_t per_seq = s->heads_q * s->len_q * s->d;
    for (size_t i = 0; i < st->n_out && ok; i++) {
        if (i / s->d % s->len_q >= seq_q(s, i / per_seq)) continue; /* a mixed batch's unused row */
        ok = fabs((double)y[i] - j->ref[i]) <= 2e-5 + ulp * fabs(j->ref[i]);
    }
    if (y != j->y && y != st->out_f32) free(y);
    return ok;
}

/* Two FMAs per (query, key) pair and column (Q K^T and P V); Q, K, V and out are the traffic. */
static void attention_cost(const job *j, double *flops, double *bytes, double *working_set) {
    const att_state *st = j->extra;
    const att_shape *s = st->shape;
    *flops = 4 * (double)s->heads_q * st->pairs * (double)s->d;
    size_t rows = 0, keys = 0;
    for (size_t b = 0; b < s->batch; b++) rows += seq_q(s, b), keys += seq_kv(s, b);
    const double q_bytes = (double)type_bytes(s->q_type),
                 out_bytes = (double)type_bytes(s->out_type);
    *bytes = *working_set =
        (q_bytes + out_bytes) * (double)(rows * s->heads_q * s->d) +
        2 * (double)type_bytes(s->kv_type) * (double)(keys * s->heads_kv * s->d);
}

static void attention_release(job *j) {
    att_state *st = j->extra;
    free(st->q), free(st->k), free(st->v), free(st->scores);
    free(st->q16), free(st->k16), free(st->v16), free(st->peer_out), free(st->out_f32);
    free(st->mods.slopes), free(st->mods.sinks);
    paged_release(&st->paged), free(st);
}

int attention_uniform(const job *j) {
    const att_shape *s = ((const att_state *)j->extra)->shape;
    return !attention_has_mods(s) && !s->mixed;
}

int attention_paged(const job *j) { return ((const att_state *)j->extra)->shape->block != 0; }

int attention_typed(const job *j) {
    const att_shape *s = ((const att_state *)j->extra)->shape;
    if (s->mixed) return 0; /* its f32 row would run desc's whole batch, not the sequences */
    return s->q_type != SDPA_F32 || s->kv_type != SDPA_F32 || s->out_type != SDPA_F32;
}
/* Sizes are 1-based indices into attention_shapes. */
const op_def ATTENTION_OP = {
    .name = "attention",
    .sizes = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13},
    .smoke_sizes = {ATT_SMOKE_FIRST, ATT_SMOKE_FIRST + 1},
    .peers = {KIND_OPENBLAS, KIND_F32},
    .exp_modes = 1,
    .plot_unit = "GFLOP/s",
    .shaped = 1,
    .prepare = attention_prepare,
    .run = attention_run,
    .verify = attention_verify,
    .cost = attention_cost,
    .release = attention_release,
    .against = attention_against,
};

int attention_set_shape(size_t index, const char *text) {
    return index >= 1 && index <= MAX_SHAPES && parse_shape(text, &attention_shapes[index - 1]);
}

void attention_use_shapes(size_t n) { n_attention_shapes = n; }

void attention_pool_offset(size_t bytes) { pool_offset = bytes; }

int attention_shape_mixed(size_t index) { return attention_shapes[index - 1].mixed; }

/* ---- backward: sdpa_mha_backward_f32 on the f32 values of an attention shape ----
 * The forward (untimed, in prepare) gives out and lse; the upstream gradient is uniform in
 * [-1, 1). The reference is the scalar backend's gradients. */

typedef struct bwd_state {
    const att_shape *shape;
    sdpa_mha_desc desc;
    sdpa_mha_grads grads;
    float *q, *k, *v, *out, *dout, *lse;
    size_t n_q, n_kv;
    double pairs;
    float ref_max; /* max |reference gradient| */
    bench_mods mods;
    float dsinks[64]; /* the sinks' gradient, for shapes of up to 64 heads with sinks */
} bwd_state;

static void backward_prepare(job *j) {
    bwd_state *st = calloc(1, sizeof *st);
    if (!st) exit(2);
    const att_shape *s = st->shape = &attention_shapes[j->n - 1];
    j->extra = st;
    /* the shape's name without its types, which the backward does not take */
    char kv[24] = "";
    if (s->heads_kv != s->heads_q) snprintf(kv, sizeof kv, "kv%zu", s->heads_kv);
    snprintf(j->size_label, sizeof j->size_label, "b%zuh%zu%sq%zuk%zud%zu%s", s->batch, s->heads_q,
             kv, s->len_q, s->len_kv, s->d, s->flags & SDPA_CAUSAL ? "causal" : "");
    if (attention_has_mods(s) && s->kv_type == SDPA_F32) /* the name holds the modifiers */
        snprintf(j->size_label, sizeof j->size_label, "%s", s->name);
    st->n_q = s->batch * s->heads_q * s->len_q * s->d;
    st->n_kv = s->batch * s->heads_kv * s->len_kv * s->d;
    st->q = xalloc(st->n_q), st->k = xalloc(st->n_kv), st->v = xalloc(st->n_kv);
    st->out = xalloc(st->n_q), st->dout = xalloc(st->n_q);
    st->lse = xalloc(s->batch * s->heads_q * s->len_q);
    fill(st->q, st->n_q, -1, 1), fill(st->k, st->n_kv, -1, 1), fill(st->v, st->n_kv, -1, 1);
    fill(st->dout, st->n_q, -1, 1);
    /* dq, dk, dv one after another in y (and ref) */
    j->y_len = st->n_q + 2 * st->n_kv;
    j->y = xalloc(j->y_len), j->ref = xalloc(j->y_len);
    sdpa_mha_desc *d = &st->desc;
    sdpa_mha_desc_dense(d, s->batch, s->heads_q, s->heads_kv, s->len_q, s->len_kv, s->d, s->d,
                        SDPA_DEFAULT_SCALE, s->flags);
    if (attention_has_mods(s)) set_mods(&st->mods, d, s);
    d->lse = st->lse;
    d->lse_stride[0] = s->heads_q * s->len_q;
    d->lse_stride[1] = s->len_q;
    sdpa_mha_grads *g = &st->grads;
    g->struct_size = sizeof *g;
    g->dout = st->dout;
    g->dsinks = s->sink && s->heads_q <= 64 ? st->dsinks : NULL;
    memcpy(g->dq_stride, d->q_stride, sizeof g->dq_stride);
    memcpy(g->dk_stride, d->k_stride, sizeof g->dk_stride);
    memcpy(g->dv_stride, d->v_stride, sizeof g->dv_stride);
    memcpy(g->dout_stride, d->out_stride, sizeof g->dout_stride);
    st->pairs = pairs_of(s);
    j->n = (size_t)st->pairs * s->heads_q;
    sdpa_set_exp_mode("fast");
    use_scalar();
    g->dq = j->ref, g->dk = j->ref + st->n_q, g->dv = j->ref + st->n_q + st->n_kv;
    if (sdpa_mha_f32(d, st->out, st->q, st->k, st->v) != SDPA_OK ||
        sdpa_mha_backward_f32(d, g, st->q, st->k, st->v, st->out) != SDPA_OK) {
        fprintf(stderr, "bench: sdpa_mha_backward_f32 refused %s\n", s->name);
        exit(2);
    }
    for (size_t i = 0; i < j->y_len; i++)
        st->ref_max = fabsf(j->ref[i]) > st->ref_max ? fabsf(j->ref[i]) : st->ref_max;
    g->dq = j->y, g->dk = j->y + st->n_q, g->dv = j->y + st->n_q + st->n_kv;
}

static void backward_run(enum kind kind, job *j, size_t iters) {
    bwd_state *st = j->extra;
    if (kind == KIND_SDPA || kind == KIND_OLD)
        for (size_t i = 0; i < iters; i++)
            bench_api(kind)->mha_backward_f32(&st->desc, &st->grads, st->q, st->k, st->v, st->out);
    j->sink += j->y[0];
}

/* The other build's backward (--against), where its table has one and it runs j's call */
static int backward_against(job *j) {
    const bwd_state *st = j->extra;
    return bench_against && bench_against->struct_size > offsetof(sdpa_api, mha_backward_f32) &&
           bench_against->mha_backward_f32(&st->desc, &st->grads, st->q, st->k, st->v, st->out) ==
               SDPA_OK;
}

/* Each gradient within 1e-4 of the largest against the scalar backend's: the backends sum in
 * other orders (sdpa.h states each output's bound against the exact gradient). */
static int backward_verify(const job *j, int exp_index) {
    (void)exp_index;
    const bwd_state *st = j->extra;
    for (size_t i = 0; i < j->y_len; i++)
        if (!(fabs((double)j->y[i] - j->ref[i]) <= 1e-4 * st->ref_max)) return 0;
    return 1;
}

/* Five products of two flops per (query, key) pair and column (FlashAttention-2's count); Q, K,
 * V, out, dout read and dQ, dK, dV written. */
static void backward_cost(const job *j, double *flops, double *bytes, double *working_set) {
    const bwd_state *st = j->extra;
    const att_shape *s = st->shape;
    *flops = 10 * (double)s->heads_q * st->pairs * (double)s->d;
    *bytes = *working_set = 4.0 * (4 * (double)st->n_q + 4 * (double)st->n_kv);
}

static void backward_release(job *j) {
    bwd_state *st = j->extra;
    free(st->q), free(st->k), free(st->v), free(st->out), free(st->dout), free(st->lse);
    free(st->mods.slopes), free(st->mods.sinks), free(st);
}

/* The f32 prefill shapes of the attention op (1-based indices), every type ignored. */
const op_def BACKWARD_OP = {
    .name = "backward",
    .sizes = {4, 5, 6, 7, 8},
    .smoke_sizes = {ATT_SMOKE_FIRST},
    .peers = {KIND_NONE, KIND_NONE},
    .exp_modes = 1,
    .plot_unit = "GFLOP/s",
    .shaped = 1,
    .prepare = backward_prepare,
    .run = backward_run,
    .verify = backward_verify,
    .cost = backward_cost,
    .release = backward_release,
    .against = backward_against,
};
