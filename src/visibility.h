/* Internal: which keys a query row sees, the one definition every driver (forward, backward,
 * split-KV chunks) reads.
 *
 * Row i has a position among the keys, p_i = i + shift, with shift = len_kv - len_q for the
 * whole problem (bottom-right alignment), and sees the keys j in [first, end) around it. Under
 * causality that is 0 <= j <= p_i; with no rule, every key. A key range cut out of the problem
 * (a split-KV chunk from key k0) is the same rule with shift - k0 and its own length.
 * Windows and segments are bounds on the same p_i, added here when they come. */
#ifndef SDPA_SRC_VISIBILITY_H
#define SDPA_SRC_VISIBILITY_H

#include <stddef.h>

#include "attention_problem.h"

typedef struct visibility {
    size_t len_kv;   /* keys of the range: rows never see past it */
    ptrdiff_t shift; /* row i's position among the keys is i + shift */
    int causal;      /* a row sees no key past its own position */
} visibility;

/* What every row of a block sees of a block of keys. */
typedef enum { VIS_NONE, VIS_PARTIAL, VIS_ALL } visibility_class;

/* The rule of problem p (sizes fit ptrdiff_t: sdpa_problem_check). */
static inline visibility visibility_of(const attention_problem *p) {
    visibility v = {p->len_kv, (ptrdiff_t)p->len_kv - (ptrdiff_t)p->len_q, p->causal};
    return v;
}

/* The same rule on the keys [k0, k0 + nk) alone, numbered from 0. */
static inline visibility visibility_keys(const visibility *v, size_t k0, size_t nk) {
    visibility r = {nk, v->shift - (ptrdiff_t)k0, v->causal};
    return r;
}

/* The first key row i sees. */
static inline size_t visibility_row_first(const visibility *v, size_t i) {
    (void)v;
    (void)i;
    return 0;
}

/* One past the last key row i sees (the first when it sees none). */
static inline size_t visibility_row_end(const visibility *v, size_t i) {
    if (!v->causal) return v->len_kv;
    const ptrdiff_t end = (ptrdiff_t)i + v->shift + 1;
    return end <= 0 ? 0 : (size_t)end < v->len_kv ? (size_t)end : v->len_kv;
}

/* The first row that sees key j (any number past the last row when none does). */
static inline size_t visibility_first_row(const visibility *v, size_t j) {
    if (!v->causal) return 0;
    const ptrdiff_t first = (ptrdiff_t)j - v->shift;
    return first <= 0 ? 0 : (size_t)first;
}

/* Rows [q0, q0 + nq) against keys [k0, k0 + nk), both non-empty. A row's keys are one run
   whose first and end never fall as the row grows, so the first row and the last decide. */
static inline visibility_class visibility_block(const visibility *v, size_t q0, size_t nq,
                                                size_t k0, size_t nk) {
    const size_t last = q0 + nq - 1;
    if (visibility_row_end(v, last) <= k0 || visibility_row_first(v, q0) >= k0 + nk)
        return VIS_NONE;
    if (visibility_row_first(v, last) <= k0 && visibility_row_end(v, q0) >= k0 + nk) return VIS_ALL;
    return VIS_PARTIAL;
}

#endif
