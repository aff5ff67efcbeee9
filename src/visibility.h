/* Internal: which keys a query row sees, the one definition every driver (forward, backward,
 * split-KV chunks) reads.
 *
 * Row i has a position among the keys, p_i = i + shift, with shift = len_kv - len_q for the
 * whole problem (bottom-right alignment), and sees the keys j in [first, end) around it:
 * p_i - before <= j <= p_i + after, each bound dropped when -1 (a window's left and right;
 * causality is after = 0), and 0 <= j < len_kv. A key range cut out of the problem (a split-KV
 * chunk from key k0) is the same rule with shift - k0 and its own length. Segments are not a
 * run of keys: the score stage removes their keys (score_stage.h). */
#ifndef SDPA_SRC_VISIBILITY_H
#define SDPA_SRC_VISIBILITY_H

#include <math.h>
#include <stddef.h>

#include "attention_problem.h"

typedef struct visibility {
    size_t len_kv;    /* keys of the range: rows never see past it */
    ptrdiff_t shift;  /* row i's position among the keys is i * row_step + shift */
    size_t row_step;  /* 1; 0 where the rows are the heads of one query row (grouped decode) */
    ptrdiff_t before; /* a row sees no key before p_i - before; -1: unbounded */
    ptrdiff_t after;  /* nor past p_i + after; -1: unbounded (causality is after = 0) */
    int causal;       /* after <= 0: a row sees no key past its own position */
} visibility;

/* What every row of a block sees of a block of keys. */
typedef enum { VIS_NONE, VIS_PARTIAL, VIS_ALL } visibility_class;

/* The rule of problem p (sizes fit ptrdiff_t: sdpa_problem_check): causality and the window. */
static inline visibility visibility_of(const attention_problem *p) {
    visibility v = {p->len_kv, (ptrdiff_t)p->len_kv - (ptrdiff_t)p->len_q, 1, -1, -1, p->causal};
    /* a window as wide as every row's keys bounds nothing (and keeps positions in ptrdiff_t) */
    const size_t span = p->len_q + p->len_kv;
    if (p->mods.has_window_left && p->mods.window_left < span)
        v.before = (ptrdiff_t)p->mods.window_left;
    if (p->causal) v.after = 0;
    if (p->mods.has_window_right && p->mods.window_right < span &&
        (v.after < 0 || (ptrdiff_t)p->mods.window_right < v.after))
        v.after = (ptrdiff_t)p->mods.window_right;
    v.causal = v.after == 0;
    return v;
}

/* The same rule on the keys [k0, k0 + nk) alone, numbered from 0. */
static inline visibility visibility_keys(const visibility *v, size_t k0, size_t nk) {
    visibility r = *v;
    r.len_kv = nk;
    r.shift = v->shift - (ptrdiff_t)k0;
    return r;
}

/* The same rule for rows that are all at the position of row 0 (grouped decode's heads). */
static inline visibility visibility_one_position(const visibility *v) {
    visibility r = *v;
    r.row_step = 0;
    return r;
}

static inline size_t visibility_clamp(const visibility *v, ptrdiff_t x) {
    return x <= 0 ? 0 : (size_t)x < v->len_kv ? (size_t)x : v->len_kv;
}

/* The first key row i sees (its end when it sees none). */
static inline size_t visibility_row_first(const visibility *v, size_t i) {
    if (v->before < 0) return 0;
    return visibility_clamp(v, (ptrdiff_t)i * (ptrdiff_t)v->row_step + v->shift - v->before);
}

/* One past the last key row i sees (at most its first when it sees none). */
static inline size_t visibility_row_end(const visibility *v, size_t i) {
    if (v->after < 0) return v->len_kv;
    return visibility_clamp(v, (ptrdiff_t)i * (ptrdiff_t)v->row_step + v->shift + v->after + 1);
}

/* The first row that sees key j under the rule's upper bound (any number past the last row when
   none does); with a window, rows from there on may already have left it behind. */
static inline size_t visibility_first_row(const visibility *v, size_t j) {
    if (v->after < 0 || v->row_step == 0) return 0;
    const ptrdiff_t first = (ptrdiff_t)j - v->shift - v->after;
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

/* In a key-major tile st (key j's line at st + j * ld, row r's entry at r), -inf for every pair
   of lines [j0, nk) (keys k0 + j) and rows r < nq where the row does not see the key: it sees
   [from[r], end[r]), each non-decreasing in r as the rule makes them, so a line's hidden rows are
   a run at each end. */
static inline void visibility_hide_keymajor(float *st, size_t ld, const size_t *from,
                                            const size_t *end, size_t nq, size_t k0, size_t j0,
                                            size_t nk) {
    size_t ended = 0, started = 0; /* rows that have left key k0 + j behind; that have reached it */
    for (size_t j = j0; j < nk; j++) {
        while (ended < nq && end[ended] <= k0 + j) ended++;
        while (started < nq && from[started] <= k0 + j) started++;
        float *line = st + j * ld;
        for (size_t r = 0; r < ended; r++) line[r] = -INFINITY;
        for (size_t r = started; r < nq; r++) line[r] = -INFINITY;
    }
}

#endif
