/* Internal: how an attention call's work is cut, for the forward and the backward. A plan is a
 * pure function of the problem's shape, the backend's block of rows and the thread count; the
 * thread count decides only whether to run in parallel, never the units, the chunks or the order
 * of a sum, so the bits depend on the shape alone.
 *
 * Forward: a unit is (batch, query head, block of block_q rows), or for decode with grouped
 * heads (batch, kv head, block of block_q of its query heads). Split-KV also cuts each unit's
 * keys into n_chunks chunks, reduced by chunks.h: chunk 0 writes the output rows, and chunks 1,
 * 2, ... are merged into them in that order.
 * Backward: a unit is (batch, kv head), or the whole axis a gradient sums (a stride of 0). Key
 * chunks cut a unit's keys likewise, and its query rows into parts (a band of rows of one query
 * head); chunk c >= 1 sums its share of a part's dq into a slot, and the slots are added to dq
 * in chunk order. */
#ifndef SDPA_SRC_PLAN_H
#define SDPA_SRC_PLAN_H

#include <stddef.h>

#include "attention_problem.h"
#include "kernels.h"

/* Keys of a piece: every chunk, forward or backward, is whole pieces (the last one may take
   the remainder). A multiple of every backend's block of keys, so a chunk's blocks are those of
   an unsplit run, except for 16-bit K/V with d > 128, whose blocks shrink to SDPA_WIDE_FLOATS /
   d keys (40 at d = 200): a chunk then ends in a shorter block. */
#define KEY_PIECE 512

/* Blocks of query rows a unit of a 16-bit K/V prefill holds: each block of keys and of values
   is widened once for all of them, where one block alone would widen it per 32 rows, a cost of
   about a tenth of the prefill. */
#define ROW_BLOCKS 2

/* Split-KV applies to an f32 out (a 16-bit out is rounded once, from the merged row) and to
   units of few rows (len_q <= SPLIT_MAX_Q, or grouped decode) over at least two pieces, with
   d_v <= SPLIT_MAX_D_V, so that a chunk's partial rows fit a stack tile on one thread. */
#define SPLIT_MAX_Q   16
#define SPLIT_MAX_D_V 256

/* Backward key chunks apply to d_k <= CHUNK_MAX_D, so that a band of whole blocks of sum_rows
   rows fits a stack slot. */
#define CHUNK_MAX_D 256

/* Floats of the stack slots of a reduction run in order (chunks.h): a slot and a state of a
   forward unit (block_q rows of d_v + 2), or a slot of a backward band (band rows of d_k). */
#define CHUNK_STACK_FLOATS (2 * SDPA_ATTN_MAX_BLOCK_Q * (SPLIT_MAX_D_V + 2))

/* A key-chunk reduction, as chunks.h runs it: n_units units, each of n_parts parts over n_chunks
   chunks of keys. */
typedef struct chunk_plan {
    size_t n_units, n_chunks, n_parts;
    size_t slot;    /* floats of one (unit, chunk, part) result; (state + 1) slots fit
                       CHUNK_STACK_FLOATS */
    int state;      /* chunk 0 keeps a slot too: the state its merges update */
    int last_first; /* a unit's tasks take its chunks last first (the last is the longest) */
    int interleave; /* the tasks take chunk i of every unit before chunk i + 1, and one thread
                       runs them so too, in the workspace: units that read memory side by side
                       (a paged cache's kv heads of a block) then read it close in time */
} chunk_plan;

/* Floats of the workspace of the tasks' schedule: a slot a (unit, part, chunk that keeps one). */
static inline size_t chunk_plan_workspace(const chunk_plan *r) {
    return r->n_units * (r->n_chunks - !r->state) * r->n_parts * r->slot;
}

typedef struct forward_plan {
    int grouped;            /* decode with grouped heads: a unit's rows are query heads */
    size_t group;           /* query heads per kv head */
    size_t block_q;         /* rows per unit at most */
    size_t blocks_per_head; /* units per (batch, query head), or per (batch, kv head) if grouped */
    size_t n_units;
    size_t pieces, n_chunks; /* n_chunks == 1: no split */
    size_t slot;             /* floats of one (unit, chunk) partial: rows, maxima, sums */
    size_t workspace;        /* floats of the partials (n_units * n_chunks slots), or 0 */
    int parallel;            /* worth more than one thread */
    int interleave;          /* the units' chunks interleave (chunk_plan) */
} forward_plan;

/* One forward unit: rows [q0, q0 + nq) of query head `head`, or (grouped) query heads
   [head, head + nq) at row 0, all reading kv head kv_head of batch entry `batch`. */
typedef struct plan_unit {
    size_t batch, head, kv_head, q0, nq;
} plan_unit;

/* The forward's plan: block_rows is the backend's block of query rows for this problem,
   packs whether such a block takes the packed path (pack_q, d_k within its limit). */
void plan_forward(forward_plan *pl, const attention_problem *p, size_t block_rows, int packs,
                  size_t threads);

/* Unit u (< n_units). Within a head, the last blocks come first: under causality they see the
   most keys, and the smallest tasks are left to fill the end. */
void plan_forward_unit(const forward_plan *pl, const attention_problem *p, size_t u, plan_unit *x);

/* The keys [*begin, *end) of split chunk c (< n_chunks). */
void plan_forward_chunk(const forward_plan *pl, const attention_problem *p, size_t c, size_t *begin,
                        size_t *end);

/* The units and the split's reduction (chunks.h; one when n_chunks >= 2): a part a unit, and
   chunk 0's maxima and sums its state. */
chunk_plan plan_forward_chunks(const forward_plan *pl);

typedef struct backward_plan {
    size_t group;            /* query heads per kv head */
    size_t task_b, task_h;   /* batch entries and kv heads a unit owns: 1, or the whole axis */
    size_t tasks_b, tasks_h; /* units along each axis */
    size_t n_units;          /* unit u is batch entries from u / tasks_h, kv heads u % tasks_h */
    size_t sum_rows;         /* query rows a block of a key's dk and dv sums (below) */
    size_t n_chunks;         /* key chunks a unit; 0: none */
    size_t chunk_keys;       /* keys of a chunk: whole pieces */
    size_t band, bands;      /* a part: band rows of a query head (whole blocks of sum_rows) */
    size_t slot;             /* floats of one part's dq partial: band rows of d_k */
    size_t workspace;        /* floats of the partials, or 0 */
    int parallel;            /* worth more than one thread */
} backward_plan;

/* A key's dk and dv are summed over sum_rows query rows at a time (rows sum_rows r to sum_rows
   (r + 1) of a head: 8 tiles of SDPA_ATTN_MAX_BLOCK_Q rows, 4 past d_k 64, 2 past d_k 128), from
   0 in stack tiles which are then added to the rows: one chain over every row would add len_q
   roundings, which under a directed rounding mode all err the same way. */
void plan_backward(backward_plan *pl, const backward_problem *bp, size_t threads);

/* The keys [*begin, *end) of key chunk c (< n_chunks) of a problem of len_kv keys. */
void plan_backward_chunk(const backward_plan *pl, size_t len_kv, size_t c, size_t *begin,
                         size_t *end);

/* The units and the key chunks' reduction (chunks.h; one when n_chunks >= 2): part g bands + b
   is rows [b band, (b + 1) band) of query head g of the unit; chunk 0 adds into dq itself and
   keeps no state. */
chunk_plan plan_backward_chunks(const backward_plan *pl);

#endif
