/* sdpa: scaled dot-product attention on the CPU, one stable C ABI over per-ISA SIMD backends.
 *
 *     Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V
 *
 * ABI v1. Names, argument orders and meanings below never change within 1.x; new functions are
 * only ever added. Every function is thread-safe. Pointers need no particular alignment.
 *
 * Errors: every call that can fail returns an sdpa_status. Arguments are checked before any work,
 * and on error no output is written and no input is read; sdpa_last_error_detail() then says
 * which argument broke which rule. Nothing aborts and nothing prints,
 * except the lines on stderr at load time listed under Environment below. No array can hold
 * more than PTRDIFF_MAX bytes: a count or an extent past that is SDPA_ERR_SIZE, whatever the
 * pointer.
 *
 * Environment, read once at load time (empty is the same as unset). These five variables are
 * the only ones read, and a value that cannot be used prints exactly one line on stderr, the
 * only output the library ever writes, then the default applies:
 *   SDPA_BACKEND=<name> or auto (the backends below): "sdpa: SDPA_BACKEND=<value> is not a known
 *     backend; using <best>" or "... is not supported on this CPU; using <best>".
 *   SDPA_EXP=fast or sleef (sdpa_set_exp_mode): "sdpa: SDPA_EXP=<value> is not a known exp mode;
 *     using fast".
 *   SDPA_NUM_THREADS=<n>, digits only, 0 to 1024 (0: the default; sdpa_set_num_threads):
 *     anything else, a sign, a blank or a prefix included, gives "sdpa: SDPA_NUM_THREADS=<value>
 *     is not a decimal thread count from 0 to 1024; using the CPUs available, <n>".
 *   SDPA_AMX and SDPA_BF16_DOT = on, off or auto (the avx512 bf16 dot add-ons, sdpa_mha): "sdpa:
 *     <variable>=<value> is not on, off or auto; using auto: <on or off> (<why>)", the reason
 *     `sdpa info` gives. =on does nothing where the CPU or OS lacks what the add-on needs.
 *
 * Floating-point environment: no call changes the rounding mode or the flush-to-zero and
 * denormals-are-zero bits, failed calls included. Exception flags: dot, scale and scores raise
 * what their IEEE arithmetic raises; softmax, softmax_backward and attention may raise
 * FE_INVALID, FE_OVERFLOW, FE_UNDERFLOW and FE_INEXACT on any input, finite ones too (their
 * vector exps run on lanes and rows whose results are dropped), and never FE_DIVBYZERO. Calls
 * expect the default masked exceptions: with a trap enabled, a call may trap.
 *
 * Special values (z below is the scaled input of a softmax, z_i = scale * x_i rounded to float
 * once, in the caller's rounding mode; every pass over a row sees that z):
 *   - entries with z = -inf get exactly 0; a row that is entirely -inf gives all zeros (a fully
 *     masked row), never NaN;
 *   - any NaN in z makes every output of the row NaN;
 *   - +inf entries share the mass equally and every other entry gets 0 (the limit);
 *   - outputs are never subnormal: a weight below FLT_MIN is exactly 0.
 *   dot, scale and scores follow IEEE arithmetic (NaN and inf propagate as in the sums they are).
 *
 * Accuracy, measured against a double-precision reference in the test suite on every backend:
 *   - sdpa_scale_f32: bit-exact, one IEEE multiply per element on every backend;
 *   - sdpa_dot_f32, sdpa_scores_f32: |error| <= 1e-5 * sum_i |a_i * b_i| for n <= 4096;
 *   - sdpa_softmax_f32: relative error per element <= 2e-5 for n <= 4096 and <= 1e-4 for
 *     n <= 2^20 when |scale * x_i| <= 80 (outputs below 2 * FLT_MIN may be 0);
 *   - sdpa_softmax_backward_f32, with D_i = |dy_i| + sum_j |y_j dy_j|, at any n:
 *     |error| <= (1e-5 * |scale * y_i| + FLT_MIN) * D_i + FLT_MIN * (1 + (2n + 1) |scale * y_i|);
 *     the FLT_MIN terms are what flush-to-zero can lose (without FTZ, a few 2^-149).
 *   The default exp ("fast", inlined: a table of 2^(j/16) or 2^(j/8) and a cubic on avx512 and
 * avx2, a degree-5 polynomial elsewhere) is within 3 ULP of exp over the whole float range where
 * the result is a normal float (subnormal results are flushed to 0, overflow gives +inf, NaN
 * stays NaN); so is the exp as softmax runs it, with the row's max folded into it, against
 * exp(z - max), including avx512's softmax of rows up to 4096 floats, whose exp takes a table of
 * 2^(j/32) and a quadratic (the weights only matter up to a common factor there); under the
 * directed rounding modes, within 4 ULP. "sleef" uses SLEEF's expf instead, within 1 ULP
 * (SDPA_EXP=sleef or sdpa_set_exp_mode("sleef")). What each backend measures against these
 * bounds: docs/performance.md, "Measured accuracy".
 */
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

