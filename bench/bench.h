/* The benchmark's ops: what each measures (prepare, run, verify, cost), shared by the timing
 * driver (bench.c), the one-dimensional ops (ops.c) and attention (attention.c). */
#ifndef SDPA_BENCH_H
#define SDPA_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "peers.h"
#include "sdpa.h"

#define MAX_SIZES 16
#define MAX_REPS  101
#define MAX_DIMS  4

/* KIND_F32: sdpa's f32 call on the float values of a 16-bit attention shape, the backend the
   16-bit rows run on; the yardstick of their "vs f32" column, timed in the same rounds.
   KIND_DENSE: sdpa_mha on a paged attention shape's values laid out densely, its yardstick.
   KIND_OLD: the same call of another build of the library (--against), the "old" row. */
enum kind {
    KIND_SDPA,
    KIND_OPENBLAS,
    KIND_DNNL,
    KIND_NAIVE,
    KIND_ROOF,
    KIND_CALL,
    KIND_F32,
    KIND_DENSE,
    KIND_OLD,
    KIND_NONE
};
extern const char *const KIND_NAMES[]; /* indexed by enum kind */

struct op_def;

/* One measured problem: an op at one size, its inputs, and the scalar backend's answer. */
typedef struct job {
    const struct op_def *op;
    size_t n; /* elements; scores: keys */
    size_t d; /* scores: floats per key; 0 for the one-dimensional ops */
    char size_label[48];
    float *a, *b; /* dot: the two inputs; scores: q (d floats) and K (n rows of d) */
    float *x, *y; /* softmax, scale: input and output; scores: y holds the scores */
    float *ref;   /* scalar backend's output (softmax: one per exp mode); scores: bounds */
    float *bound; /* scores: the tolerance of each key */
    float result; /* dot: the last result */
    float ref_dot, abs_sum;
    float scale;
    float sink;
    peer_dnnl_softmax *dnnl;
    size_t y_len; /* floats check() poisons at y when not n (attention: the output) */
    void *extra;  /* state of ops that need more (attention) */
} job;

/* An operation the driver measures. Sizes walk from L1 to DRAM; an op with dims runs every size
 * once per dim (scores: the same key counts at d = 64 and 128). */
typedef struct op_def {
    const char *name;
    size_t sizes[MAX_SIZES];       /* 0-terminated */
    size_t smoke_sizes[MAX_SIZES]; /* --smoke: tiny, with tails */
    size_t dims[MAX_DIMS];         /* 0-terminated; {0} for none */
    enum kind peers[2];            /* the "vs" columns; KIND_NONE when absent */
    int exp_modes;                 /* 2: sdpa runs in both exp modes (fast, sleef) */
    const char *plot_unit;         /* what --plot draws: "GFLOP/s" or "GB/s" */
    int shaped;                    /* 1: sizes are 1-based indices into the attention shapes */
    /* allocate and fill j's inputs (j->n, j->d set) and compute the scalar reference */
    void (*prepare)(job *j);
    /* iters calls of one implementation; the active sdpa backend is already chosen */
    void (*run)(enum kind kind, job *j, size_t iters);
    /* 1 if j's output (after one run) matches the reference of exp mode exp_index */
    int (*verify)(const job *j, int exp_index);
    /* arithmetic (FMA-pipe flops; 0 when not the limit), bytes moved, bytes the call touches */
    void (*cost)(const job *j, double *flops, double *bytes, double *working_set);
    /* frees what prepare() kept in j->extra; NULL when it kept nothing there */
    void (*release)(job *j);
    /* 1 if bench_against's library runs j's call (status OK), for a row of its own (KIND_OLD);
       NULL for an op without one */
    int (*against)(job *j);
} op_def;

/* ops.c: every op, in the order the driver runs them */
extern const op_def *const OPS[];
extern const size_t N_OPS;
extern const op_def DOT_OP;      /* the driver adds its floors (L1 loads, an empty call) to dot */
extern const char *const EXPS[]; /* sdpa's exp modes, by exp index: "fast", "sleef" */

/* ops.c: shared by the ops */
void *xalloc(size_t n_floats);                  /* 64-byte aligned; exits on failure */
void *xalloc_bytes(size_t bytes, size_t align); /* align-byte aligned; exits on failure */
void bench_huge_pages(void); /* from now on, allocations of 2 MiB and more ask for 2 MiB pages */
int bench_uses_huge_pages(void);
void fill(float *p, size_t n, float lo, float hi); /* uniform in [lo, hi), a fixed sequence */
void use_scalar(void);                             /* the scalar backend, or exit */
double growth(size_t n, size_t documented);

/* against.c: the table of the library --against names (NULL without it), loaded by
   against_load, which exits if it cannot */
extern const sdpa_api *bench_against;
void against_load(const char *path);
int against_loaded(job *j); /* op_def.against of ops every table has: whether one was loaded */
/* The table sdpa's rows call through: bench_against's for KIND_OLD, else this library's
   (sdpa_get_api), so that the two rows of a pair are called alike, with no PLT on one side */
const sdpa_api *bench_api(enum kind kind);

/* attention.c: the shapes the attention op's sizes index */
#define MAX_SHAPES (MAX_SIZES - 1)
extern const op_def ATTENTION_OP;
extern const op_def BACKWARD_OP; /* sdpa_mha_backward_f32 on the same shapes, in f32 */
extern const op_def KV_STORE_OP; /* kv_store.c: sdpa_kv_cache_store into an f16 paged cache */
/* A paged cache of type t laid out [block][head][token][d] (vLLM's), in a pool an eighth larger
   than the used_blocks its sequences take; no block table yet */
sdpa_kv_cache bench_paged_cache(sdpa_dtype t, size_t used_blocks, size_t block, size_t heads_kv,
                                size_t d);
/* replaces shape number index (1-based) by the one text names ("b1h8kv2q512k512d128causal");
   0 if text is not a shape */
int attention_set_shape(size_t index, const char *text);
void attention_use_shapes(size_t n);      /* only the first n shapes remain */
void attention_pool_offset(size_t bytes); /* a paged pool starts this far past a 4 KiB page */
int attention_typed(const job *j);        /* 1 if an attention job has a view that is not f32 */
int attention_uniform(const job *j);     /* 1 if an attention job is one dense call, no modifiers */
int attention_paged(const job *j);       /* 1 if an attention job's shape is paged<block> */
int attention_shape_mixed(size_t index); /* 1 if shape number index is the mixed batch */

#endif
