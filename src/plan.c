/* How an attention call's work is cut (plan.h): pure functions of the shape. */
#include "plan.h"

#include "key_source.h"
#include "threads.h"

/* Split-KV: as many chunks a unit as there are pieces, but no more than give about SPLIT_TASKS
   tasks. */
#define SPLIT_TASKS 128

/* Backward key chunks: about CHUNK_TASKS tasks, with at most CHUNK_FLOATS of dq partials (16
   MiB; the workspace rounds each head's rows up to whole bands), for calls of fewer units than
   that. */
#define CHUNK_TASKS  16
#define CHUNK_FLOATS ((size_t)1 << 22)

/* The forward's work in multiply-adds, roughly: the scores and weighted sums of every row, and
   each unit's pass over its K and V, a float of which costs about as much as 8 multiply-adds
   when it comes from memory (what makes decode worth splitting). */
static double forward_work(const attention_problem *p, size_t n_units) {
    double keys = (double)p->len_kv;
    if (p->causal) keys -= 0.5 * (double)p->len_q;
    if (keys < 1.0) keys = 1.0;
    const double row_floats = keys * (double)(p->d_k + p->d_v);
    return (double)p->batch * (double)p->heads_q * (double)p->len_q * row_floats +
           8.0 * (double)n_units * row_floats;
}

void plan_forward(forward_plan *pl, const attention_problem *p, size_t block_rows, int packs,
                  size_t threads) {
    pl->group = p->heads_q / p->heads_kv;
    pl->grouped = p->len_q == 1 && pl->group > 1;
    /* a 16-bit K/V prefill: ROW_BLOCKS blocks of rows a unit (never split: len_q > SPLIT_MAX_Q) */
    pl->block_q = block_rows;
    if (p->kv_type != SDPA_F32 && !pl->grouped && p->len_q > SPLIT_MAX_Q && packs)
        pl->block_q *= ROW_BLOCKS;
    const size_t rows = pl->grouped ? pl->group : p->len_q;
    pl->blocks_per_head = (rows + pl->block_q - 1) / pl->block_q;
    pl->n_units = p->batch * (pl->grouped ? p->heads_kv : p->heads_q) * pl->blocks_per_head;
    pl->pieces = p->len_kv / KEY_PIECE;
    pl->n_chunks = 1;
    /* a split unit's rows start at the head's first (its chunks have no q0): one block a head */
    if (p->out_type == SDPA_F32 &&
        (pl->grouped || (p->len_q <= SPLIT_MAX_Q && pl->blocks_per_head == 1)) &&
        p->d_v <= SPLIT_MAX_D_V && pl->pieces >= 2) {
        const size_t want = (SPLIT_TASKS + pl->n_units - 1) / pl->n_units;
        pl->n_chunks = pl->pieces < want ? pl->pieces : want;
    }
    pl->slot = pl->block_q * (p->d_v + 2);
    /* Pages read in place interleave the units' chunks: the next task reads the next kv head's
       pages of the same blocks, beside these in vLLM's layout (measured faster so), and a
       chunk's kernels read ahead into its first. Gathered pages measured slower so. */
    pl->interleave = p->pages && p->page_size >= RUN_MIN_KEYS;
    const chunk_plan r = plan_forward_chunks(pl);
    pl->workspace = pl->n_chunks > 1 ? chunk_plan_workspace(&r) : 0;
    pl->parallel = threads > 1 && forward_work(p, pl->n_units) >= (double)SDPA_PARALLEL_MIN_WORK;
}

void plan_forward_unit(const forward_plan *pl, const attention_problem *p, size_t u, plan_unit *x) {
    const size_t block = u % pl->blocks_per_head, rest = u / pl->blocks_per_head;
    if (pl->grouped) {
        const size_t g0 = block * pl->block_q;
        x->kv_head = rest % p->heads_kv;
        x->batch = rest / p->heads_kv;
        x->head = x->kv_head * pl->group + g0;
        x->q0 = 0;
        x->nq = pl->group - g0 < pl->block_q ? pl->group - g0 : pl->block_q;
    } else {
        x->head = rest % p->heads_q;
        x->batch = rest / p->heads_q;
        x->kv_head = x->head / pl->group;
        x->q0 = (pl->blocks_per_head - 1 - block) * pl->block_q;
        x->nq = p->len_q - x->q0 < pl->block_q ? p->len_q - x->q0 : pl->block_q;
    }
}

chunk_plan plan_forward_chunks(const forward_plan *pl) {
    const chunk_plan r = {pl->n_units, pl->n_chunks, 1, pl->slot, 1, 1, pl->interleave};
    return r;
}

