/* Hardware limits measured by the benchmark itself at start-up, so that every row can say how
 * close it came to the limit that binds it: the single-core FMA peak of an ISA and the read
 * bandwidth of each memory level. */
#ifndef SDPA_BENCH_ROOFLINE_H
#define SDPA_BENCH_ROOFLINE_H

#include <stddef.h>

enum roof_level { ROOF_L1, ROOF_L2, ROOF_L3, ROOF_DRAM, ROOF_LEVELS };
extern const char *const ROOF_LEVEL_NAMES[ROOF_LEVELS];

typedef struct roofline {
    double clock_ghz;     /* core clock while this thread runs; 0 where not measured */
    const char *fma_isa;  /* the ISA the FMA peak was measured with ("avx512", ...) */
    double fma_gflops;    /* single-core peak of that ISA: independent FMA chains */
    const char *read_isa; /* the vector width the bandwidths were measured with */
    double read_gbytes_per_s[ROOF_LEVELS];
    size_t probe_bytes[ROOF_LEVELS]; /* working set each bandwidth was measured on */
    /* DRAM read as a token table's keys are: 256-byte rows of the DRAM probe in a random order,
       each copied out, every line prefetched 32 rows ahead (the better of into L1 and into L2) */
    double rows_gbytes_per_s;
    size_t level_bytes[ROOF_LEVELS]; /* capacity taken for each cache level (DRAM: SIZE_MAX) */
    const char *level_source;        /* where level_bytes came from */
} roofline;

/* About a second on a modern core. isa names the backend whose FMA peak is measured ("avx512",
 * "avx2", "sse", "neon", "scalar"). */
roofline roofline_measure(const char *isa);

/* The smallest level that holds working_set bytes. */
enum roof_level roofline_level(const roofline *r, size_t working_set);

/* Sum of a[i] + b[i], read with the widest vectors and independent adds: the loads alone of a dot
 * of the same inputs. Timed beside the dots as the "L1 loads" row. */
float roof_load_sum(const float *a, const float *b, size_t n);

#endif
