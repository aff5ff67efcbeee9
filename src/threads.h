/* Internal: how a call spreads its tasks over threads (the built-in pool or the host's
 * parallel_for), and the workspace that split-KV partial results live in. */
#ifndef SDPA_SRC_THREADS_H
#define SDPA_SRC_THREADS_H

#include <stddef.h>

#include "sdpa.h"

/* Below this many multiply-adds a call runs on the caller's thread and never touches the pool:
 * it is some 40 us on one AVX-512 core, where sharing it with a thread that must first be woken
 * (10 to 30 us) stops paying. */
#define SDPA_PARALLEL_MIN_WORK (1u << 21)

/* The threads a call that starts now may use: sdpa_num_threads(), or 1 on a thread that is
 * running one of sdpa's tasks (a nested call) and after the library's destructor ran. */
size_t sdpa_threads_for_call(void);

/* Runs task(arg, i) exactly once for every i < n_tasks and returns when all have finished: on the
 * host's parallel_for when one is set, else on the built-in pool with at most `threads` threads
 * (the caller's among them); on the caller's thread, in index order, when threads < 2, when the
 * pool is busy with another call, or when it cannot start a thread. Every task runs with the
 * nested-call flag set, so calls made inside it run on its thread. */
void sdpa_parallel_run(sdpa_task_fn task, void *arg, size_t n_tasks, size_t threads);

/* The shared split-KV workspace, at least n_floats floats (64-byte aligned), held by the caller
 * until sdpa_workspace_release. NULL, holding nothing, when another call holds it or it cannot
 * grow: the caller then runs on its own thread. It grows to the largest request and is kept. */
float *sdpa_workspace_acquire(size_t n_floats);
void sdpa_workspace_release(void);

#endif