typedef enum sdpa_status {
    SDPA_OK = 0,
    SDPA_ERR_NULL = 1, /* a required pointer is NULL */
    SDPA_ERR_SIZE = 2, /* a size that must not be zero is zero, or a size computation overflows */
    SDPA_ERR_ARG = 3,  /* another invalid argument: non-finite scale, unknown flag bits, ... */
    SDPA_ERR_UNSUPPORTED = 4 /* unknown backend name, or a backend this CPU cannot run */
} sdpa_status;

/* A short English description of status; never NULL (unknown values give "unknown status"). */
SDPA_API const char *sdpa_status_string(sdpa_status status);

/* What the last call on this thread that returned an error found wrong, naming the argument and
 * the rule it breaks, e.g. "heads_q (8) is not a multiple of heads_kv (3)"; "" before any error.
 * Every function that returns an sdpa_status sets it when it fails. A call that succeeds leaves
 * it as it was (as errno), so read it right after the failing call. The string is this thread's
 * own, valid until its next failing call; English, for people, not parsed by programs (the
 * status is the contract; the wording may change). Since ABI 1.3. */
SDPA_API const char *sdpa_last_error_detail(void);

/* SDPA_ABI_VERSION of the library that was loaded. */
SDPA_API uint32_t sdpa_abi_version(void);

/* Library version, "MAJOR.MINOR.PATCH". */
SDPA_API const char *sdpa_version(void);

/* ---- Kernels. n == 0 is valid and does nothing (dot stores 0). NULL is an error only when
 *      something would be read or written through it. ---- */

/* *result = sum_i a[i] * b[i]. */
SDPA_API sdpa_status sdpa_dot_f32(const float *a, const float *b, size_t n, float *result);

/* y[i] = alpha * x[i]; y == x is allowed. Any alpha, including non-finite, is valid. */
SDPA_API sdpa_status sdpa_scale_f32(float *y, const float *x, size_t n, float alpha);

/* y = softmax(scale * x), numerically stable: every exp is shifted by the row max, or by a
 * value of the row at most 64 below it, checked against the max (avx512 and avx2 try such a
 * guess first, so that the exps need not wait for the max), so no finite input overflows;
 * y == x is allowed. scale must be finite and non-zero (else SDPA_ERR_ARG). A row of one entry
 * with a finite z gives exactly 1, and no weight exceeds 1, in any rounding mode. */
SDPA_API sdpa_status sdpa_softmax_f32(float *y, const float *x, size_t n, float scale);

/* Gradient of softmax(scale * x) given its output y and the upstream gradient dy:
 * dx[i] = scale * y[i] * (dy[i] - sum_j y[j] * dy[j]). dx may alias y or dy.
 * scale must be finite and non-zero. */
SDPA_API sdpa_status sdpa_softmax_backward_f32(float *dx, const float *y, const float *dy, size_t n,
                                               float scale);

/* s[j] = scale * dot(q, k + j * k_stride) over d floats, for j < n_keys.
 * k_stride >= d (else SDPA_ERR_SIZE, also when d == 0 with n_keys > 0); scale finite. */
SDPA_API sdpa_status sdpa_scores_f32(float *s, const float *q, const float *k, size_t n_keys,
                                     size_t d, size_t k_stride, float scale);

/* ---- Backends: "scalar", "sse" (SSE4.1), "avx2" (AVX2+FMA), "avx512" (AVX-512F),
 *      "neon" (AArch64 Advanced SIMD). The best one this CPU and OS can run is chosen once, at
 *      load time; SDPA_BACKEND=<name> in the environment forces one (an unknown or unsupported
 *      name falls back to the best, with one line on stderr). ---- */

/* Name of the active backend. */
SDPA_API const char *sdpa_backend(void);

/* Make name the active backend for the whole process, or "auto" for the best one.
 * SDPA_ERR_NULL for NULL, SDPA_ERR_UNSUPPORTED for an unknown name or one this CPU cannot run
 * (the active backend is then unchanged). Calls in flight finish on the backend they started on. */
