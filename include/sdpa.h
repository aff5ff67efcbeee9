/* sdpa: scaled dot-product attention on the CPU, one stable C ABI over per-ISA SIMD backends.
 *
 *     Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V
 *
 * ABI v1: names, argument orders and meanings never change within 1.x; functions are only added.
 * Every function is thread-safe. A void * view may sit at any byte address; a float * needs a
 * float's alignment, as C requires. Every result is a function of the values, the shape, the
 * backend and the settings, never of an address or of the thread count: the order of every sum
 * is fixed by the shape. The topics, in order:
 * types, status, kernels (and the backends that run them), attention, backward, paged K/V
 * caches, threads, the plugin table. docs/numerics.md holds the numerical detail (special
 * values, accuracy bounds, the exp, the floating-point environment, tasks and memory);
 * docs/guarantees.md the behaviour on bad input.
 *
 * No call changes the rounding mode or the FTZ and DAZ bits; calls expect the default masked
 * exceptions (docs/numerics.md, "The floating-point environment").
 *
 * Environment, read once at load time (empty is the same as unset). A value that cannot be used
 * prints one line on stderr, then the default applies; nothing else is ever printed:
 *   SDPA_BACKEND=<name> or auto: "sdpa: SDPA_BACKEND=<value> is not a known backend; using
 *     <best>", or "... is not supported on this CPU; using <best>";
 *   SDPA_EXP=fast or sleef: "sdpa: SDPA_EXP=<value> is not a known exp mode; using fast";
 *   SDPA_NUM_THREADS=<n>, digits only, 0 to 1024: "sdpa: SDPA_NUM_THREADS=<value> is not a
 *     decimal thread count from 0 to 1024; using the CPUs available, <n>";
 *   SDPA_AMX, SDPA_BF16_DOT = on, off or auto (docs/numerics.md, "bf16 Q.K"): "sdpa:
 *     <variable>=<value> is not on, off or auto; using auto: <on or off> (<why>)". */
#ifndef SDPA_H
#define SDPA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(SDPA_BUILDING_LIBRARY)
#define SDPA_API __attribute__((visibility("default")))
#else
#define SDPA_API
#endif

#define SDPA_ABI_VERSION 1u

/* ======== Types ======== */

/* Element types. f16 is IEEE binary16; bf16 is the upper half of a binary32. The OCP 8-bit
 * floats (since ABI 1.4): e4m3 has no inf, S.1111.111 is NaN, its largest finite value 448;
 * e5m2 is IEEE-like, its largest finite value 57344. Only K/V caches and sdpa_convert take
 * them. */
typedef enum sdpa_dtype {
    SDPA_F32 = 0,
    SDPA_F16 = 1,
    SDPA_BF16 = 2,
    SDPA_FP8_E4M3 = 3,
    SDPA_FP8_E5M2 = 4
} sdpa_dtype;

#define SDPA_DEFAULT_SCALE 0.0f      /* scale argument meaning 1/sqrt(d_k) */
#define SDPA_CAUSAL        (1u << 0) /* query row i sees keys j <= i + (len_kv - len_q) */

/* Score modifiers, each off when 0, NULL or -1 as its field says (since ABI 1.4). For query
 * row i, at key position p_i = i + len_kv - len_q, and key j, in this order: s = scale q.k;
 * the softcap; + ALiBi; + the mask; pairs outside causality, the window or the segment get
 * weight exactly 0 (their k and v are never read); the softmax over the row's pairs, with
 * e^sink in its denominator and no value. lse, when asked, is the log of that denominator, the
 * sink included: of two calls merged through lse, give the sink to one. */
typedef struct sdpa_score_mods {
    uint32_t struct_size;      /* sizeof(sdpa_score_mods) as the caller compiled it */
    uint32_t reserved;         /* 0 */
    int64_t window_left;       /* -1: unbounded; else row i sees no key j < p_i - window_left */
    int64_t window_right;      /* -1: unbounded; else nor j > p_i + window_right */
    float softcap;             /* 0: none; else s = softcap * tanh(s / softcap), after the scale */
    float reserved2;           /* 0 */
    const float *alibi_slopes; /* [heads_q] or NULL: s += slope[h] * (j - p_i), after softcap */
    const float *sinks;        /* [heads_q] or NULL: e^sinks[h] joins each row's denominator */
    const int32_t *q_segment;  /* [batch][len_q] and [batch][len_kv], both or neither: row i */
    const int32_t *k_segment;  /*   sees key j only if q_segment[b][i] == k_segment[b][j] */
    size_t q_segment_stride, k_segment_stride; /* elements between batch entries; 0 broadcasts */
} sdpa_score_mods;

