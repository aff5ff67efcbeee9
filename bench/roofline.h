/* Hardware limits measured by the benchmark itself at start-up (x86-64; zeros elsewhere). */
#ifndef SDPA_BENCH_ROOFLINE_H
#define SDPA_BENCH_ROOFLINE_H

#include <stddef.h>

typedef struct roofline {
    double clock_ghz;       /* core clock while this thread runs */
    const char *l1_isa;     /* the vector width the L1 figure was measured with */
    double l1_bytes_per_ns; /* L1 load bandwidth, GB/s */
} roofline;

roofline roofline_measure(void);

/* Sum of a[i] + b[i], read with the widest vectors and independent adds: the loads alone of a dot
 * of the same inputs. Timed beside the dots as the "L1 loads" row, it is the binding limit that
 * their roof% refers to, measured in the same rounds. */
float roof_load_sum(const float *a, const float *b, size_t n);

#endif