SDPA_API sdpa_status sdpa_set_backend(const char *name);

/* 1 if the backend is compiled into this library and this CPU (and OS) can run it, else 0. */
SDPA_API int sdpa_backend_supported(const char *name);

/* The index-th backend name this library knows, best first; NULL past the end. */
SDPA_API const char *sdpa_backend_name(size_t index);

/* exp used by softmax (and attention): "fast" (default) or "sleef" (see Accuracy above).
 * SDPA_EXP=sleef in the environment selects "sleef" at load time. */
SDPA_API const char *sdpa_exp_mode(void);
SDPA_API sdpa_status sdpa_set_exp_mode(const char *name); /* SDPA_ERR_UNSUPPORTED if unknown */

/* ---- Attention: out = softmax(scale * Q K^T + mask) V, fused and streaming (no len_q x len_kv
 *      matrix is ever formed: K and V are read in blocks with an online softmax).
 *
 * Semantics, for both entry points:
 *   - scale: SDPA_DEFAULT_SCALE (0) means 1/sqrt(d_k); any other finite value is used as is;
 *     a non-finite scale is SDPA_ERR_ARG.
 *   - Scores: s_ij = scale * (q_i . k_j) + mask_ij, in that order: the dot over d_k summed in
 *     float, then the multiply by scale, rounded once, then the mask entry added. Every row's
 *     scores are formed so whatever the call's shape (how many rows or grouped heads it has,
 *     the block a row falls in): scale * q is never formed, so nothing overflows or underflows
 *     where scale * (q . k) does not, and a row gives the same result, within the bound below,
 *     alone or among others. As for sdpa_dot_f32, a dot whose float partial sums overflow may
 *     give inf or NaN.
 *   - SDPA_CAUSAL is bottom-right aligned (the KV-cache convention): query row i sees the keys
 *     j <= i + (len_kv - len_q). Unknown flag bits are SDPA_ERR_ARG.
 *   - A query row that sees no key (causal with len_q > len_kv, a mask row that is all -inf,
 *     len_kv == 0) gets zeros, never NaN.
 *   - A mask entry of -inf removes that key exactly: the key's values are never read into the
 *     sum, so NaN or inf in a removed key's V does not reach the output. Other mask entries are
 *     added to the scaled scores (a NaN there gives a NaN row).
 *   - NaN in a query row, or in the k of a key the row sees, gives a NaN output row; so does an
 *     inf there that makes a score NaN or +inf. A score of -inf (an inf in q or k can make one)
 *     gives its key weight 0, as in softmax, and a row whose scores are all -inf is zeros. NaN in
 *     the v of a key the row sees with a finite score gives NaN in the output columns where that
 *     v holds NaN.
 *   - out must not overlap q, k, v or the mask. A call spreads its work over threads (see
 *     Threads below); its results are bitwise the same at every thread count.
 * Errors (checked before any work; out is untouched on error):
 *   SDPA_ERR_NULL  a pointer that would be read or written is NULL (and desc == NULL);
 *   SDPA_ERR_SIZE  heads_kv zero or not dividing heads_q (always); with output rows: d_k or d_v
 *                  zero, a row stride of q, k, v or out smaller than its row (only checked
 *                  where a view has more than one row), an out view whose rows share a float
 *                  (a stride of 0, or one inside the span of an inner axis, on an axis of more
 *                  than one entry), an extent past PTRDIFF_MAX bytes. The mask is only read:
 *                  any strides are valid (0 broadcasts, and a row stride of 0 gives every query
 *                  row one mask row) within that extent; out or lse whose extent (first to
 *                  last element) meets that of q, k, v or the mask (where they are read: with
 *                  output rows and keys) or of each other;
 *   SDPA_ERR_ARG   unknown flags, non-finite scale, struct_size smaller than the v1 struct or
 *                  ending inside one of the v2 groups below.
 * Accuracy (unit-normal q, k, v and the default scale, which gives the scores about unit
 * variance; measured in the test suite on every backend and both exp modes against a
 * double-precision evaluation of the textbook formula): max abs error per output
 * <= 1e-5 * max|v| for len_kv <= 4096 and d_k <= 256 (measured worst case over random shapes
 * with len_q, len_kv <= 300 and decode with len_kv = 4096: 3.3e-7 * max|v|). Scores are formed
 * and summed over d_k in float, so the error grows in proportion to their size: with an
 * explicit scale of 1, 2 or 3 and d_k up to 256 (scores with standard deviations up to 16, 32
 * and 48) it measured up to 0.7e-5, 1.03e-5 and 1.46e-5 * max|v|.
 * Memory: scratch is on the stack of each thread that runs a task (under 128 KiB); for
 * d_v > 256 the output rows themselves hold the running sums until they are normalised. With one
 * thread nothing is allocated. With more, a split-KV call (Threads below) keeps its partial
 * results in a workspace that grows to the largest call and is then reused, and freed at
 * unload: U * C * 32 * (d_v + 1) floats for U units of rows (batch * heads_q, or for grouped
 * decode batch * heads_kv * ceil(group / 32)) split into C chunks each (Threads below); U * C is
 * below 256 and d_v at most 256, so never more than 8.4 MB. For example 1.1 MB for decode with
 * 32 query heads over 8 kv heads, 4096 keys, d = 128. ---- */

