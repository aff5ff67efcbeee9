/* Machine-readable outputs of the benchmark: every measured row is recorded, then written as
 * JSON (--json FILE) and as one PNG per operation drawn by gnuplot (--plot DIR). */
#ifndef SDPA_BENCH_OUTPUT_H
#define SDPA_BENCH_OUTPUT_H

#include <stddef.h>

typedef struct bench_record {
    const char *op;            /* "dot", "softmax" */
    size_t n;                  /* elements */
    char impl[24];             /* "avx512 fast", "openblas", ... */
    double ns, ns_min, ns_max; /* per call: median and spread of the rounds */
    double per_ns;    /* the plotted throughput: GFLOP/s for dot, G elements/s for softmax */
    double vs_scalar; /* scalar median / this median; 0 when not measured */
    int ok;           /* result matched the scalar backend */
} bench_record;

/* The run's context, written at the top of the JSON file. */
typedef struct bench_context {
    const char *date, *cpu, *compiler, *sleef, *openblas, *onednn, *naive, *clock;
    double clock_ghz, l1_gbytes_per_s;
} bench_context;

void record_add(const bench_record *r);
/* 0 on success; otherwise a message on stderr and -1. */
int write_json(const char *path, const bench_context *ctx);
int write_plots(const char *dir);

#endif
