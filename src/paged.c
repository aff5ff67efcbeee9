/* sdpa_attention_paged: the batch's checks, then one attention problem a sequence, whose keys
 * the executor finds through the sequence's row of the block table (attention_problem.h). A
 * sequence whose plan shares it among the call's threads runs on all of them, one after
 * another; the others (a short decode) run side by side, one a thread. Each sequence's plan,
 * and so its bits, are the same either way (plan.h). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention.h"
#include "attention_problem.h"
#include "error.h"
#include "paged.h"
#include "sdpa.h"
#include "sizes.h"
#include "threads.h"

/* the whole sdpa_batch of ABI 1.4 */
#define BATCH_V1_SIZE (offsetof(sdpa_batch, mods) + sizeof(void *))

/* The batch's own fields, whatever its rows. */
static sdpa_status batch_check(const sdpa_batch *b) {
    if (!b) return sdpa_fail(SDPA_ERR_NULL, "batch is NULL");
    if (b->struct_size < BATCH_V1_SIZE)
        return sdpa_fail(SDPA_ERR_ARG, "batch->struct_size (%u) is smaller than sdpa_batch (%zu)",
                         (unsigned)b->struct_size, (size_t)BATCH_V1_SIZE);
    if (b->q_type > SDPA_BF16 || b->out_type > SDPA_BF16)
        return sdpa_fail(SDPA_ERR_ARG, "batch->%s (%u) is not an sdpa_dtype (0 to 2)",
                         b->q_type > SDPA_BF16 ? "q_type" : "out_type",
                         (unsigned)(b->q_type > SDPA_BF16 ? b->q_type : b->out_type));
    if (b->num_seqs && (!b->q_start || !b->kv_len))
        return sdpa_fail(SDPA_ERR_NULL, "batch->%s is NULL with num_seqs = %zu",
                         b->q_start ? "kv_len" : "q_start", b->num_seqs);
    if (b->num_seqs > (size_t)PTRDIFF_MAX / sizeof(int32_t) - 1)
        return sdpa_fail(SDPA_ERR_SIZE,
                         "batch->num_seqs (%zu) is past PTRDIFF_MAX bytes of q_start", b->num_seqs);
    return SDPA_OK;
}

/* What the sequences ask of the call. */
typedef struct batch_sizes {
    size_t rows;      /* query rows of the batch, q_start[num_seqs] */
    int reads_keys;   /* a sequence with rows has keys */
    size_t table_end; /* entries of block_table up to the last one read */
} batch_sizes;

/* q_start, kv_len and the causal rule of every sequence */
static sdpa_status sequences_check(const sdpa_batch *b, batch_sizes *z) {
    memset(z, 0, sizeof *z);
    if (!b->num_seqs) return SDPA_OK;
    if (b->q_start[0] != 0)
        return sdpa_fail(SDPA_ERR_ARG, "batch->q_start[0] (%d) is not 0", (int)b->q_start[0]);
    for (size_t s = 0; s < b->num_seqs; s++) {
        const int32_t first = b->q_start[s], end = b->q_start[s + 1], keys = b->kv_len[s];
        if (end < first)
            return sdpa_fail(SDPA_ERR_ARG, "batch->q_start decreases at %zu (%d, then %d)", s + 1,
                             (int)first, (int)end);
        if (keys < 0)
            return sdpa_fail(SDPA_ERR_ARG, "batch->kv_len[%zu] (%d) is negative", s, (int)keys);
        const size_t rows = (size_t)(end - first);
        if ((b->flags & SDPA_CAUSAL) && rows > (size_t)keys)
            return sdpa_fail(SDPA_ERR_ARG,
                             "sequence %zu has %zu query rows and %d keys: causal needs at least "
                             "as many keys as rows",
                             s, rows, (int)keys);
        if (rows && keys) z->reads_keys = 1;
    }
    z->rows = (size_t)b->q_start[b->num_seqs];
    return SDPA_OK;
}