#define SDPA_DEFAULT_SCALE 0.0f /* scale argument meaning 1/sqrt(d_k) */
#define SDPA_CAUSAL        (1u << 0)

/* Single head, dense row-major: q[len_q][d_k], k[len_kv][d_k], v[len_kv][d_v],
 * out[len_q][d_v]. len_q == 0 is valid and does nothing. */
SDPA_API sdpa_status sdpa_attention_f32(float *out, const float *q, const float *k, const float *v,
                                        size_t len_q, size_t len_kv, size_t d_k, size_t d_v,
                                        float scale, uint32_t flags);

/* Batched multi-head attention with grouped-query heads, strided views and an additive mask.
 * Query head h reads key/value head h / (heads_q / heads_kv): heads_kv == heads_q is MHA,
 * heads_kv == 1 is MQA. Element [b][h][r][c] of a view X is X[b * x_stride[0] +
 * h * x_stride[1] + r * x_stride[2] + c] (strides in floats; a batch or head stride of 0
 * broadcasts, e.g. one K/V for every batch entry). */
typedef struct sdpa_mha_desc {
    /* sizeof(sdpa_mha_desc) as the caller compiled it: lets the struct grow */
    uint32_t struct_size;
    uint32_t flags;                  /* SDPA_CAUSAL, ... */
    size_t batch, heads_q, heads_kv; /* heads_q % heads_kv == 0: GQA, MQA (heads_kv == 1), MHA */
    size_t len_q, len_kv, d_k, d_v;
    float scale; /* SDPA_DEFAULT_SCALE for 1/sqrt(d_k) */
    /* strides in elements for [batch][head][row]; rows are contiguous (last stride 1) */
    size_t q_stride[3], k_stride[3], v_stride[3], out_stride[3];
    const float *mask; /* optional additive mask [len_q][len_kv] per (batch, head); NULL for none */
    size_t mask_stride[3]; /* [batch][head][row]; 0 broadcasts; columns contiguous */
    /* ---- v2: two groups, the types (q_type to reserved) and the lse (lse, lse_stride), each
     * read when struct_size covers it whole (a v1 caller gets f32 and no lse) ---- */
    uint32_t q_type, kv_type, out_type; /* sdpa_dtype of q, of k and v, of out; sdpa_mha takes
                                           any, sdpa_mha_f32 only SDPA_F32 (0); an unknown value
                                           is SDPA_ERR_ARG. The mask and lse are always float. */
    uint32_t reserved;                  /* 0 (else SDPA_ERR_ARG) */
    /* Optional output (NULL for none): lse[b * lse_stride[0] + h * lse_stride[1] + r], the
     * natural log of sum_j exp(s_rj) over the keys query row r sees, s the scores with scale and
     * mask applied; -inf for a row that sees no key, NaN where the output row is NaN. With it, a
     * host can merge partial attentions over disjoint sets of keys. Like out, it must not overlap
     * the inputs or out; two of its own entries in one place are SDPA_ERR_SIZE. */
    float *lse;
    size_t lse_stride[2];
} sdpa_mha_desc;

SDPA_API sdpa_status sdpa_mha_f32(const sdpa_mha_desc *desc, float *out, const float *q,
                                  const float *k, const float *v);