void plan_forward_chunk(const forward_plan *pl, const attention_problem *p, size_t c, size_t *begin,
                        size_t *end) {
    *begin = KEY_PIECE * (c * pl->pieces / pl->n_chunks);
    *end = c + 1 == pl->n_chunks ? p->len_kv : KEY_PIECE * ((c + 1) * pl->pieces / pl->n_chunks);
}

/* The backward's key chunks of a call with few units, or 0 (none). */
static size_t backward_chunks(const backward_plan *pl, const backward_problem *bp) {
    const attention_problem *p = &bp->fwd;
    const size_t dq_floats = pl->group * p->len_q * p->d_k; /* a unit's, which the cap counts */
    const size_t pieces = (p->len_kv + KEY_PIECE - 1) / KEY_PIECE;
    /* dq rows summed over the query heads (a head stride of 0) would be shared by the parts
       of several heads, which each start their rows from 0 */
    if (!p->len_q || pl->task_b != 1 || pl->task_h != 1 || (p->heads_q > 1 && !bp->dq_stride[1]) ||
        p->d_k > CHUNK_MAX_D || pieces < 2 || pl->n_units >= CHUNK_TASKS)
        return 0;
    size_t n = (CHUNK_TASKS + pl->n_units - 1) / pl->n_units;
    if (n > pieces) n = pieces;
    while (n > 1 && (n - 1) * pl->n_units > CHUNK_FLOATS / dq_floats) n--;
    return n > 1 ? n : 0;
}

void plan_backward(backward_plan *pl, const backward_problem *bp, size_t threads) {
    const attention_problem *p = &bp->fwd;
    pl->group = p->heads_q / p->heads_kv;
    /* a gradient summed over an axis (stride 0) is written by one unit for the whole axis */
    const int all_b = p->batch > 1 && (!bp->dq_stride[0] || !bp->dk_stride[0] || !bp->dv_stride[0]);
    const int all_h = p->heads_kv > 1 && (!bp->dk_stride[1] || !bp->dv_stride[1] ||
                                          (p->heads_q > 1 && !bp->dq_stride[1]));
    pl->task_b = all_b ? p->batch : 1;
    pl->task_h = all_h ? p->heads_kv : 1;
    pl->tasks_b = p->batch / pl->task_b;
    pl->tasks_h = p->heads_kv / pl->task_h;
    pl->n_units = pl->tasks_b * pl->tasks_h;
    /* four products of len_q x len_kv pairs over d, and the scores */
    const double work = (double)p->batch * (double)p->heads_q * (double)p->len_q *
                        (double)p->len_kv * (double)(2 * p->d_k + 3 * p->d_v);
    pl->parallel = threads > 1 && work >= (double)SDPA_PARALLEL_MIN_WORK;
    const size_t tile = SDPA_ATTN_MAX_BLOCK_Q;
    pl->sum_rows = p->d_k <= 64 ? 8 * tile : p->d_k <= 128 ? 4 * tile : 2 * tile;
    pl->n_chunks = backward_chunks(pl, bp);
    pl->chunk_keys = pl->band = pl->bands = pl->slot = pl->workspace = 0;
    if (pl->n_chunks) {
        const size_t pieces = (p->len_kv + KEY_PIECE - 1) / KEY_PIECE;
        pl->chunk_keys = (pieces + pl->n_chunks - 1) / pl->n_chunks * KEY_PIECE;
        /* as many whole blocks as a stack slot holds (d_k <= CHUNK_MAX_D: at least one) */
        pl->band = CHUNK_STACK_FLOATS / p->d_k / pl->sum_rows * pl->sum_rows;
        pl->bands = (p->len_q + pl->band - 1) / pl->band;
        pl->slot = pl->band * p->d_k;
        const chunk_plan r = plan_backward_chunks(pl);
        pl->workspace = chunk_plan_workspace(&r);
    }
}

chunk_plan plan_backward_chunks(const backward_plan *pl) {
    const chunk_plan r = {pl->n_units, pl->n_chunks, pl->group * pl->bands, pl->slot, 0, 0, 0};
    return r;
}

void plan_backward_chunk(const backward_plan *pl, size_t len_kv, size_t c, size_t *begin,
                         size_t *end) {
    /* whole chunks of chunk_keys may end before the last one: those are empty, at len_kv */
    *begin = c * pl->chunk_keys < len_kv ? c * pl->chunk_keys : len_kv;
    *end = *begin + pl->chunk_keys < len_kv ? *begin + pl->chunk_keys : len_kv;
}