/* One attention call's shapes and views. Element [b][h][r][c] of a view X is
 * X[b * x_stride[0] + h * x_stride[1] + r * x_stride[2] + c]: strides count elements of the
 * view's own type, rows are contiguous, and a batch or head stride of 0 broadcasts. Query head h
 * reads key/value head h / (heads_q / heads_kv). */
typedef struct sdpa_mha_desc {
    uint32_t struct_size;            /* sizeof(sdpa_mha_desc) as the caller compiled it */
    uint32_t flags;                  /* SDPA_CAUSAL, ... */
    size_t batch, heads_q, heads_kv; /* heads_q % heads_kv == 0: GQA, MQA (heads_kv == 1), MHA */
    size_t len_q, len_kv, d_k, d_v;
    float scale; /* SDPA_DEFAULT_SCALE for 1/sqrt(d_k) */
    size_t q_stride[3], k_stride[3], v_stride[3], out_stride[3]; /* [batch][head][row] */
    const float *mask;     /* optional additive mask, [len_q][len_kv] a (batch, head); or NULL */
    size_t mask_stride[3]; /* [batch][head][row]; 0 broadcasts; columns contiguous */
    /* v2: two groups, each read only when struct_size covers it whole (a v1 caller gets f32 and
       no lse). The types: an sdpa_dtype each, of q, of k and v, of out (the mask is float). */
    uint32_t q_type, kv_type, out_type;
    uint32_t reserved; /* 0 */
    /* Optional output (or NULL): lse[b * lse_stride[0] + h * lse_stride[1] + r], the log of
       sum_j exp(s_rj) over the keys row r sees; -inf for a row that sees none. For merging. */
    float *lse;
    size_t lse_stride[2];
    /* v3, read only when struct_size covers it whole (sdpa_mha_desc_set_mods extends it): the
       score modifiers (NULL: none), and the scales of an 8-bit kv_type (read for no other
       type) */
    const sdpa_score_mods *mods;
    float k_scale, v_scale;
} sdpa_mha_desc;

/* The gradients of a call and its upstream gradient, strides as in sdpa_mha_desc. */
typedef struct sdpa_mha_grads {
    uint32_t struct_size; /* sizeof(sdpa_mha_grads) as the caller compiled it */
    uint32_t reserved;    /* 0 */
    float *dq, *dk, *dv;  /* laid out like q, k, v; written, not accumulated */
    size_t dq_stride[3], dk_stride[3], dv_stride[3];
    const float *dout; /* laid out like out */
    size_t dout_stride[3];
    /* v2 (since ABI 1.4; read when struct_size covers it): dL/dsinks, [heads_q], written and
       summed over batch and rows, when desc->mods has sinks; NULL: not asked */
    float *dsinks;
} sdpa_mha_grads;

/* A host's scheduler (sdpa_set_parallel_for). */
typedef void (*sdpa_task_fn)(void *arg, size_t index);
typedef void (*sdpa_parallel_for_fn)(void *ctx, sdpa_task_fn task, void *arg, size_t n_tasks);

/* What sdpa_info describes: one list of entries per kind. */
typedef enum sdpa_info_kind {
    SDPA_INFO_CPU = 0,     /* one entry: the CPU as the dispatcher saw it */
    SDPA_INFO_FEATURE = 1, /* the CPU features the dispatcher checks */
    SDPA_INFO_BACKEND = 2, /* every backend, best first (as sdpa_backend_name) */
    SDPA_INFO_ADDON = 3,   /* every backend's add-ons, in the order they are tried */
    SDPA_INFO_TYPE = 4     /* every element type (sdpa_dtype), in its order; since ABI 1.5 */
} sdpa_info_kind;

/* An entry's flags. PRESENT: a feature this CPU and OS have; a backend or add-on compiled in.
 * RUNNABLE: a backend or add-on this CPU and OS run. ON: the active backend; an add-on turned on
 * (by its variable or default). IN_USE: the active backend; the add-on its calls use now. */
#define SDPA_INFO_PRESENT  (1u << 0)
#define SDPA_INFO_RUNNABLE (1u << 1)
#define SDPA_INFO_ON       (1u << 2)
#define SDPA_INFO_IN_USE   (1u << 3)