/* The blocks of the keys the call reads: each entry in [0, num_blocks), the table's extent */
static sdpa_status table_check(const sdpa_batch *b, const sdpa_kv_cache *c, batch_sizes *z) {
    const int32_t *table = c->block_table;
    if (!table) return sdpa_fail(SDPA_ERR_NULL, "cache->block_table is NULL with keys to read");
    for (size_t s = 0; s < b->num_seqs; s++) {
        if (b->q_start[s + 1] == b->q_start[s] || !b->kv_len[s]) continue;
        const size_t blocks = ((size_t)b->kv_len[s] - 1) / c->block_size + 1;
        int ok = 1;
        const size_t end = sdpa_mul_add(s, c->block_table_stride, blocks, &ok);
        if (!ok || end > (size_t)PTRDIFF_MAX / sizeof *table)
            return sdpa_fail(SDPA_ERR_SIZE,
                             "cache->block_table's row %zu (stride %zu) is past PTRDIFF_MAX bytes",
                             s, c->block_table_stride);
        if (end > z->table_end) z->table_end = end;
        const int32_t *row = table + s * c->block_table_stride;
        for (size_t n = 0; n < blocks; n++)
            if (row[n] < 0 || (size_t)row[n] >= c->num_blocks)
                return sdpa_fail(SDPA_ERR_ARG,
                                 "cache->block_table[%zu][%zu] (%d) is outside [0, num_blocks = "
                                 "%zu), for keys of sequence %zu",
                                 s, n, (int)row[n], c->num_blocks, s);
    }
    return SDPA_OK;
}

/* The batch as one problem over all its rows, without keys: sdpa_problem_check then holds it to
 * sdpa_mha's rules for the shapes, types, scale, flags and out. [token][head] views become
 * [0][head][token] ones; the lse, whose tokens need not be contiguous, is checked apart. */
static void batch_problem(attention_problem *p, const sdpa_batch *b, const sdpa_kv_cache *c,
                          size_t rows, void *out, const void *q) {
    const attention_problem whole = {.batch = 1,
                                     .heads_q = b->heads_q,
                                     .heads_kv = c->heads_kv,
                                     .len_q = rows,
                                     .d_k = c->d_k,
                                     .d_v = c->d_v,
                                     .scale = b->scale,
                                     .q_type = b->q_type,
                                     .kv_type = c->kv_type,
                                     .out_type = b->out_type,
                                     /* an 8-bit cache's scales (checked finite) */
                                     .k_scale = c->kv_type > SDPA_BF16 ? c->k_scale : 0.0f,
                                     .v_scale = c->kv_type > SDPA_BF16 ? c->v_scale : 0.0f,
                                     .q = q,
                                     .out = out,
                                     .q_stride = {0, b->q_stride[1], b->q_stride[0]},
                                     .out_stride = {0, b->out_stride[1], b->out_stride[0]}};
    *p = whole;
}

/* bytes of a [d0][d1] view of rows of `row` elements of `size` bytes (d0, d1, row >= 1), which
   fits (checked) */
static size_t view_bytes(const size_t stride[2], size_t d0, size_t d1, size_t row, size_t size) {
    return ((d0 - 1) * stride[0] + (d1 - 1) * stride[1] + row) * size;
}

/* lse, [rows][heads_q] floats: its extent and that no two entries are one float */
static sdpa_status lse_check(const sdpa_batch *b, size_t rows) {
    const size_t s3[3] = {b->lse_stride[0], b->lse_stride[1], 0};
    if (!sdpa_view_fits(s3, rows, b->heads_q, 1, 1))
        return sdpa_fail(SDPA_ERR_SIZE, "lse's extent is past PTRDIFF_MAX bytes");
    /* the axes of more than one entry, sorted by stride: each steps past the span of the other */
    size_t inner = b->lse_stride[0], n_inner = rows, outer = b->lse_stride[1], n_outer = b->heads_q;
    if (n_inner < 2 || (n_outer > 1 && outer < inner)) {
        inner = b->lse_stride[1], n_inner = b->heads_q;
        outer = b->lse_stride[0], n_outer = rows;
    }
    const int ok =
        (n_inner < 2 || inner >= 1) && (n_outer < 2 || outer >= (n_inner - 1) * inner + 1);
    if (ok) return SDPA_OK;
    return sdpa_fail(SDPA_ERR_SIZE,
                     "lse's entries share a float (strides %zu, %zu over %zu rows of %zu heads)",
                     b->lse_stride[0], b->lse_stride[1], rows, b->heads_q);
}

