/* Internal: the executor, the FlashAttention loop over the keys of one head for a block of
 * query rows (attention_block.c says how it runs). Every driver (the dense calls and their
 * split-KV chunks) hands it rows and keys; it never sees a descriptor. */
#ifndef SDPA_SRC_ATTENTION_BLOCK_H
#define SDPA_SRC_ATTENTION_BLOCK_H

#include <stddef.h>

#include "attention_problem.h"
#include "kernels.h"
#include "key_source.h"
#include "score_stage.h"
#include "visibility.h"

struct wide_tiles;

/* Kernels and per-call constants of one run. */
typedef struct attention_run {
    const sdpa_kernels *k;
    const sdpa_attention_kernels *a;
    size_t rows_max, keys_max; /* a block's queries and keys: the table's tile, or fewer where a
                                  16-bit view's widened rows must fit SDPA_WIDE_FLOATS */
    struct wide_tiles *wide;   /* NULL when every view is f32 */
    const sdpa_bf16_dot_kernels *bf16_dot; /* bf16 Q and K and the add-on on; else NULL */
    int typed_k, typed_v; /* the typed entries take K, V as they are (attention_block.c, typed) */
    float (*exp_sum)(float *y, const float *x, size_t n, float scale, float shift);
    void (*exp_tile)(float *s, size_t ld_s, size_t nq, size_t nk, const float *shift, float *sums);
    void (*exp_pv)(float *acc, size_t ld_acc, float *st, size_t ld_st, const float *m,
                   const float *m_new, float *alpha, float *sums, size_t nq, size_t nk,
                   const float *v, size_t v_stride, size_t d_v);
} attention_run;

/* The run of problem p: its kernels, and its blocks of rows and keys. Returns whether a view is
   16-bit, so that the tasks need the widening tiles (attention_with_tiles). */
int attention_run_init(attention_run *run, const attention_problem *p);

/* Query rows [q0, q0 + nq) of p (one head: q and out at its first row; its keys and values
   from src) against the keys they see (vis), normalised into out with their log-sum-exps into lse
   (lse_row floats apart, or NULL); or, with part_l (a split-KV chunk, f32 out), the unnormalised
   state a merge takes: the rows as they are, each row's max to lse and its sum to part_l (NaN if
   poisoned). */
void attention_block(const attention_run *run, const attention_problem *p, const visibility *vis,
                     const void *q, const key_source *src, const score_stage *stage, void *out,
                     float *lse, size_t lse_row, float *part_l, size_t q0, size_t nq);

/* Row o (d_v floats) from its unnormalised state: acc (may be o), the max m of its scores and
   the sum l of their exps (NaN: a poisoned row), and its sink (-inf: none), as sdpa.h states:
   acc / (l + e^(sink - m)), times v_scale (an 8-bit V's; 0: 1), zeros for a row with no key.
   Returns the row's log-sum-exp, or 0 without lse (a double log a row that no caller reads). */
float attention_row_finish(const sdpa_kernels *k, float *o, const float *acc, size_t d_v, float m,
                           double l, float sink, float v_scale, int lse);

typedef void (*block_fn)(const attention_run *run, const void *ctx, size_t index);

/* fn(run, ctx, index) on this thread, with run = *base and, when wide, the widening tiles on
   this thread's stack. */
void attention_with_tiles(block_fn fn, const attention_run *base, int wide, const void *ctx,
                          size_t index);

#endif