typedef struct sdpa_info_entry {
    uint32_t struct_size;    /* set by the caller; the library's sizeof on return */
    uint32_t flags;          /* SDPA_INFO_PRESENT, ... */
    const char *name;        /* CPU: its vendor; else the feature's, backend's or add-on's name */
    const char *description; /* CPU: its model; backend, add-on: one line for people */
    const char *requires;    /* backend, add-on: the CPU features it needs, '+'-joined */
    const char *arch;        /* backend: the architecture it exists on, "" for every one */
    const char *reason;      /* backend, add-on: why its flags are what they are */
    const char *backend;     /* add-on: its backend */
    const char *variable;    /* add-on: the environment variable that turns it on or off */
    /* CPU: family, model, stepping, XCR0 (-1 where unknown); add-on: its default (1 on, 0 off,
       -1 chosen per CPU), then that default on this CPU (1 or 0); type: its sdpa_dtype, bytes */
    int64_t number[4];
} sdpa_info_entry; /* fields that do not apply are "" or 0 */

/* ======== Status ======== */

/* Every call that can fail returns one. Arguments are checked before any work: on error nothing
 * is written and no array is read. No array may hold more than PTRDIFF_MAX bytes. */
typedef enum sdpa_status {
    SDPA_OK = 0,
    SDPA_ERR_NULL = 1, /* a required pointer is NULL */
    /* a size that must not be zero is zero, a size computation overflows, a stride too small
       for its row, or arrays that overlap where they must not */
    SDPA_ERR_SIZE = 2,
    SDPA_ERR_ARG = 3,        /* another invalid argument: non-finite scale, unknown flag bits */
    SDPA_ERR_UNSUPPORTED = 4 /* unknown backend name, or a backend this CPU cannot run */
} sdpa_status;

/* A short English description of status; never NULL ("unknown status" for unknown values). */
SDPA_API const char *sdpa_status_string(sdpa_status status);

/* What the last failing call on this thread found wrong, naming the argument and the rule, e.g.
 * "heads_q (8) is not a multiple of heads_kv (3)"; "" before any error. A call that succeeds
 * leaves it (as errno). This thread's own string, valid until its next failing call; for
 * people, not programs (the status is the contract). Since ABI 1.3. */
SDPA_API const char *sdpa_last_error_detail(void);

SDPA_API uint32_t sdpa_abi_version(void); /* SDPA_ABI_VERSION of the library loaded */
SDPA_API const char *sdpa_version(void);  /* "MAJOR.MINOR.PATCH" */

/* ======== Kernels ========
 * n == 0 is valid and does nothing (dot stores 0). NULL is an error only where something would
 * be read or written through it. Accuracy, special values and the exp: docs/numerics.md. */

/* *result = sum_i a[i] * b[i]. Error <= 1e-5 * sum_i |a_i b_i| for n <= 4096. */
SDPA_API sdpa_status sdpa_dot_f32(const float *a, const float *b, size_t n, float *result);

/* y[i] = alpha * x[i], any alpha; y == x is allowed. Exact: one IEEE multiply each. */
SDPA_API sdpa_status sdpa_scale_f32(float *y, const float *x, size_t n, float alpha);

/* y = softmax(scale * x), stable (no finite input overflows); y == x is allowed. scale finite
 * and non-zero, else SDPA_ERR_ARG. Relative error <= 2e-5 for n <= 4096. */
SDPA_API sdpa_status sdpa_softmax_f32(float *y, const float *x, size_t n, float scale);

/* dx[i] = scale * y[i] * (dy[i] - sum_j y[j] dy[j]), the gradient of softmax(scale * x) given
 * its output y; dx may alias y or dy. scale finite and non-zero, else SDPA_ERR_ARG. Error
 * <= 1e-5 |scale y_i| (|dy_i| + sum_j |y_j dy_j|), plus what flush-to-zero can lose. */
SDPA_API sdpa_status sdpa_softmax_backward_f32(float *dx, const float *y, const float *dy, size_t n,
                                               float scale);

/* s[j] = scale * dot(q, k + j * k_stride) over d floats, for j < n_keys. SDPA_ERR_SIZE for
 * k_stride < d, or d == 0 with n_keys > 0; scale finite. The error of sdpa_dot_f32. */
SDPA_API sdpa_status sdpa_scores_f32(float *s, const float *q, const float *k, size_t n_keys,
                                     size_t d, size_t k_stride, float scale);

