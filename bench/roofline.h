/* Hardware limits measured by the benchmark itself at start-up (x86-64; zeros elsewhere). */
#ifndef SDPA_BENCH_ROOFLINE_H
#define SDPA_BENCH_ROOFLINE_H

typedef struct roofline {
    double clock_ghz;       /* core clock while this thread runs */
    const char *l1_isa;     /* the vector width the L1 figure was measured with */
    double l1_bytes_per_ns; /* L1 load bandwidth, GB/s */
} roofline;

roofline roofline_measure(void);

#endif
