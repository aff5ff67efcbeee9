/* Machine-readable outputs of the benchmark: every measured row is recorded, then written as
 * JSON (--json FILE) and as one PNG per operation drawn by gnuplot (--plot DIR). */
#ifndef SDPA_BENCH_OUTPUT_H
#define SDPA_BENCH_OUTPUT_H

#include <stddef.h>

#include "roofline.h"

typedef struct bench_record {
    char op[32];               /* "dot", "softmax", "scores d128", ... */
    size_t n;                  /* elements (scores: keys; attention: (query, key) pairs) */
    char size[40];             /* the size as printed: n, or an attention shape's name */
    size_t d;                  /* scores: floats per key; 0 otherwise */
    char impl[24];             /* "avx512 fast", "openblas", ... */
    double ns, ns_min, ns_max; /* per call: median and spread of the rounds */
    double gflops, gbytes_per_s;
    double per_ns;       /* the plotted throughput, in unit */
    const char *unit;    /* "GFLOP/s" or "GB/s" */
    double roof_percent; /* of the binding limit; < 0 when not measured */
    char limit[8];       /* "L1" .. "DRAM", "FMA" or "-" */
    double vs_scalar;    /* scalar median / this median; 0 when not measured */
    int ok;              /* result matched the scalar backend */
} bench_record;

/* The run's context, written at the top of the JSON file. */
typedef struct bench_context {
    const char *date, *cpu, *backend, *compiler, *flags, *sleef, *openblas, *onednn, *naive, *clock;
    const roofline *roof; /* NULL when not measured */
} bench_context;

void record_add(const bench_record *r);
/* 0 on success; otherwise a message on stderr and -1. */
int write_json(const char *path, const bench_context *ctx);
int write_plots(const char *dir);

#endif