/* q's token stride and extent; out and lse against q, the pools and each other */
static sdpa_status views_check(const sdpa_batch *b, const sdpa_kv_cache *c, const batch_sizes *z,
                               const void *out, const void *q, const void *k_pool,
                               const void *v_pool) {
    const size_t rows = z->rows;
    const int reads_keys = z->reads_keys;
    const size_t q_size = sdpa_type_size(b->q_type), d_k = c->d_k, hq = b->heads_q;
    if (!q) return sdpa_fail(SDPA_ERR_NULL, "q is NULL with %zu query rows", rows);
    if (rows > 1 && b->q_stride[0] < d_k)
        return sdpa_fail(SDPA_ERR_SIZE, "batch->q_stride[0] (%zu) is smaller than d_k (%zu)",
                         b->q_stride[0], d_k);
    const size_t q3[3] = {b->q_stride[0], b->q_stride[1], 0};
    if (!sdpa_view_fits_sized(q3, rows, hq, 1, d_k, q_size))
        return sdpa_fail(SDPA_ERR_SIZE, "q's extent is past PTRDIFF_MAX bytes");
    sdpa_status st = b->lse ? lse_check(b, rows) : SDPA_OK;
    if (st != SDPA_OK) return st;
    const size_t out_bytes =
        view_bytes(b->out_stride, rows, hq, c->d_v, sdpa_type_size(b->out_type));
    const size_t lse_bytes = b->lse ? view_bytes(b->lse_stride, rows, hq, 1, sizeof(float)) : 0;
    const size_t q_bytes = view_bytes(b->q_stride, rows, hq, d_k, q_size);
    const size_t k_bytes = reads_keys ? paged_pool_bytes(c, 0) : 0;
    const size_t v_bytes = reads_keys ? paged_pool_bytes(c, 1) : 0;
    const void *written[2] = {out, b->lse};
    const size_t written_bytes[2] = {out_bytes, lse_bytes};
    const size_t ints = sizeof(int32_t), n = b->num_seqs;
    const void *read[6] = {q, k_pool, v_pool, b->q_start, b->kv_len, c->block_table};
    const size_t read_bytes[6] = {q_bytes,        k_bytes,  v_bytes,
                                  (n + 1) * ints, n * ints, z->table_end * ints};
    static const char *const names[8] = {"out",    "lse",     "q",      "k_pool",
                                         "v_pool", "q_start", "kv_len", "block_table"};
    for (int w = 0; w < 2; w++) {
        if (w == 0 && sdpa_bytes_overlap(out, out_bytes, b->lse, lse_bytes))
            return sdpa_fail(SDPA_ERR_SIZE, "out overlaps lse");
        for (int r = 0; r < 6; r++)
            if (sdpa_bytes_overlap(written[w], written_bytes[w], read[r], read_bytes[r]))
                return sdpa_fail(SDPA_ERR_SIZE, "%s overlaps %s", names[w], names[2 + r]);
    }
    return SDPA_OK;
}

/* Every rule of sdpa.h's paged errors; on SDPA_OK *p is the batch's problem (scale resolved,
   causal set) and *z its sizes. */
static sdpa_status paged_check(attention_problem *p, batch_sizes *z, const sdpa_batch *b,
                               const sdpa_kv_cache *c, void *out, const void *q, const void *k_pool,
                               const void *v_pool) {
    sdpa_status st = batch_check(b);
    if (st == SDPA_OK) st = paged_cache_check(c);
    if (st == SDPA_OK) st = sequences_check(b, z);
    if (st != SDPA_OK) return st;
    const int has_rows = z->rows && b->heads_q;
    if (!has_rows) z->reads_keys = 0;
    batch_problem(p, b, c, z->rows, out, q);
    st = sdpa_problem_check(p, b->flags);
    if (st != SDPA_OK || !has_rows) return st;
    if (z->reads_keys) {
        st = paged_pools_check(c, k_pool, v_pool);
        if (st == SDPA_OK) st = table_check(b, c, z);
        if (st != SDPA_OK) return st;
    }
    return views_check(b, c, z, out, q, k_pool, v_pool);
}

