/* The key source's rows (key_source.h): a block of keys or values as the kernels read it,
 * in place a page at a time, gathered, or widened to float; an 8-bit block read as it is where
 * the backend's kernels widen it in their loads, else widened to f16 rows first, which the
 * 16-bit kernels then read as they read an f16 cache. */
#include <stdint.h>
#include <string.h>

#include "attention_problem.h"
#include "fp8.h"
#include "key_source.h"

const float *key_rows_as_floats(const sdpa_kernels *k, uint32_t type, const void *base, size_t r0,
                                size_t n, size_t stride, size_t row, float *tile,
                                size_t *float_stride) {
    if (type == SDPA_F32) {
        *float_stride = stride;
        return (const float *)base + r0 * stride;
    }
    *float_stride = row;
    const uint16_t *src = (const uint16_t *)base + r0 * stride;
    if (stride == row || n == 1) {
        k->widen[type](tile, src, n * row);
    } else {
        for (size_t i = 0; i < n; i++) k->widen[type](tile + i * row, src + i * stride, row);
    }
    *float_stride = row;
    return tile;
}

/* The stride at which the rows of a page (rows `stride` apart, pages `page_stride`) go on into
   the page after it in the pool, 0 where they do not: a token table's slot to the next slot, or
   a short page whose page stride is its rows'. Only pages shorter than RUN_MIN_KEYS join: a block
   of them is gathered unless it is one run, whose kernels then give the bits of its gather. Longer
   pages are read in place a page at a time, and a join would move a P V split with the table. */
static size_t pages_join(size_t page_size, size_t stride, size_t page_stride) {
    if (page_size >= RUN_MIN_KEYS) return 0;
    if (page_size == 1) return page_stride;
    return page_stride == page_size * stride ? stride : 0;
}

/* Whether pages [p0, p1] of a table follow one another in the pool (a block's that do are one run:
   a token table whose slots run in order then streams like a dense cache); the first and last
   first, which a random table fails at once. Entries were checked: differences do not overflow. */
static int pages_in_order(const int32_t *pages, size_t p0, size_t p1) {
    if (pages[p1] - pages[p0] != (int64_t)(p1 - p0)) return 0;
    for (size_t p = p0; p < p1; p++)
        if (pages[p + 1] - 1 != pages[p]) return 0;
    return 1;
}

/* The first row read after key j of a source's view (values: 0 keys, 1 values): its own key j,
   else the next task's first, else NULL (none known). */
static const void *rows_after(const key_source *src, int values, size_t j) {
    const void *row = NULL;
    if (j < src->keys)
        key_source_run(src, values, j, 1, &row);
    else if (src->next && src->next->keys)
        key_source_run(src->next, values, 0, 1, &row);
    return row;
}

/* Keys [k0, k0 + nk) of a source's view (values: 0 keys, 1 values) into r as in-place runs of
   the source's type: key_source_run's rows, the page found once and then stepped (a division a
   key would cost a token table more than its copy), or one run where short pages join. */
static void page_runs(const key_source *src, int values, size_t k0, size_t nk, row_runs *r) {
    if (!src->pages) {
        const void *row;
        key_source_run(src, values, k0, nk, &row);
        row_runs_one(r, row, values ? src->v_stride : src->k_stride, nk);
        return;
    }
    const size_t size = sdpa_type_size(src->type), stride = values ? src->v_stride : src->k_stride;
    const size_t page_stride = values ? src->v_page_stride : src->k_page_stride;
    const char *base = (const char *)(values ? src->v : src->k);
    const size_t j = k0 + src->first, page_size = src->page_size;
    const size_t join = pages_join(page_size, stride, page_stride);
    size_t page = j / page_size, in_page = j % page_size;
    const int one = join && nk && pages_in_order(src->pages, page, (j + nk - 1) / page_size);
    r->n = 0;
    r->stride = one ? join : stride;
    for (size_t i = 0; i < nk; r->n++, page++, in_page = 0) {
        r->at[r->n] = i;
        r->row[r->n] = base + ((size_t)src->pages[page] * page_stride + in_page * stride) * size;
        if (r->n) r->ahead[r->n - 1] = r->row[r->n];
        i += one ? nk : page_size - in_page < nk - i ? page_size - in_page : nk - i;
    }
    r->at[r->n] = nk;
    if (r->n) r->ahead[r->n - 1] = rows_after(src, values, k0 + nk);
}

/* Bytes of rows ahead of the one gathered that are prefetched: short pages give the hardware's
   prefetchers nothing to follow, and a row from memory takes as long as copying dozens. A block
   of 64 rows of 128 halves, all at once: less left the core waiting on memory more often. */
#define AHEAD_BYTES 16384

/* Rows of `bytes` bytes prefetched ahead */
static size_t rows_ahead(size_t bytes) { return AHEAD_BYTES / bytes + 1; }

