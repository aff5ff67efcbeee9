/* Internal: the active kernel table and exp mode, shared by the entry points in src/. */
#ifndef SDPA_SRC_DISPATCH_H
#define SDPA_SRC_DISPATCH_H

#include <stdatomic.h>

#include "kernels.h"

extern _Atomic(const sdpa_kernels *) sdpa_active_kernels;
extern _Atomic int sdpa_active_exp;

/* The table of a backend this CPU can run, by public name; NULL otherwise. For white-box tests
 * and the benchmark, which drive one backend's kernels directly. */
const sdpa_kernels *sdpa_backend_kernels(const char *name);

/* The bf16 dot add-on of backend k (kernels.h) when it is on: compiled in, the CPU has what it
 * requires, and SDPA_BF16_DOT=on or, unset, its record's default (chosen at load time, with the
 * backend); else NULL.
 * Call it with a table from sdpa_kernels_now(), whose acquire load orders this after init. */
const sdpa_bf16_dot_kernels *sdpa_bf16_dot_for(const sdpa_kernels *k);

/* Runs the one-time load-time choice (idempotent, thread-safe). */
void sdpa_dispatch_init(void);

/* sdpa_dispatch_init, then the table it published: for calls that come before the constructor */
const sdpa_kernels *sdpa_kernels_first(void);

/* The table a call should use: one acquire load once initialised. The first call's init is a
 * call out of line, with nothing to keep across it: so the entry points with short work (dot of
 * 16 floats) save no registers for it. */
static inline const sdpa_kernels *sdpa_kernels_now(void) {
    const sdpa_kernels *k = atomic_load_explicit(&sdpa_active_kernels, memory_order_acquire);
    if (__builtin_expect(k != NULL, 1)) return k;
    return sdpa_kernels_first();
}

/* The exp mode, for a caller that already holds the table from sdpa_kernels_now(): the same
 * init chose both, and the acquire load of the table orders this one after it. One load, where
 * sdpa_exp_now() loads and tests the table again. */
static inline int sdpa_exp_with(const sdpa_kernels *k) {
    (void)k;
    return atomic_load_explicit(&sdpa_active_exp, memory_order_relaxed);
}

static inline int sdpa_exp_now(void) { return sdpa_exp_with(sdpa_kernels_now()); }

#endif