/* dst[i] = src[i] converted: widening is exact; narrowing rounds to nearest even whatever the
 * rounding mode, FTZ or DAZ (f16 may be subnormal; beyond 65504 is inf; e4m3 saturates at
 * +-448, infinities too; e5m2 beyond 57344 is inf). A NaN stays a NaN, quieted. src == dst is
 * allowed for types of one size. Errors: SDPA_ERR_NULL; SDPA_ERR_ARG for an unknown type;
 * SDPA_ERR_SIZE for n past PTRDIFF_MAX bytes or any other overlap (an overlap was SDPA_ERR_ARG
 * before ABI 1.3). */
SDPA_API sdpa_status sdpa_convert(void *dst, sdpa_dtype dst_type, const void *src,
                                  sdpa_dtype src_type, size_t n);

/* ---- Backends: "avx512" (AVX-512F), "avx2" (AVX2+FMA+F16C), "sse" (SSE4.1), "neon" (AArch64),
 *      "scalar". The best one the CPU and OS run is chosen at load time. ---- */

SDPA_API const char *sdpa_backend(void); /* the active backend's name */

/* Makes name, or "auto" (the best), the active backend for the process; calls in flight finish
 * on theirs. SDPA_ERR_NULL; SDPA_ERR_UNSUPPORTED for a name unknown or not runnable here. */
SDPA_API sdpa_status sdpa_set_backend(const char *name);

/* 1 if the backend is compiled in and this CPU and OS run it, else 0. */
SDPA_API int sdpa_backend_supported(const char *name);

/* The index-th backend this library knows, best first; NULL past the end. */
SDPA_API const char *sdpa_backend_name(size_t index);

/* The exp of softmax and attention: "fast" (default, within 3 ULP) or "sleef" (1 ULP). Setting
 * an unknown name is SDPA_ERR_UNSUPPORTED. */
SDPA_API const char *sdpa_exp_mode(void);
SDPA_API sdpa_status sdpa_set_exp_mode(const char *name);

/* The number of entries of kind (0 for an unknown kind). */
SDPA_API size_t sdpa_info_count(sdpa_info_kind kind);

/* Fills *entry with the index-th entry of kind: what the library saw at load time and chose, as
 * `sdpa info` shows it. Strings live as long as the library. An AMX add-on that is on asks Linux
 * for the tile state here, as the first all-bf16 call would. Errors: SDPA_ERR_NULL; SDPA_ERR_ARG
 * for an unknown kind, an index past the count or a struct_size too small (entry untouched).
 * Since ABI 1.3. */
SDPA_API sdpa_status sdpa_info(sdpa_info_kind kind, size_t index, sdpa_info_entry *entry);

/* ======== Attention ========
 * out = softmax(scale * Q K^T + mask) V, fused and streaming: no len_q x len_kv matrix is formed.
 * scale: SDPA_DEFAULT_SCALE or any finite value. A row that sees no key gets zeros; a mask
 * entry of -inf removes its key exactly. out must not overlap q, k, v or the mask. Results are
 * bitwise the same at every thread count. Error <= 1e-5 * max|v| per output for unit-normal
 * inputs, len_kv <= 4096, d_k <= 256 (docs/numerics.md, "Attention").
 * Errors, before any work (out untouched):
 *   SDPA_ERR_NULL  a pointer that would be read or written is NULL, or desc is;
 *   SDPA_ERR_SIZE  heads_kv zero or not dividing heads_q; with output rows: d_k or d_v zero, a
 *                  row stride smaller than its row (where a view has more than one row), out
 *                  rows that share an element, an extent past PTRDIFF_MAX bytes, out or lse
 *                  meeting q, k, v, the mask or each other (the mask, only read, takes any
 *                  strides: 0 broadcasts);
 *   SDPA_ERR_ARG   unknown flags, non-finite scale, an unknown type, reserved not 0, struct_size
 *                  smaller than v1 or ending inside a v2 group. */

/* Single head, dense row-major: q[len_q][d_k], k[len_kv][d_k], v[len_kv][d_v], out[len_q][d_v].
 * len_q == 0 does nothing. */
SDPA_API sdpa_status sdpa_attention_f32(float *out, const float *q, const float *k, const float *v,
                                        size_t len_q, size_t len_kv, size_t d_k, size_t d_v,
                                        float scale, uint32_t flags);