/* ---- Backward: the gradients of out = attention(q, k, v) with respect to q, k and v, given the
 *      upstream gradient dout (of a loss L: dout = dL/dout), in one fused call
 *      (FlashAttention-2's order: K and V in blocks, the weights P recomputed from the forward's
 *      log-sum-exp, no len_q x len_kv matrix ever formed).
 *
 * With s_ij the scores (scale and mask applied), P_ij = exp(s_ij - lse_i), dP_ij = dout_i . v_j,
 * D_i = dout_i . out_i and dS_ij = P_ij (dP_ij - D_i):
 *     dv_j = sum_i P_ij dout_i,   dk_j = scale sum_i dS_ij q_i,   dq_i = scale sum_j dS_ij k_j,
 * the sums over the pairs (i, j) where row i sees key j. The mask gets no gradient.
 *
 * Semantics:
 *   - desc is the forward call's descriptor (sdpa_mha_desc v2, every type SDPA_F32), and desc->lse
 *     holds what that call wrote; q, k, v, out are its inputs and its output. The gradients are
 *     those of that forward only as far as lse and out are that call's.
 *   - dq, dk, dv are written, not accumulated: every element of their views is written.
 *   - GQA and broadcasting: dk and dv of a kv head are summed over the query heads that share it.
 *     A batch or head stride of 0 in dq, dk or dv sums the gradient over that axis (the layout
 *     of the gradient of a K or V broadcast with such a stride); any other stride gives each
 *     element its own gradient.
 *   - A row that saw no key (lse_i = -inf: causal with len_q > len_kv, a mask row of -inf,
 *     len_kv == 0) contributes nothing: its dq row is zeros and it adds nothing to dk or dv.
 *   - A key that row i does not see (causal, or a mask entry of -inf) gets exactly nothing from
 *     that row, and NaN or inf in that key's k or v, or in that row's q or dout, does not reach
 *     any gradient through the pair. A key that no row sees has dk and dv rows of zeros.
 *   - Otherwise NaN and inf propagate as in the sums above: an lse of NaN (a NaN output row)
 *     gives a NaN dq row and NaN in dk and dv of the keys the row sees.
 *   - Results are bitwise the same at every thread count and scheduler (Threads below): every
 *     gradient is summed in an order fixed by the shape (Memory and threads, below).
 * Errors (checked before any work; on error nothing is written):
 *   every error of sdpa_mha_f32 for desc, q, k, v and out (out is read here, as an input);
 *   SDPA_ERR_NULL  grads == NULL; with query rows (batch, heads_q, len_q > 0): desc->lse, out,
 *                  grads->dout or grads->dq NULL; with keys (batch, heads_q, len_kv > 0):
 *                  grads->dk or grads->dv NULL;
 *   SDPA_ERR_ARG   grads->struct_size smaller than this struct, grads->reserved not 0, a
 *                  descriptor shorter than v2 (it has no lse), a type other than SDPA_F32;
 *   SDPA_ERR_SIZE  with keys, d_k or d_v zero; a row stride of dq, dk, dv or dout smaller than
 *                  its row where the view has more than one row; a view past PTRDIFF_MAX bytes;
 *                  dq, dk or dv rows that share a float other than through a batch or head
 *                  stride of 0; dq, dk or dv whose extent (first to last element) meets that of
 *                  another gradient or of q, k, v, out, dout, lse or the mask (interleaved
 *                  layouts, such as one packed qkv gradient tensor, are rejected).
 * Accuracy (unit-normal q, k, v, dout and the default scale, len_q, len_kv <= 4096, d <= 256;
 * measured in the test suite on every backend against a double-precision evaluation of the
 * formulas above, with P from double scores), per output, with E_ij = P_ij (|dP_ij| + |D_i| +
 * sum_c |dout_ic v_jc| + sum_c |dout_ic out_ic|) the size of dS_ij's terms:
 *     |error dv_jc| <= 1e-5 sum_i P_ij |dout_ic|,
 *     |error dk_jc| <= 1e-5 |scale| sum_i E_ij |q_ic|,
 *     |error dq_ic| <= 1e-5 |scale| sum_j E_ij |k_jc|,
 * each plus 1e-30 (measured worst, over every backend and both exp modes: 1.5e-6 for dv, 2.4e-7
 * for dk and dq, in those units). With another scale the bounds grow with the scores, whose
 * rounding moves P: times max(1, |scale| sqrt(d_k)), their standard deviation for unit-normal
 * q and k.
 * Memory and threads: each task's tiles are on its thread's stack (about 180 KiB; 245 KiB on
 * one thread with key chunks). A unit is one (batch, kv head), or the whole batch or head axis when
 * a gradient is summed over it; its task owns the unit's dk and dv rows and the dq rows of the
 * query heads that read it, and nothing is allocated. A call with fewer than 16 units, more
 * than 512 keys, d_k <= 256 and no summed axis (dq summed over query heads included) also cuts
 * each unit's keys into chunks of whole 512-key pieces, as many as give about 16 tasks: a task
 * then owns its chunk's dk and dv rows, and the dq sums of the chunks after the first wait in
 * the split-KV workspace (Threads below: it grows to the largest call and is kept; the
 * backward asks for at most 16 MiB, fewer chunks where more would need more) until they are
 * added in chunk order. With one thread, or when the workspace is busy or cannot grow, the call
 * runs on its own thread, with the same sums in the same order and nothing allocated. ---- */

