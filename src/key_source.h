/* Internal: where a head's keys and values come from, the executor's one view of K and V.
 *
 * The executor asks for keys [k0, k0 + n) and gets rows: a pointer, a type and a stride. Dense
 * views are rows a stride apart; a paged cache (sdpa_attention_paged) is pages of page_size rows
 * that a table places anywhere in a pool, so a request is cut into runs at page boundaries,
 * each of them rows a stride apart. Keys are numbered from `first` of the head's keys, so that a
 * split-KV chunk is the same source from its first key. */
#ifndef SDPA_SRC_KEY_SOURCE_H
#define SDPA_SRC_KEY_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include "attention_problem.h"
#include "kernels.h"

typedef struct key_source {
    uint32_t type;             /* of k and v (sdpa_dtype) */
    size_t d_k, d_v;           /* elements of a key, of a value */
    const void *k, *v;         /* the head's key 0 and value 0 (paged: in page 0 of the pool) */
    size_t k_stride, v_stride; /* elements between the rows of a run */
    size_t first;              /* key 0 of the source is key `first` of the head */
    const int32_t *pages;      /* NULL: dense, one run */
    size_t page_size, k_page_stride, v_page_stride;
    size_t keys; /* keys from first that the source holds */
    /* The source of the task that runs next on this thread (chunk_plan's interleave), or NULL:
       past this source's last key, the kernels read ahead into that task's first rows
       (kernels.h, ahead). */
    const struct key_source *next;
} key_source;

/* Pages shorter than this are gathered even for kernels that take runs: a call a run would
   cost more than the copy. */
#define RUN_MIN_KEYS 8

/* The keys and values of problem p's head at k and v (as attention.c's units find them), from
   key `first`, with no next task known. */
static inline key_source key_source_of(const attention_problem *p, const void *k, const void *v,
                                       size_t first) {
    key_source s = {.type = p->kv_type,
                    .d_k = p->d_k,
                    .d_v = p->d_v,
                    .k = k,
                    .v = v,
                    .k_stride = p->k_stride[2],
                    .v_stride = p->v_stride[2],
                    .first = first,
                    .pages = p->pages,
                    .page_size = p->page_size,
                    .k_page_stride = p->k_page_stride,
                    .v_page_stride = p->v_page_stride,
                    .keys = p->len_kv - first,
                    .next = NULL};
    return s;
}

/* The run from key j of the keys (values: 0) or values (1): its first row at *row, and how many
   of the n keys from j it holds (n for a dense source). */
static inline size_t key_source_run(const key_source *s, int values, size_t j, size_t n,
                                    const void **row) {
    const size_t size = sdpa_type_size(s->type), stride = values ? s->v_stride : s->k_stride;
    const char *base = (const char *)(values ? s->v : s->k);
    j += s->first;
    if (!s->pages) {
        *row = base + j * stride * size;
        return n;
    }
    const size_t in_page = j % s->page_size, page = (size_t)s->pages[j / s->page_size];
    *row = base + (page * (values ? s->v_page_stride : s->k_page_stride) + in_page * stride) * size;
    return s->page_size - in_page < n ? s->page_size - in_page : n;
}

/* Rows of a block of keys or values as a kernel reads them: runs, run i being keys [at[i],
   at[i + 1]) of the block from row[i], stride elements apart (floats once widened), the rows
   read after it at ahead[i] (the next page's, the next block's or the next task's; NULL: those
   that follow in memory). One run when dense, gathered or
   widened; n = 0 where no kernel asked for this form. type: the rows' element type
   (sdpa_dtype), set for the rows as they are (h). */
typedef struct row_runs {
    uint32_t type;
    size_t n, stride;
    size_t at[SDPA_ATTN_MAX_BLOCK_KV + 1];
    const void *row[SDPA_ATTN_MAX_BLOCK_KV], *ahead[SDPA_ATTN_MAX_BLOCK_KV];
} row_runs;

/* A block as float rows (f) and as the 16-bit rows themselves (h). */
typedef struct block_rows {
    row_runs f, h;
} block_rows;

/* Rows [r0, r0 + n) of a view, `stride` elements apart, as float rows of `row` floats: in place
   for f32 (*float_stride = stride), else (16-bit) widened into tile (*float_stride = row). */
const float *key_rows_as_floats(const sdpa_kernels *k, uint32_t type, const void *base, size_t r0,
                                size_t n, size_t stride, size_t row, float *tile,
                                size_t *float_stride);