/* Batched multi-head attention with grouped-query heads, strided views and an optional mask and
 * lse, every type SDPA_F32. */
SDPA_API sdpa_status sdpa_mha_f32(const sdpa_mha_desc *desc, float *out, const float *q,
                                  const float *k, const float *v);

/* sdpa_mha_f32 with the types of desc->q_type, kv_type and out_type (f32 for a v1 descriptor):
 * views are widened to float exactly, computed as f32, and out rounded once. kv_type may be
 * an 8-bit type, standing for k_scale and v_scale times its values (a v3 descriptor; 0 or
 * v2: 1): k_scale joins the scores' scale, v_scale the output's normalisation (a product
 * there past float's range: SDPA_ERR_ARG). d_k and d_v at
 * most 8192 with a view narrower than f32 (else SDPA_ERR_SIZE). The f32 bound plus that
 * rounding; all-bf16 calls may use the bf16 dot add-ons (docs/numerics.md, "bf16 Q.K"). */
SDPA_API sdpa_status sdpa_mha(const sdpa_mha_desc *desc, void *out, const void *q, const void *k,
                              const void *v);

/* Fills *desc for dense [batch][head][row][col] (BHSD) views, q[batch][heads_q][len_q][d_k],
 * k and v [batch][heads_kv][len_kv][...], out [batch][heads_q][len_q][d_v], no mask.
 * SDPA_ERR_NULL for desc; sdpa_mha_f32 checks the rest. */
SDPA_API sdpa_status sdpa_mha_desc_dense(sdpa_mha_desc *desc, size_t batch, size_t heads_q,
                                         size_t heads_kv, size_t len_q, size_t len_kv, size_t d_k,
                                         size_t d_v, float scale, uint32_t flags);

/* The same for [batch][row][head][col] (BSHD), the layout most inference engines keep. */
SDPA_API sdpa_status sdpa_mha_desc_bshd(sdpa_mha_desc *desc, size_t batch, size_t heads_q,
                                        size_t heads_kv, size_t len_q, size_t len_kv, size_t d_k,
                                        size_t d_v, float scale, uint32_t flags);

/* Adds mask[b * stride_batch + h * stride_head + i * stride_row + j] to the score of query i
 * and key j; a stride of 0 broadcasts. */
SDPA_API sdpa_status sdpa_mha_desc_set_mask(sdpa_mha_desc *desc, const float *mask,
                                            size_t stride_batch, size_t stride_head,
                                            size_t stride_row);

/* Sets desc->mods (NULL: none) and makes desc a v3 descriptor (struct_size, with k_scale and
 * v_scale 0 if it was not one). sdpa_mha_desc_dense and _bshd fill a v2 descriptor, the size
 * every caller's struct has, so a descriptor they filled takes modifiers only through this.
 * SDPA_ERR_NULL for desc; the call checks mods. Since ABI 1.4. */
SDPA_API sdpa_status sdpa_mha_desc_set_mods(sdpa_mha_desc *desc, const sdpa_score_mods *mods);

/* Merges two partial attentions of the same rows over disjoint keys, (out, lse) and (out_b,
 * lse_b), rows x d_v floats with row strides, into (out, lse) over the union. A part whose lse is
 * -inf adds nothing; any merge order gives the attention bound (docs/numerics.md, "Merging").
 * Errors: SDPA_ERR_NULL when rows > 0; SDPA_ERR_SIZE for d_v == 0, a stride below d_v with
 * rows > 1, an extent past PTRDIFF_MAX bytes, or an overlap other than out == out_b (same
 * stride) with lse == lse_b. */
SDPA_API sdpa_status sdpa_attention_merge_f32(float *out, float *lse, const float *out_b,
                                              const float *lse_b, size_t rows, size_t d_v,
                                              size_t out_stride, size_t out_b_stride);

