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

/* The bf16 dot add-on of backend k (kernels.h) that is on, the first in the records' order
 * (amx_bf16, then bf16_dot): compiled in, the CPU has what it requires, and its variable
 * (SDPA_AMX, SDPA_BF16_DOT) =on or, unset, its default (its record's, or for bf16_dot the
 * per-CPU rule of bf16_dot_default.h; chosen at load time, with the backend), and for AMX Linux
 * grants the process the tile state (asked at the first call here that finds the AMX add-on on,
 * never at load); else NULL. Call it with a table from sdpa_kernels_now(), whose acquire load
 * orders this after init. */
const sdpa_bf16_dot_kernels *sdpa_bf16_dot_for(const sdpa_kernels *k);

/* For tests: the index-th bf16 dot add-on of backend k in the records' order (0 first), whether
 * compiled in or not; returns 0 past the last. runnable (and table, else NULL): compiled in and
 * the CPU has what it requires, whatever the environment says (probing AMX here asks the OS for
 * the tile state even where the add-on is off); default_on: its default on this CPU, the
 * per-CPU rule resolved (1 or 0); on: as sdpa_bf16_dot_for counts it, whose answer is the table
 * of the first that is on. */
typedef struct sdpa_addon_info {
    const char *name, *requires, *env;
    int default_on, runnable, on;
    const sdpa_bf16_dot_kernels *table;
} sdpa_addon_info;
int sdpa_bf16_dot_addon(const sdpa_kernels *k, size_t index, sdpa_addon_info *info);

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