/* A position in runs, row `row` of run `run`, that prefetches the rows it passes. */
typedef struct row_cursor {
    const row_runs *r;
    size_t run, row, bytes, size; /* bytes of a row, of an element */
} row_cursor;

/* Prefetches the cursor's next n rows and steps past them. */
static void cursor_prefetch(row_cursor *c, size_t n) {
    const row_runs *r = c->r;
    for (; n && c->run < r->n; n--) {
        const char *row = (const char *)r->row[c->run] + c->row * r->stride * c->size;
        for (size_t b = 0; b < c->bytes; b += 64) __builtin_prefetch(row + b);
        if (++c->row == r->at[c->run + 1] - r->at[c->run]) c->run++, c->row = 0;
    }
}

void rows_prefetch(const void *base, size_t stride, size_t bytes, size_t r0, size_t r1, int write) {
    for (size_t r = r0; r < r1; r++)
        for (size_t b = 0; b < bytes; b += 64) {
            if (write)
                __builtin_prefetch((const char *)base + r * stride + b, 1);
            else
                __builtin_prefetch((const char *)base + r * stride + b);
        }
}

int block_rows_finite(const sdpa_kernels *k, const block_rows *r, size_t j0, size_t nk, size_t d) {
    const row_runs *f = &r->f;
    if (r->h.n) return 0;
    for (size_t i = 0; i < f->n && f->at[i] < nk; i++) {
        size_t from;
        const size_t n = run_part(f, i, j0, nk, &from);
        if (!n) continue;
        const float *row = (const float *)f->row[i] + (from - f->at[i]) * f->stride;
        if (!k->rows_finite(row, f->stride, n, d)) return 0;
    }
    return 1;
}

void key_source_prefetch(const key_source *src, size_t k0, size_t n) {
    const size_t size = sdpa_type_size(src->type);
    for (int values = 0; values < 2; values++) {
        const size_t bytes = (values ? src->d_v : src->d_k) * size;
        const size_t stride = (values ? src->v_stride : src->k_stride) * size;
        for (size_t j = k0, m; j < k0 + n; j += m) {
            const void *run;
            m = key_source_run(src, values, j, k0 + n - j, &run);
            rows_prefetch(run, stride, bytes, 0, m, 0);
        }
    }
}

/* A row's bytes in 64-byte pieces of a size the compiler knows: a call to memcpy a row of a
   token table would cost as much as the copy. */
static inline void copy_row(char *to, const char *from, size_t bytes) {
    size_t b = 0;
    for (; b + 64 <= bytes; b += 64) memcpy(to + b, from + b, 64);
    if (b < bytes) memcpy(to + b, from + b, bytes - b);
}

/* The runs of `in` (the source's type) gathered into tile as one run of rows d apart: widened
   to float when widen, else copied as they are. Rows of several runs (pages) are prefetched
   ahead; one run (a dense block) is a stream the hardware's prefetchers follow, where the same
   prefetches cost a 16-bit prefill a few percent. */
static void gather_runs(const sdpa_kernels *k, uint32_t type, const row_runs *in, size_t d,
                        int widen, void *tile, row_runs *out) {
    const size_t in_size = sdpa_type_size(type), size = widen ? sizeof(float) : in_size;
    row_cursor ahead = {in, 0, 0, d * in_size, in_size};
    if (in->n > 1) cursor_prefetch(&ahead, rows_ahead(d * in_size));
    for (size_t i = 0; i < in->n; i++) {
        const size_t n = in->at[i + 1] - in->at[i];
        if (in->n > 1) cursor_prefetch(&ahead, n);
        char *to = (char *)tile + in->at[i] * d * size;
        const char *from = in->row[i];
        size_t unused;
        if (widen && type != SDPA_F32)
            key_rows_as_floats(k, type, from, 0, n, in->stride, d, (float *)to, &unused);
        else if (in->stride == d)
            copy_row(to, from, n * d * size);
        else
            for (size_t r = 0; r < n; r++)
                copy_row(to + r * d * size, from + r * in->stride * size, d * size);
    }
    row_runs_one(out, tile, d, in->at[in->n]);
}

/* Rows ahead of the one widened whose lines are prefetched: decode reads an 8-bit cache from
   beyond L2 through this loop alone, a conversion and a store a vector, too little work for
   the out-of-order window to keep enough misses in flight (an address past the run, the next
   block's rows in a dense layout, is fine: a prefetch never faults). */
#define FP8_AHEAD 16

/* Bytes widened a call where rows are back to back, each call prefetching as many of the next
   block's: between blocks the kernels compute and nothing else keeps misses in flight. */
#define FP8_PIECE 1024

