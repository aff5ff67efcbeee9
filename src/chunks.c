/* The key-chunk reduction (chunks.h): its two schedules. */
#include "chunks.h"

#include "threads.h"

typedef struct reduction {
    const chunk_plan *r;
    const chunk_ops *ops;
    const void *ctx;
    float *workspace; /* the tasks' slots, chunk_plan_workspace(r) floats */
} reduction;

/* Unit u's slot of chunk c and part `part` in the workspace; NULL for chunk 0 without state. */
static float *slot_of(const reduction *x, size_t u, size_t c, size_t part) {
    const chunk_plan *r = x->r;
    if (!c && !r->state) return NULL;
    const size_t chunks = r->n_chunks - !r->state, at = c - !r->state;
    return x->workspace + ((u * chunks + at) * r->n_parts + part) * r->slot;
}

typedef struct task_args {
    const reduction *x;
    size_t index;
} task_args;

/* Task t is the i-th of unit u's chunks in the plan's order (u = t / n_chunks, i = t % n_chunks;
   interleaved, i = t / n_units, u = t % n_units): its unit and chunk. */
static void task_at(const chunk_plan *r, size_t t, size_t *u, size_t *c) {
    const size_t n = r->n_chunks;
    *u = r->interleave ? t % r->n_units : t / n;
    const size_t i = r->interleave ? t / r->n_units : t % n;
    *c = r->last_first ? n - 1 - i : i;
}

int chunk_plan_next(const chunk_plan *r, size_t u, size_t c, size_t *u_next, size_t *c_next) {
    const size_t n = r->n_chunks, i = r->last_first ? n - 1 - c : c;
    const size_t t = r->interleave ? i * r->n_units + u : u * n + i;
    if (t + 1 >= r->n_units * n) return 0;
    task_at(r, t + 1, u_next, c_next);
    return 1;
}

/* Task t, its parts in order. */
static void task_run(const reduction *x, void *scratch, size_t t) {
    const chunk_plan *r = x->r;
    size_t u, c;
    task_at(r, t, &u, &c);
    for (size_t part = 0; part < r->n_parts; part++)
        x->ops->run(x->ctx, scratch, u, c, part, slot_of(x, u, c, part));
}

static void task_body(void *arg, void *scratch) {
    const task_args *a = arg;
    task_run(a->x, scratch, a->index);
}

/* Every task on this thread, in task order. */
static void tasks_body(void *arg, void *scratch) {
    const reduction *x = arg;
    for (size_t t = 0; t < x->r->n_units * x->r->n_chunks; t++) task_run(x, scratch, t);
}

static void task(void *arg, size_t index) {
    const reduction *x = arg;
    task_args a = {x, index};
    x->ops->with_scratch(x->ctx, task_body, &a);
}

/* Every unit's slots merged in chunk order, part by part. */
static void merge_body(void *arg, void *scratch) {
    const reduction *x = arg;
    for (size_t u = 0; u < x->r->n_units; u++)
        for (size_t part = 0; part < x->r->n_parts; part++) {
            float *state = slot_of(x, u, 0, part);
            for (size_t c = 1; c < x->r->n_chunks; c++)
                x->ops->merge(x->ctx, scratch, u, c, part, state, slot_of(x, u, c, part));
            if (x->ops->finish) x->ops->finish(x->ctx, scratch, u, part, state);
        }
}

/* Every unit on this thread, each chunk after chunk 0 into one stack slot, merged at once. */
static void in_order_body(void *arg, void *scratch) {
    const reduction *x = arg;
    const chunk_plan *r = x->r;
    _Alignas(64) float stack[CHUNK_STACK_FLOATS];
    float *state = r->state ? stack : NULL, *slot = stack + (r->state ? r->slot : 0);
    for (size_t u = 0; u < r->n_units; u++)
        for (size_t part = 0; part < r->n_parts; part++) {
            x->ops->run(x->ctx, scratch, u, 0, part, state);
            for (size_t c = 1; c < r->n_chunks; c++) {
                x->ops->run(x->ctx, scratch, u, c, part, slot);
                x->ops->merge(x->ctx, scratch, u, c, part, state, slot);
            }
            if (x->ops->finish) x->ops->finish(x->ctx, scratch, u, part, state);
        }
}

void chunks_run(const chunk_plan *r, const chunk_ops *ops, const void *ctx, int parallel,
                size_t threads) {
    reduction x = {r, ops, ctx, NULL};
    if ((parallel || r->interleave) &&
        (x.workspace = sdpa_workspace_acquire(chunk_plan_workspace(r))) != NULL) {
        if (parallel)
            sdpa_parallel_run(task, &x, r->n_units * r->n_chunks, threads);
        else
            ops->with_scratch(ctx, tasks_body, &x);
        ops->with_scratch(ctx, merge_body, &x);
        sdpa_workspace_release();
        return;
    }
    ops->with_scratch(ctx, in_order_body, &x);
}

void work_run(const chunk_plan *r, const chunk_ops *ops, sdpa_task_fn unit_task, void *ctx,
              int parallel, size_t threads) {
    if (r->n_chunks >= 2)
        chunks_run(r, ops, ctx, parallel, threads);
    else if (parallel && r->n_units > 1)
        sdpa_parallel_run(unit_task, ctx, r->n_units, threads);
    else
        for (size_t u = 0; u < r->n_units; u++) unit_task(ctx, u);
}