/* Gradients of out = attention(q, k, v) given dout. Written, not accumulated. Strides in floats,
 * [batch][head][row] as in sdpa_mha_desc; rows contiguous. */
typedef struct sdpa_mha_grads {
    uint32_t struct_size; /* sizeof(sdpa_mha_grads) as the caller compiled it */
    uint32_t reserved;    /* 0 */
    float *dq, *dk, *dv;  /* laid out like q, k, v */
    size_t dq_stride[3], dk_stride[3], dv_stride[3];
    const float *dout; /* laid out like out */
    size_t dout_stride[3];
} sdpa_mha_grads;

/* desc: the descriptor of the forward call, with desc->lse holding what that call wrote.
 * q, k, v, out: the forward's inputs and output. */
SDPA_API sdpa_status sdpa_mha_backward_f32(const sdpa_mha_desc *desc, const sdpa_mha_grads *grads,
                                           const float *q, const float *k, const float *v,
                                           const float *out);

/* ---- 16-bit types. f16 is IEEE binary16; bf16 is the upper half of a binary32. ---- */
typedef enum sdpa_dtype { SDPA_F32 = 0, SDPA_F16 = 1, SDPA_BF16 = 2 } sdpa_dtype;

/* sdpa_mha_f32 with the element types of desc->q_type, kv_type and out_type (a v1 descriptor
 * is f32 throughout); strides stay in elements. The semantics, errors and special-value rules
 * are sdpa_mha_f32's, with each type's own inf and NaN. Q, K and V are widened to float, which
 * is exact; the scores, the softmax and the sums are float, as for f32, and out is rounded once
 * at the end, to nearest even: a result beyond 65504 becomes inf in an f16 out, and one below
 * f16's smallest normal its nearest subnormal. Accuracy: sdpa_mha_f32's bound, measured against
 * a double-precision reference on the stored 16-bit values, plus that final rounding when out
 * is 16-bit (half an ULP of the type: 2^-11 relative for f16, 2^-8 for bf16).
 * bf16 Q.K on AMX and AVX512_BF16 CPUs: with q_type and kv_type both SDPA_BF16, blocks of 8 and
 * more queries with d_k <= 128 may form Q.K from the bf16 values with AMX tiles (TDPBF16PS) or
 * vdpbf16ps (the avx512 backend's add-ons: AMX on by default where the CPU and the OS allow it,
 * SDPA_AMX=on or off, then vdpbf16ps, on by default only on CPUs where it was measured faster
 * (AMD family 26, Zen 5: docs/performance.md), SDPA_BF16_DOT=on or off, in the environment at
 * load time; `sdpa info` says which is in use and why; with AMX the library asks Linux
 * for the tile state at its first all-bf16 call, never at load, after which sigaltstack rejects
 * stacks smaller than the AMX signal frame, AT_MINSIGSTKSZ: docs/guarantees.md). Every product is
 * exact; the sums are float, added in another order, rounded to nearest whatever the rounding mode;
 * a subnormal q or k element counts as 0, and a partial sum below FLT_MIN may flush to 0. The bound
 * is the same (1e-5 max|v| against the double reference on the stored values: a subnormal's
 * products are below 2^-126 times the other element, far inside the dot's rounding term), but out
 * is not bit for bit the widened path's, and an inf in q or k that meets a subnormal element there
 * makes that score NaN, and so its row NaN, where the widened path's score is an infinity. Every
 * other special-value rule holds as for f32. With any 16-bit view, d_k and d_v must be at most 8192
 * (else SDPA_ERR_SIZE): blocks are widened into tiles on the stack, which take about 130 KiB more
 * than an f32 call's (a 16-bit K/V prefill widens each block of keys and values once for 64 query
 * rows). */
SDPA_API sdpa_status sdpa_mha(const sdpa_mha_desc *desc, void *out, const void *q, const void *k,
                              const void *v);

/* dst[i] = src[i] converted, for i < n: widening is exact; narrowing rounds to nearest, ties to
 * even, whatever the rounding mode, flush-to-zero or denormals-are-zero say; f16 results may be
 * subnormal, and a value beyond the largest finite f16 (65504, or from the halfway point 65520
 * up) gives inf. A NaN stays a NaN, quieted, with its sign, also when both types are the same
 * (otherwise such a call is a copy). f16 to bf16 and back go through float, rounded once.
 * src == dst is allowed when the types have the same size; any other overlap is SDPA_ERR_ARG,
 * and so is an unknown type. */