/* The runs of `in` (8-bit) widened to f16 into tile as one run of rows d apart. */
static void fp8_runs_as_f16(const sdpa_kernels *k, uint32_t type, const row_runs *in, size_t d,
                            uint16_t *tile, row_runs *out) {
    void (*widen)(uint16_t *, const uint8_t *, size_t) = k->widen_fp8[type - SDPA_TYPE_FP8_E4M3];
    for (size_t i = 0; i < in->n; i++) {
        const uint8_t *row = in->row[i];
        uint16_t *to = tile + in->at[i] * d;
        const size_t n = in->at[i + 1] - in->at[i];
        if (in->stride == d) { /* rows back to back: the next block's follow them */
            for (size_t c = 0; c < n * d; c += FP8_PIECE) {
                const size_t m = n * d - c < FP8_PIECE ? n * d - c : FP8_PIECE;
                for (size_t b = 0; b < m; b += 64) __builtin_prefetch(row + n * d + c + b);
                widen(to + c, row + c, m);
            }
            continue;
        }
        for (size_t r = 0; r < n; r++) {
            for (size_t b = 0; b < d; b += 64)
                __builtin_prefetch(row + (r + FP8_AHEAD) * in->stride + b);
            widen(to + r * d, row + r * in->stride, d);
        }
    }
    row_runs_one(out, tile, d, in->at[in->n]);
}

/* `to` = `from`, its runs alone: a whole row_runs is kilobytes, which a decode would copy
   twice a block of keys. */
static void copy_runs(row_runs *to, const row_runs *from) {
    to->type = from->type;
    to->n = from->n;
    to->stride = from->stride;
    /* a loop: a dense block has one run, which memcpy's rep movs would take longer to copy */
    for (size_t i = 0; i < from->n; i++) {
        to->at[i] = from->at[i];
        to->row[i] = from->row[i];
        to->ahead[i] = from->ahead[i];
    }
    to->at[from->n] = from->at[from->n];
}

/* One run (dense, or within a page) is read in place where the type allows. A block across
   pages is read in place a page at a time where every kernel takes runs (!whole) and pages
   hold RUN_MIN_KEYS; otherwise it is gathered into the tiles. Either way each key meets the
   same kernel in the same order as dense, so only a P V split at a page may round otherwise. */
void key_rows_any(const sdpa_kernels *k, const key_source *src, int values, size_t k0, size_t nk,
                  int as_float, int as_16, int whole, float *tile_f, uint16_t *tile_h,
                  block_rows *r) {
    const size_t d = values ? src->d_v : src->d_k;
    row_runs in;
    page_runs(src, values, k0, nk, &in);
    in.type = src->type;
    r->f.n = r->h.n = 0;
    r->f.type = SDPA_F32;
    r->h.type = src->type;
    /* 8-bit rows as they are, for kernels that widen them in their loads */
    const int fp8_as_is = sdpa_type_is_fp8(src->type) && as_16 && !as_float &&
                          k->attention->scores_tile_fp8[src->type - SDPA_TYPE_FP8_E4M3];
    if (sdpa_type_is_fp8(src->type) && as_float && !as_16 &&
        !k->attention->scores_tile_typed[SDPA_F16]) {
        /* a backend without 16-bit loads (scalar) converts an element at a time: one table
           load each, the values of the two conversions below */
        const float *table = sdpa_fp8_kernel_floats(src->type);
        for (size_t i = 0; i < in.n; i++)
            for (size_t j = in.at[i]; j < in.at[i + 1]; j++) {
                const uint8_t *row = (const uint8_t *)in.row[i] + (j - in.at[i]) * in.stride;
                for (size_t c = 0; c < d; c++) tile_f[j * d + c] = table[row[c]];
            }
        row_runs_one(&r->f, tile_f, d, nk);
        return;
    }
    if (sdpa_type_is_fp8(src->type) && (as_float || as_16) && !fp8_as_is) {
        /* widened to f16 rows (and from them, when asked, to float rows in one call) */
        fp8_runs_as_f16(k, src->type, &in, d, tile_h, &r->h);
        r->h.type = SDPA_F16;
        if (as_float) {
            k->widen[SDPA_F16](tile_f, tile_h, nk * d);
            row_runs_one(&r->f, tile_f, d, nk);
        }
        if (!as_16) r->h.n = 0;
        return;
    }
    const int gather = in.n > 1 && (whole || src->page_size < RUN_MIN_KEYS);
    if (as_float && (src->type != SDPA_F32 || gather)) /* widened or gathered: one run */
        gather_runs(k, src->type, &in, d, 1, tile_f, &r->f);
    else if (as_float)
        copy_runs(&r->f, &in);
    if (as_16) {
        if (gather)
            gather_runs(k, src->type, &in, d, 0, tile_h, &r->h);
        else
            copy_runs(&r->h, &in);
        r->h.type = src->type;
    }
}
