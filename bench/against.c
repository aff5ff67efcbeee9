/* --against: another build of the library, timed beside the one this benchmark links, in the same
 * rounds, on the same inputs, so that a change's cost is measured in one process rather than
 * between two runs of a shared machine. It is loaded with dlmopen into a namespace of its own, so
 * that both can be libsdpa.so.1, and called only through its sdpa_get_api table. */
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

const sdpa_api *bench_against;

void against_load(const char *path) {
    void *h = dlmopen(LM_ID_NEWLM, path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "bench: --against: %s\n", dlerror());
        exit(2);
    }
    typedef const sdpa_api *(*get_api_fn)(uint32_t);
    get_api_fn get = (get_api_fn)(uintptr_t)dlsym(h, "sdpa_get_api");
    const sdpa_api *api = get ? get(SDPA_ABI_VERSION) : NULL;
    if (!api || api->struct_size <= offsetof(sdpa_api, set_num_threads)) {
        fprintf(stderr, "bench: --against: %s has no table with sdpa_mha and threads\n", path);
        exit(2);
    }
    bench_against = api;
}

int against_loaded(job *j) {
    (void)j;
    return bench_against != NULL;
}

const sdpa_api *bench_api(enum kind kind) {
    static const sdpa_api *own;
    if (kind == KIND_OLD) return bench_against;
    if (!own) own = sdpa_get_api(SDPA_ABI_VERSION);
    return own;
}