SDPA_API sdpa_status sdpa_convert(void *dst, sdpa_dtype dst_type, const void *src,
                                  sdpa_dtype src_type, size_t n);

/* Fills *desc for dense [batch][head][row][col] (BHSD) tensors q[batch][heads_q][len_q][d_k],
 * k[batch][heads_kv][len_kv][d_k], v[batch][heads_kv][len_kv][d_v],
 * out[batch][heads_q][len_q][d_v], no mask. SDPA_ERR_NULL for desc == NULL; the other
 * arguments are checked by sdpa_mha_f32. */
SDPA_API sdpa_status sdpa_mha_desc_dense(sdpa_mha_desc *desc, size_t batch, size_t heads_q,
                                         size_t heads_kv, size_t len_q, size_t len_kv, size_t d_k,
                                         size_t d_v, float scale, uint32_t flags);

/* The same for the [batch][row][head][col] (BSHD) layout most inference engines keep:
 * q[batch][len_q][heads_q][d_k], k[batch][len_kv][heads_kv][d_k], ... */
SDPA_API sdpa_status sdpa_mha_desc_bshd(sdpa_mha_desc *desc, size_t batch, size_t heads_q,
                                        size_t heads_kv, size_t len_q, size_t len_kv, size_t d_k,
                                        size_t d_v, float scale, uint32_t flags);

/* Adds a mask to *desc: mask[b * stride_batch + h * stride_head + i * stride_row + j] is added to
 * the score of query i and key j (contiguous in j); a stride of 0 broadcasts over that axis. */
SDPA_API sdpa_status sdpa_mha_desc_set_mask(sdpa_mha_desc *desc, const float *mask,
                                            size_t stride_batch, size_t stride_head,
                                            size_t stride_row);

/* Merges two partial attentions of the same rows over disjoint sets of keys: (out, lse) is one
 * part (the output rows and their log-sum-exps, as sdpa_mha_f32 writes them) and (out_b, lse_b)
 * the other; out and lse become the attention over the union. rows x d_v floats, row strides in
 * floats. With m = max(lse, lse_b), w = exp(lse - m), w_b = exp(lse_b - m):
 * out = (w out + w_b out_b) / (w + w_b), lse = m + log(w + w_b), in float on the active
 * backend (whose rounding may differ from another backend's, never from one run to the next).
 *   - A part whose lse is -inf (it saw no key) contributes exactly nothing: the other part is
 *     kept bit for bit. Two such parts give zeros and -inf.
 *   - Otherwise an lse that is NaN or +inf in either part makes the row NaN (out and lse); NaN
 *     in an out entry of a part that contributes reaches that column.
 *   - Merging the parts of a split in any order gives the unsplit attention within the bound
 *     of Accuracy above (merged in a fixed order, bitwise the same at every thread count).
 * Errors: SDPA_ERR_NULL for a NULL pointer when rows > 0 (rows == 0 does nothing); SDPA_ERR_SIZE
 * for d_v == 0, a stride smaller than d_v when rows > 1, an extent past PTRDIFF_MAX bytes, or
 * out and lse, or either with out_b or lse_b, overlapping: only out == out_b with
 * out_stride == out_b_stride and lse == lse_b may alias (a part merged with itself: out stays,
 * lse grows by log 2). */
SDPA_API sdpa_status sdpa_attention_merge_f32(float *out, float *lse, const float *out_b,
                                              const float *lse_b, size_t rows, size_t d_v,
                                              size_t out_stride, size_t out_b_stride);

