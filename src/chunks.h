/* Internal: the one deterministic reduction over key chunks, which the forward's split-KV and the
 * backward's dq sums both use. The plan (plan.h, chunk_plan) cuts a unit's keys into chunks, and
 * may cut the unit into parts (bands of rows) whose results do not depend on each other. Chunk c
 * of part p of unit u runs into a slot: chunk 0 into the unit's output, keeping its state (if
 * the reduction has one) in a slot; chunk c >= 1 into a slot of its own. The slots of chunks 1,
 * 2, ... are then merged into the output in chunk order, and the part finished.
 *
 * There are two schedules, with the same bits: every (unit, chunk, part) result comes from the
 * same call, and every merge takes the same two operands in the same order.
 *   - Tasks: task (unit, chunk) runs its parts in order into slots of the shared workspace, the
 *     tasks on the call's threads (on this one, in task order, for an interleaved plan that is
 *     not parallel); then the calling thread merges, unit by unit, part by part.
 *   - In order: on the calling thread, unit by unit, part by part, chunk 0 and then each further
 *     chunk into one slot on the stack, merged at once. It needs no workspace: it serves one
 *     thread, and a call that finds the workspace held by another. */
#ifndef SDPA_SRC_CHUNKS_H
#define SDPA_SRC_CHUNKS_H

#include <stddef.h>

#include "plan.h"
#include "sdpa.h"

typedef struct chunk_ops {
    /* Runs body(arg, scratch) with the caller's per-thread scratch (its stack tiles, set up
       once for the many chunks and merges the body runs). */
    void (*with_scratch)(const void *ctx, void (*body)(void *arg, void *scratch), void *arg);
    /* Part `part` of unit u over the keys of chunk c: its result to slot (chunk 0: to the
       output, and its state to slot, NULL if the plan keeps none). */
    void (*run)(const void *ctx, void *scratch, size_t u, size_t c, size_t part, float *slot);
    /* Chunk c's slot (c >= 1) merged into the output of the part, and into its state. */
    void (*merge)(const void *ctx, void *scratch, size_t u, size_t c, size_t part, float *state,
                  const float *slot);
    /* The part after its last merge; NULL if nothing is left to do. */
    void (*finish)(const void *ctx, void *scratch, size_t u, size_t part, float *state);
} chunk_ops;

/* The reduction of plan r (n_chunks >= 2): in tasks on `threads` threads when `parallel`, or on
   this thread when r interleaves, if the workspace can be had; else in order on this thread. */
void chunks_run(const chunk_plan *r, const chunk_ops *ops, const void *ctx, int parallel,
                size_t threads);

/* The task after unit u's chunk c in the tasks' order, which one thread runs next when r
   interleaves: its unit and chunk; 0 if (u, c) is the last. */
int chunk_plan_next(const chunk_plan *r, size_t u, size_t c, size_t *u_next, size_t *c_next);

/* A call's work: chunks_run when r has chunks, else unit_task(ctx, u) for each of its units, as
   tasks on `threads` threads when `parallel`, else in order on this thread. */
void work_run(const chunk_plan *r, const chunk_ops *ops, sdpa_task_fn unit_task, void *ctx,
              int parallel, size_t threads);

#endif
