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

typedef struct key_source {
    uint32_t type;             /* of k and v (sdpa_dtype) */
    size_t d_k, d_v;           /* elements of a key, of a value */
    const void *k, *v;         /* the head's key 0 and value 0 (paged: in page 0 of the pool) */
    size_t k_stride, v_stride; /* elements between the rows of a run */
    size_t first;              /* key 0 of the source is key `first` of the head */
    const int32_t *pages;      /* NULL: dense, one run */
    size_t page_size, k_page_stride, v_page_stride;
} key_source;

/* The keys and values of problem p's head at k and v (as attention.c's units find them), from
   key `first`. */
static inline key_source key_source_of(const attention_problem *p, const void *k, const void *v,
                                       size_t first) {
    key_source s = {p->kv_type, p->d_k,         p->d_v,           k,
                    v,          p->k_stride[2], p->v_stride[2],   first,
                    p->pages,   p->page_size,   p->k_page_stride, p->v_page_stride};
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

#endif