/* element `index` of an array of type t */
static void *element(const void *base, size_t index, uint32_t t) {
    return (char *)(uintptr_t)base + index * sdpa_type_size(t);
}

/* The problem of sequence s (rows from r0), keys through its row of the block table. */
static void sequence_problem(attention_problem *p, const attention_problem *whole,
                             const sdpa_batch *b, const sdpa_kv_cache *c, size_t s,
                             const void *k_pool, const void *v_pool) {
    const size_t r0 = (size_t)b->q_start[s], nq = (size_t)b->q_start[s + 1] - r0;
    *p = *whole;
    p->len_q = nq;
    p->len_kv = (size_t)b->kv_len[s];
    p->q = element(whole->q, r0 * b->q_stride[0], b->q_type);
    p->out = element(whole->out, r0 * b->out_stride[0], b->out_type);
    if (b->lse) {
        p->lse = b->lse + r0 * b->lse_stride[0];
        p->lse_stride[1] = b->lse_stride[1];
        p->lse_row = b->lse_stride[0];
    }
    p->k = k_pool;
    p->v = v_pool;
    /* a block is a page; within it, heads and tokens keep the cache's strides */
    memcpy(p->k_stride, (const size_t[3]){0, c->k_stride[1], c->k_stride[2]}, sizeof p->k_stride);
    memcpy(p->v_stride, (const size_t[3]){0, c->v_stride[1], c->v_stride[2]}, sizeof p->v_stride);
    p->pages = c->block_table + s * c->block_table_stride;
    p->page_size = c->block_size;
    p->k_page_stride = c->k_stride[0];
    p->v_page_stride = c->v_stride[0];
}

/* The batch's score modifiers into the problem every sequence copies; segments are the dense
   calls' (a paged batch's sequences are apart already). */
static sdpa_status batch_mods(attention_problem *whole, const sdpa_batch *b) {
    if (!b->mods) return SDPA_OK;
    if (b->mods->struct_size >= sizeof(sdpa_score_mods) &&
        (b->mods->q_segment || b->mods->k_segment))
        return sdpa_fail(SDPA_ERR_ARG, "batch->mods has segments, which a paged call does not "
                                       "take: its sequences are apart already");
    return sdpa_problem_set_mods(whole, b->mods);
}

/* A checked batch and the threads of its call. */
typedef struct paged_call {
    const sdpa_batch *batch;
    const sdpa_kv_cache *cache;
    const attention_problem *whole;
    const void *k_pool, *v_pool;
    size_t threads;
} paged_call;

/* Sequence s, if it has rows and is `shared` (its plan shares it among the call's threads) or
   not as asked. */
static void run_sequence(const paged_call *c, size_t s, int shared) {
    if (c->batch->q_start[s + 1] == c->batch->q_start[s]) return;
    attention_problem p;
    sequence_problem(&p, c->whole, c->batch, c->cache, s, c->k_pool, c->v_pool);
    const int shares = p.len_kv && c->threads > 1 && attention_shares_threads(&p, c->threads);
    if (shares != shared) return;
    if (p.len_kv)
        attention_run_all(&p);
    else
        attention_no_keys(&p);
}

/* a task of sdpa_parallel_run: sequence s if it runs on one thread (as a task, on this one) */
static void one_thread_sequence(void *arg, size_t s) { run_sequence(arg, s, 0); }

SDPA_API sdpa_status sdpa_attention_paged(const sdpa_batch *batch, const sdpa_kv_cache *cache,
                                          void *out, const void *q, const void *k_pool,
                                          const void *v_pool) {
    attention_problem whole;
    batch_sizes z;
    sdpa_status st = paged_check(&whole, &z, batch, cache, out, q, k_pool, v_pool);
    if (st == SDPA_OK) st = batch_mods(&whole, batch);
    if (st != SDPA_OK || !z.rows || !batch->heads_q) return st;
    paged_call c = {batch, cache, &whole, k_pool, v_pool, sdpa_threads_for_call()};
    sdpa_parallel_run(one_thread_sequence, &c, batch->num_seqs, c.threads);
    if (c.threads > 1)
        for (size_t s = 0; s < batch->num_seqs; s++) run_sequence(&c, s, 1);
    return SDPA_OK;
}