/* ======== Backward ========
 * dq, dk and dv of out = attention(q, k, v) given dout, in one fused call that recomputes the
 * weights from the forward's lse (docs/numerics.md, "The backward"). desc is the forward's
 * (v2, every type SDPA_F32) with desc->lse holding what it wrote; q, k, v, out its inputs and
 * output. Every element of dq, dk, dv is written; a kv head's dk and dv sum over its query
 * heads, and a batch or head stride of 0 in a gradient sums over that axis. A pair (i, j) that
 * row i does not see contributes nothing. Score modifiers (desc->mods) as the forward took
 * them: the softcap's derivative flows into dq and dk; the window, segments, ALiBi and the mask
 * get no gradient; grads->dsinks (v2) receives the sinks'. Bitwise the same at every thread
 * count.
 * Errors, before any work (nothing written): every error of sdpa_mha_f32 for desc, q, k, v, out;
 *   SDPA_ERR_NULL  grads, or with query rows desc->lse, out, dout or dq, with keys dk or dv;
 *   SDPA_ERR_ARG   grads->struct_size too small, reserved not 0, a v1 desc, a type not f32;
 *   SDPA_ERR_SIZE  with keys, d_k or d_v zero; a row stride below its row; a view past
 *                  PTRDIFF_MAX bytes; gradient rows that share an element other than through a
 *                  stride of 0; a gradient meeting another array (so no packed qkv gradient).
 * Error per output within 1e-5 of the size of its terms (docs/numerics.md). */
SDPA_API sdpa_status sdpa_mha_backward_f32(const sdpa_mha_desc *desc, const sdpa_mha_grads *grads,
                                           const float *q, const float *k, const float *v,
                                           const float *out);

/* ======== Paged K/V caches ========
 * The call a serving engine makes: one call over a batch of sequences of different lengths,
 * each with its new query tokens packed one after the other ([token][head][d]) and its keys and
 * values in fixed-size blocks of a shared pool, found through its row of a block table (as
 * vLLM's block_table, or with blocks of 1 token SGLang's req_to_token). Since ABI 1.4. */

/* The pool: key j of sequence s and kv head h is at k_pool[b * k_stride[0] + h * k_stride[1] +
 * (j % block_size) * k_stride[2] + c], b = block_table[s * block_table_stride + j / block_size]
 * (v likewise, with v_stride and d_v). */
typedef struct sdpa_kv_cache {
    uint32_t struct_size; /* sizeof(sdpa_kv_cache) as the caller compiled it */
    uint32_t kv_type;     /* sdpa_dtype of the stored k and v, any */
    size_t num_blocks; /* blocks in the pool: a table entry outside [0, num_blocks) is an error */
    size_t block_size; /* tokens per block (1 gives a token table, as SGLang's) */
    size_t heads_kv, d_k, d_v;
    /* [block][head][token] in elements; a token's d values contiguous */
    size_t k_stride[3], v_stride[3];
    const int32_t *block_table; /* [num_seqs][block_table_stride]: sequence s's n-th block */
    size_t block_table_stride;
    float k_scale, v_scale; /* 8-bit types: value = scale * stored (0 means 1), finite; other
                               types: 0 or 1 */
} sdpa_kv_cache;

/* A step's sequences and their query rows. */
typedef struct sdpa_batch {
    uint32_t struct_size; /* sizeof(sdpa_batch) as the caller compiled it */
    uint32_t flags;       /* SDPA_CAUSAL: bottom-right within each sequence */
    size_t num_seqs, heads_q;
    const int32_t *q_start; /* [num_seqs + 1], non-decreasing from 0: sequence s owns query rows
                               q_start[s] .. q_start[s+1]-1 of q and out (its newest tokens) */
    /* [num_seqs]: keys of sequence s in the cache, its new tokens included */
    const int32_t *kv_len;
    float scale; /* SDPA_DEFAULT_SCALE for 1/sqrt(d_k) */
    uint32_t q_type, out_type;
    size_t q_stride[2], out_stride[2]; /* [token][head] in elements */
    float *lse;                        /* optional [token][head] */
    size_t lse_stride[2];
    const sdpa_score_mods *mods; /* or NULL; segments do not apply (SDPA_ERR_ARG) */
} sdpa_batch;

/* out = sdpa_mha of each sequence: its rows of q against its kv_len[s] keys (GQA as sdpa_mha,
 * causal bottom-right within the sequence), every type, special value and bound of sdpa_mha.
 * A sequence with no rows costs nothing and reads nothing; one with rows and no keys gets zeros
 * (lse -inf). The bits are sdpa_mha's where block_size is a multiple of 64 (d_k, d_v <= 128),
 * else a function of the values and block_size, never of the table or the thread count.
 * Errors, before any work (nothing written):
 *   SDPA_ERR_NULL  batch or cache, or with rows q_start, kv_len, q, out, and with keys read the
 *                  pools or block_table;
 *   SDPA_ERR_ARG   a struct_size too small, unknown flags or type, non-finite scale, mods that
 *                  sdpa_mha rejects or with segments, k_scale or v_scale not 0 or 1; q_start
 *                  not from 0 or decreasing; a
 *                  negative kv_len; causal with more rows than keys in a sequence; a table entry
 *                  outside [0, num_blocks) for a key the call reads;
 *   SDPA_ERR_SIZE  the sizes and strides rules of sdpa_mha for q, out, lse and the pools
 *                  (block_size 0 with keys, a token stride below its row, out or lse rows that
 *                  share an element, an extent past PTRDIFF_MAX bytes, out or lse meeting q,
 *                  the pools or each other). */