/* key_rows_of's every case: pages, gathers, widening, 8-bit rows. */
void key_rows_any(const sdpa_kernels *k, const key_source *src, int values, size_t k0, size_t nk,
                  int as_float, int as_16, int whole, float *tile_f, uint16_t *tile_h,
                  block_rows *r);

/* The keys of run i of r within [j, end): the first at *from, and how many (0: the run ends by
   j). */
static inline size_t run_part(const row_runs *r, size_t i, size_t j, size_t end, size_t *from) {
    if (r->at[i + 1] <= j) return 0;
    *from = r->at[i] > j ? r->at[i] : j;
    return (r->at[i + 1] < end ? r->at[i + 1] : end) - *from;
}

/* One run of rows in place: keys [0, nk) from row, stride elements apart. */
static inline void row_runs_one(row_runs *r, const void *row, size_t stride, size_t nk) {
    r->n = 1;
    r->stride = stride;
    r->at[0] = 0;
    r->at[1] = nk;
    r->row[0] = row;
    r->ahead[0] = NULL;
}

/* Keys (values: 0) or values (1) [k0, k0 + nk) of src into r: as float rows when as_float (into
   tile_f, keys_max x d floats, when they must be widened or gathered), as the 16-bit rows when
   as_16 (a 16-bit source, gathered into tile_h; an 8-bit one as it is where the backend's
   kernels widen it in their loads (kernels.h, scores_tile_fp8) and no float rows are asked
   for, else widened into tile_h to f16 by the backend's widen_fp8, e4m3 at 2^-8 of its values,
   as its float rows are too: r->h.type says which); whole: every kernel that reads them wants
   one run (the packed and fused ones). A dense block read in place (f32 rows as floats, 16-bit rows
   as they are) is inline: a decode pays for this twice a block of keys, beside kernels of a few
   hundred cycles. */
static inline void key_rows_of(const sdpa_kernels *k, const key_source *src, int values, size_t k0,
                               size_t nk, int as_float, int as_16, int whole, float *tile_f,
                               uint16_t *tile_h, block_rows *r) {
    const int f32 = src->type == SDPA_F32, h16 = !f32 && src->type <= SDPA_BF16;
    if (src->pages || src->next || !(f32 ? as_float && !as_16 : h16 && as_16 && !as_float)) {
        key_rows_any(k, src, values, k0, nk, as_float, as_16, whole, tile_f, tile_h, r);
        return;
    }
    const void *row;
    key_source_run(src, values, k0, nk, &row);
    r->f.n = r->h.n = 0;
    r->f.type = SDPA_F32;
    r->h.type = src->type;
    row_runs_one(f32 ? &r->f : &r->h, row, values ? src->v_stride : src->k_stride, nk);
}

/* Rows [r0, r1) of `bytes` bytes each, `stride` bytes apart from base, into the caches (write:
   for writing). */
void rows_prefetch(const void *base, size_t stride, size_t bytes, size_t r0, size_t r1, int write);

/* Where a kernel that reads run i of r up to key `end` reads ahead past it: ahead[i] at the
   run's end, else (NULL) the run's own rows that follow. */
static inline const void *run_ahead(const row_runs *r, size_t i, size_t end) {
    return end < r->at[i + 1] ? NULL : r->ahead[i];
}

/* The first rows of run i + 1 of r (rows of d elements of `size` bytes), while run i is read,
   for the float kernels, which take no ahead rows: past a page, the rows that follow in memory
   are not the next page's. */
static inline void key_rows_prefetch_next(const row_runs *r, size_t i, size_t d, size_t size) {
    if (i + 1 >= r->n) return;
    const size_t n = r->at[i + 2] - r->at[i + 1];
    rows_prefetch(r->row[i + 1], r->stride * size, d * size, 0, n < 16 ? n : 16, 0);
}

/* Whether the float rows [j0, nk) of r (d floats each) hold no inf or NaN (the table's
   rows_finite, run by run): a weight of 0 then gives them a product of 0. Rows with 16-bit ones
   (h) give 0, which callers take as "not known". */
int block_rows_finite(const sdpa_kernels *k, const block_rows *r, size_t j0, size_t nk, size_t d);

/* The keys and values [k0, k0 + n) of src into the caches, for a block that reads them later. */
void key_source_prefetch(const key_source *src, size_t k0, size_t n);

#endif
