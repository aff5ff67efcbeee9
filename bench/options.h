/* The benchmark's command line: what bench.c's driver runs, parsed and checked (options.c). */
#ifndef SDPA_BENCH_OPTIONS_H
#define SDPA_BENCH_OPTIONS_H

#include <stddef.h>

#include "bench.h"

typedef struct options {
    int ops[16];                   /* by index in OPS */
    size_t shape_sizes[MAX_SIZES]; /* --shape: 1-based indices of attention shapes */
    size_t n_shapes;
    const char *backends[8];
    size_t n_backends;
    size_t sizes[MAX_SIZES];
    size_t n_sizes;
    size_t dims[MAX_DIMS];
    size_t n_dims;
    int reps;
    double min_ms;
    int cpu;
    size_t threads[8]; /* --threads: counts above 1 get rows of their own */
    size_t n_threads, max_threads;
    int peers;
    int smoke;
    int roofline;
    int wall; /* --wall: elapsed time, not the thread's CPU time */
    int cold; /* --cold: each timed call after the caches are swept (evict_caches) */
    const char *csv, *json, *plot;
    const char *against; /* --against: another build's libsdpa.so.1, timed beside this one */
} options;

/* argv into options, with every unset one at its default; prints the usage and exits on a bad
   argument (status 2) or --help (0) */
options options_parse(int argc, char **argv);

#endif