SDPA_API sdpa_status sdpa_attention_paged(const sdpa_batch *batch, const sdpa_kv_cache *cache,
                                          void *out, const void *q, const void *k_pool,
                                          const void *v_pool);

/* Writes n tokens' k and v (src_type, [token][head][d] with the strides given) into the cache:
 * token t goes to block slots[t] / block_size, position slots[t] % block_size, converted to
 * kv_type as sdpa_convert does (the same type: copied bit for bit; an 8-bit kv_type: the value
 * divided by the cache's scale in float, then rounded). A slot named twice keeps the
 * later token. Errors, before anything is written: SDPA_ERR_NULL (with n > 0); SDPA_ERR_ARG for
 * a cache the paged call rejects, an unknown src_type, or a slot outside [0, num_blocks *
 * block_size); SDPA_ERR_SIZE for a stride below its row, an extent past PTRDIFF_MAX bytes, or a
 * source meeting a pool. */
SDPA_API sdpa_status sdpa_kv_cache_store(const sdpa_kv_cache *cache, void *k_pool, void *v_pool,
                                         const int64_t *slots, size_t n, const void *k,
                                         const void *v, uint32_t src_type,
                                         const size_t k_src_stride[2],
                                         const size_t v_src_stride[2]);

/* ======== Threads ========
 * An attention call, forward or backward, splits its work into tasks by the shape alone and
 * runs them on the built-in pool or a host's parallel_for: results are bitwise identical for
 * every thread count and scheduler. Small calls stay on the caller's thread; a call that finds
 * the pool busy, or that runs inside one of sdpa's tasks, runs on its own thread; a thread that
 * cannot be created means fewer threads, never a failure. A host whose parallel_for cannot nest
 * sets 1 thread around calls made inside its own tasks. Idle pool threads sleep; after fork()
 * the child may call at once. Memory: a task's scratch is on its thread's stack, under 128 KiB
 * forward (about 130 KiB more with 16-bit views) and about 180 KiB backward; with more than one
 * thread, a split-KV workspace of at most 8.5 MB (16 MiB backward), reused until unload.
 * Details: docs/numerics.md, "Tasks, threads and memory". */

/* Threads per call: 0 is the default (the CPUs of the affinity mask, or SDPA_NUM_THREADS), 1 the
 * caller's only. At most 1024, else SDPA_ERR_ARG. Process-wide, for calls that start later. */
SDPA_API sdpa_status sdpa_set_num_threads(size_t n);

SDPA_API size_t sdpa_num_threads(void); /* what a call starting now may use; never 0 */

/* A host's scheduler instead of the pool: fn(ctx, task, arg, n_tasks) runs task(arg, i) once
 * for every i < n_tasks, on any threads in any order, and returns when all have finished.
 * fn == NULL restores the pool. Takes effect for calls that start after it returns. */
SDPA_API sdpa_status sdpa_set_parallel_for(sdpa_parallel_for_fn fn, void *ctx);

/* ======== Plugin table ========
 * A host that dlopen()s the library looks up one symbol:
 *     const sdpa_api *(*get)(uint32_t) = (const sdpa_api *(*)(uint32_t))dlsym(h, "sdpa_get_api");
 *     const sdpa_api *api = get ? get(SDPA_ABI_VERSION) : NULL;
 * The table is append-only: one pointer per public function, in the order they joined the ABI.
 * A host built against a newer header checks SDPA_API_HAS before reading a field. */