/* ---- Threads. An attention call (sdpa_attention_f32, sdpa_mha_f32, sdpa_mha, and the backward,
 *      sdpa_mha_backward_f32, whose tasks its own section states) splits its work
 *      into tasks by the shape alone, never by the thread count, and runs them on the built-in
 *      pool or on the host's parallel_for, so its results are bitwise identical for every
 *      thread count, 1 included, and every scheduler.
 *
 *   - Tasks: prefill is one task per (batch, query head, block of 32 query rows; 16 on the
 *     scalar backend, fewer for some 16-bit views), the blocks with the most causal work first.
 *     Decode and short queries (len_q <= 16, or len_q == 1 with grouped heads) over at least
 *     1024 keys, with d_v <= 256 and an f32 out, are split-KV: the keys are cut into chunks
 *     of whole 512-key pieces (as many chunks as pieces, but no more than about 128 tasks
 *     need), each chunk's partial output and log-sum-exp computed by one task, and the chunks
 *     merged in key order as sdpa_attention_merge_f32 does; a 1-thread call runs the same
 *     chunks and merges.
 *   - A call with too little work to pay for waking a thread (under about 2^21 multiply-adds)
 *     runs on the caller's thread and never touches the pool.
 *   - A call with n threads uses n - 1 pool threads and the caller's. The pool starts at the
 *     first call that needs it and grows to the largest count used (a smaller count leaves the
 *     others asleep). One call uses it at a time: a call that finds it busy (or
 *     finds the split-KV workspace busy) runs on its own thread instead, so the pool is never
 *     oversubscribed and no call waits for another. A call made on a thread that is running one
 *     of sdpa's tasks (on the pool or on a host's parallel_for) runs on that thread. A call made
 *     inside a host's own task cannot be told apart: a host whose parallel_for cannot nest sets
 *     the thread count to 1 around such calls, or has its parallel_for run nested jobs inline.
 *   - Idle pool threads spin for a few tens of microseconds, then sleep: an idle pool costs no
 *     CPU. The threads and the workspace are released when the library is unloaded or the
 *     process exits. They take no signals.
 *   - After fork() the child may call at once: it has none of the parent's pool threads, and
 *     its first call that needs threads starts a pool of its own.
 *   - If a thread or the workspace cannot be created, the call runs with fewer threads or on
 *     the caller's alone; it never fails for that. ---- */

/* Threads used by one call. 0: the default, the CPUs in the process's affinity mask, or
 * SDPA_NUM_THREADS from the environment at load (an unusable value prints one line on stderr
 * and keeps the default); 1: the caller's thread only, no pool. At most 1024 (else
 * SDPA_ERR_ARG). Process-wide; takes effect for calls that start after it returns. */
SDPA_API sdpa_status sdpa_set_num_threads(size_t n);

/* The threads a call that starts now may use (the default resolved: never 0). */
SDPA_API size_t sdpa_num_threads(void);

/* A host's own scheduler instead of the built-in pool (oneDNN's threadpool interop and XNNPACK's
 * pthreadpool are the models). fn(ctx, task, arg, n_tasks) must run task(arg, i) once for every
 * i < n_tasks, in any order and on any threads, and return when all have finished. fn == NULL
 * restores the built-in pool. Calls with more than one thread and enough work go to fn; with
 * sdpa_set_num_threads(1) no call does. Takes effect for calls that start after it returns. */
typedef void (*sdpa_task_fn)(void *arg, size_t index);
typedef void (*sdpa_parallel_for_fn)(void *ctx, sdpa_task_fn task, void *arg, size_t n_tasks);
SDPA_API sdpa_status sdpa_set_parallel_for(sdpa_parallel_for_fn fn, void *ctx);

/* ---- Plugin entry point. A host that dlopen()s the library looks up only this symbol:
 *
 *     const sdpa_api *(*get)(uint32_t) = (const sdpa_api *(*)(uint32_t))dlsym(h, "sdpa_get_api");
 *     const sdpa_api *api = get ? get(SDPA_ABI_VERSION) : NULL;
 *
 * The table is append-only: every public function gets one pointer, in the order the functions
 * were added to the ABI, and a field never moves or changes type within 1.x. A host built
 * against an older header reads only the fields it knows; a host built against a newer header
 * must check that a field lies below struct_size before reading it (SDPA_API_HAS below). ---- */

typedef struct sdpa_api {
    uint32_t abi_version; /* SDPA_ABI_VERSION of the library that filled the table */
    uint32_t struct_size; /* sizeof(sdpa_api) in that library: fields at or past it are absent */
    /* ABI 1.0, in header order */
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
    /* New functions go here, at the end, and nowhere else. */
} sdpa_api;

/* 1 if the table api (of size api->struct_size) contains the field member. */
#define SDPA_API_HAS(api, member)                                                                  \
    ((api)->struct_size >= offsetof(sdpa_api, member) + sizeof((api)->member))

/* The function table for ABI major version abi_version (pass SDPA_ABI_VERSION), or NULL if this
 * library cannot serve that version. The table is static and const: the call costs nothing,
 * allocates nothing, and always returns the same pointer. */
SDPA_API const sdpa_api *sdpa_get_api(uint32_t abi_version);

#ifdef __cplusplus
}
#endif

#endif /* SDPA_H */