typedef struct sdpa_api {
    uint32_t abi_version; /* SDPA_ABI_VERSION of the library that filled the table */
    uint32_t struct_size; /* sizeof(sdpa_api) in that library: fields at or past it are absent */
    /* ABI 1.0 */
    const char *(*status_string)(sdpa_status status);
    uint32_t (*abi_version_fn)(void);
    const char *(*version)(void);
    sdpa_status (*dot_f32)(const float *a, const float *b, size_t n, float *result);
    sdpa_status (*scale_f32)(float *y, const float *x, size_t n, float alpha);
    sdpa_status (*softmax_f32)(float *y, const float *x, size_t n, float scale);
    sdpa_status (*softmax_backward_f32)(float *dx, const float *y, const float *dy, size_t n,
                                        float scale);
    sdpa_status (*scores_f32)(float *s, const float *q, const float *k, size_t n_keys, size_t d,
                              size_t k_stride, float scale);
    const char *(*backend)(void);
    sdpa_status (*set_backend)(const char *name);
    int (*backend_supported)(const char *name);
    const char *(*backend_name)(size_t index);
    const char *(*exp_mode)(void);
    sdpa_status (*set_exp_mode)(const char *name);
    sdpa_status (*attention_f32)(float *out, const float *q, const float *k, const float *v,
                                 size_t len_q, size_t len_kv, size_t d_k, size_t d_v, float scale,
                                 uint32_t flags);
    sdpa_status (*mha_f32)(const sdpa_mha_desc *desc, float *out, const float *q, const float *k,
                           const float *v);
    sdpa_status (*mha_desc_dense)(sdpa_mha_desc *desc, size_t batch, size_t heads_q,
                                  size_t heads_kv, size_t len_q, size_t len_kv, size_t d_k,
                                  size_t d_v, float scale, uint32_t flags);
    sdpa_status (*mha_desc_bshd)(sdpa_mha_desc *desc, size_t batch, size_t heads_q, size_t heads_kv,
                                 size_t len_q, size_t len_kv, size_t d_k, size_t d_v, float scale,
                                 uint32_t flags);
    sdpa_status (*mha_desc_set_mask)(sdpa_mha_desc *desc, const float *mask, size_t stride_batch,
                                     size_t stride_head, size_t stride_row);
    /* ABI 1.1 */
    sdpa_status (*mha)(const sdpa_mha_desc *desc, void *out, const void *q, const void *k,
                       const void *v);
    sdpa_status (*convert)(void *dst, sdpa_dtype dst_type, const void *src, sdpa_dtype src_type,
                           size_t n);
    sdpa_status (*set_num_threads)(size_t n);
    size_t (*num_threads)(void);
    sdpa_status (*set_parallel_for)(sdpa_parallel_for_fn fn, void *ctx);
    sdpa_status (*attention_merge_f32)(float *out, float *lse, const float *out_b,
                                       const float *lse_b, size_t rows, size_t d_v,
                                       size_t out_stride, size_t out_b_stride);
    /* ABI 1.2 */
    sdpa_status (*mha_backward_f32)(const sdpa_mha_desc *desc, const sdpa_mha_grads *grads,
                                    const float *q, const float *k, const float *v,
                                    const float *out);
    /* ABI 1.3 */
    const char *(*last_error_detail)(void);
    size_t (*info_count)(sdpa_info_kind kind);
    sdpa_status (*info)(sdpa_info_kind kind, size_t index, sdpa_info_entry *entry);
    /* ABI 1.4 */
    sdpa_status (*attention_paged)(const sdpa_batch *batch, const sdpa_kv_cache *cache, void *out,
                                   const void *q, const void *k_pool, const void *v_pool);
    sdpa_status (*kv_cache_store)(const sdpa_kv_cache *cache, void *k_pool, void *v_pool,
                                  const int64_t *slots, size_t n, const void *k, const void *v,
                                  uint32_t src_type, const size_t k_src_stride[2],
                                  const size_t v_src_stride[2]);
    sdpa_status (*mha_desc_set_mods)(sdpa_mha_desc *desc, const sdpa_score_mods *mods);
    /* New functions go here, at the end, and nowhere else. */
} sdpa_api;

/* 1 if the table api (of size api->struct_size) contains the field member. */
#define SDPA_API_HAS(api, member)                                                                  \
    ((api)->struct_size >= offsetof(sdpa_api, member) + sizeof((api)->member))

/* The table for ABI major version abi_version (pass SDPA_ABI_VERSION), or NULL if this library
 * cannot serve it. Static and const: the same pointer every time, nothing allocated. */
SDPA_API const sdpa_api *sdpa_get_api(uint32_t abi_version);

#ifdef __cplusplus
}
#endif

#endif /* SDPA_H */
