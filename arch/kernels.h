/* Internal: the kernel table every backend fills, and what the backends share.
 * Not installed; the public ABI is include/sdpa.h.
 *
 * Contracts (the entry points in src/ check arguments, so kernels assume valid input):
 * no kernel reads or writes outside [p, p + n) of any array it is given, whatever n is; none
 * allocates, keeps state, or writes the floating-point control register. Every z = scale * x
 * is rounded once, in the caller's mode, and each pass over a row sees that z; steps that must
 * round to nearest whatever the mode use instructions that name their rounding, and avx2 reads
 * MXCSR's rounding bits to choose its exp (a magic-number rounding only under round-to-nearest,
 * roundps otherwise: arch/x86/avx2_exp.h). */
#ifndef SDPA_ARCH_KERNELS_H
#define SDPA_ARCH_KERNELS_H

#include <stddef.h>
#include <stdint.h>

enum sdpa_exp_kind { SDPA_EXP_FAST = 0, SDPA_EXP_SLEEF = 1, SDPA_EXP_KINDS = 2 };

/* Element types, as sdpa.h's sdpa_dtype numbers them (src/convert.c asserts it). */
enum sdpa_type { SDPA_TYPE_F32 = 0, SDPA_TYPE_F16 = 1, SDPA_TYPE_BF16 = 2, SDPA_TYPES = 3 };
/* The 8-bit types (OCP fp8), which kernels widen only to f16 (widen_fp8, indexed from E4M3):
 * e5m2 to its values, e4m3 to 2^-SDPA_FP8_E4M3_F16_SHIFT times its values (arch/convert_fp8.h
 * says why), a factor the caller takes back in the scales. */
enum sdpa_type_fp8 { SDPA_TYPE_FP8_E4M3 = 3, SDPA_TYPE_FP8_E5M2 = 4 };
#define SDPA_FP8_E4M3_F16_SHIFT 8

/* Largest tile the attention driver (src/attention.c) keeps on its stack: a backend's block_q
 * and block_kv must not exceed these. */
#define SDPA_ATTN_MAX_BLOCK_Q  32
#define SDPA_ATTN_MAX_BLOCK_KV 128
#define SDPA_ATTN_PACK_MAX_D   128 /* largest d_k for pack_q / scores_packed */
#define SDPA_ATTN_TYPED_MAX_D  512 /* largest d for scores_tile_typed / pv_tile_typed */

/* The longest row softmax_short takes. */
#define SDPA_SOFTMAX_SHORT 4096

/* The innermost loops of attention, one set per backend; the shared driver does the tiling,
 * the online softmax (with the table's max_scaled, exp_sum and scale), masks and causality. */
typedef struct sdpa_attention_kernels {
    size_t block_q;  /* queries per tile, 1..SDPA_ATTN_MAX_BLOCK_Q */
    size_t block_kv; /* keys per tile, 1..SDPA_ATTN_MAX_BLOCK_KV */
    /* S = scale A B^T: s[i * ld_s + j] = scale * dot(q + i * q_stride, k + j * k_stride, d) for
       i < nq, j < nk; nq <= block_q, nk <= block_kv (any nk for a single row, nq = 1), d >= 1.
       The forward's scores (A = Q, B = K); the backward's S^T and dP^T (A = K or V, B = Q or
       dO, nq a block of keys) where it has no packed path */
    void (*scores_tile)(float *s, size_t ld_s, const float *q, size_t q_stride, size_t nq,
                        const float *k, size_t k_stride, size_t nk, size_t d, float scale);
    /* C += A B: acc[i * ld_acc + c] += sum_j p[i * ld_p + j] * v[j * v_stride + c] for i < nq,
       c < d_v, the sum over j < nk; every product is formed (0 * NaN is NaN), so the driver
       leaves out the keys that must not count instead of passing them a zero weight. The
       forward's P V; the backward's dV += P^T dO and dK += dS^T Q (rows: keys) */
    void (*pv_tile)(float *acc, size_t ld_acc, const float *p, size_t ld_p, size_t nq, size_t nk,
                    const float *v, size_t v_stride, size_t d_v);
    /* C += A^T B, pv_tile with the weights key-major: acc[i * ld_acc + c] += sum_j
       p[j * ld_p + i] * v[j * v_stride + c], every product formed as in pv_tile; any nq and nk.
       p is 64-byte aligned and ld_p a multiple of 16, as in a key-major tile (sse loads four
       rows' weights with one aligned load). The backward's dQ += dS K, from the dS^T tile that
       its dK and dV products read row by row. */
    void (*pv_tile_t)(float *acc, size_t ld_acc, const float *p, size_t ld_p, size_t nq, size_t nk,
                      const float *v, size_t v_stride, size_t d_v);
    /* optional, per 16-bit type t (f16, bf16; NULL for f32 and where a backend has none):
       scores_tile and pv_tile with k and v rows of type t as they are (strides in elements),
       for d, d_v <= SDPA_ATTN_TYPED_MAX_D. Each vector is widened as it is loaded instead of
       the block being widened first into a float tile (stored, then loaded again for only nq
       FMAs an element); the widening is exact and the FMAs are the float entry's in the same
       order, so the results are those of widen[t] then the float entry, bit for bit. They read
       ahead of their loads (decode streams K and V from memory): past the nk rows given, into
       the rows at ahead, a stride apart, which the caller reads next (a paged cache: the next
       page, prefetched into L2 alone); NULL: the rows that follow in memory. Where they
       read ahead never changes a result, and a read-ahead never faults. */
    void (*scores_tile_typed[SDPA_TYPES])(float *s, size_t ld_s, const float *q, size_t q_stride,
                                          size_t nq, const void *k, size_t k_stride,
                                          const void *ahead, size_t nk, size_t d, float scale);
    void (*pv_tile_typed[SDPA_TYPES])(float *acc, size_t ld_acc, const float *p, size_t ld_p,
                                      size_t nq, size_t nk, const void *v, size_t v_stride,
                                      const void *ahead, size_t d_v);
    /* optional (both or neither; NULL where a backend has none), per 8-bit type
       SDPA_TYPE_FP8_E4M3 + t: the typed entries with k and v rows of that type as they are
       (strides in elements, a byte each), every vector of codes widened in registers as
       widen_fp8 widens them (e4m3 at 2^-SDPA_FP8_E4M3_F16_SHIFT of its values) and on to
       float as widen[f16]: the results are those of widen_fp8 then the f16 entries, bit for
       bit, with no f16 tile stored and read back between them. */
    void (*scores_tile_fp8[2])(float *s, size_t ld_s, const float *q, size_t q_stride, size_t nq,
                               const void *k, size_t k_stride, const void *ahead, size_t nk,
                               size_t d, float scale);
    void (*pv_tile_fp8[2])(float *acc, size_t ld_acc, const float *p, size_t ld_p, size_t nq,
                           size_t nk, const void *v, size_t v_stride, const void *ahead,
                           size_t d_v);
    /* optional (NULL: the driver calls exp_sum row by row): s[i * ld_s + j] =
       exp(s[i * ld_s + j] - shift[i]), the difference rounded to float, and sums[i] = the sum of
       row i after, for i < nq, j < nk; one call for a whole tile keeps many independent exps in
       flight. A weight whose exp is below FLT_MIN may come out as 0 or as any value below
       FLT_MIN, as in exp_sum: beside the row's weight of 1 it is below float's precision, so
       the kernels skip the flush that softmax's normalize does */
    void (*exp_tile[SDPA_EXP_KINDS])(float *s, size_t ld_s, size_t nq, size_t nk,
                                     const float *shift, float *sums);
    /* optional pair (both or neither), used for blocks of at least 8 queries with
       d <= SDPA_ATTN_PACK_MAX_D. A packed tile is SDPA_ATTN_MAX_BLOCK_Q queries wide: qt and a
       key-major st hold that many columns a row, their ld (at least that, a multiple of 16) says
       where the next row starts, and nothing in a row past those columns is read or written.
       pack_q, the packing of A = Q (once per block of queries): qt[p * ld_qt + i] =
       q[i * q_stride + p] (unscaled) for p < d and i < nq, and 0 for nq <= i <
       SDPA_ATTN_MAX_BLOCK_Q.
       scores_packed, S = scale A B^T from packed A (A = Q, B = K): the tile of scores_tile,
       s[i * ld_s + j] for i < nq, j < nk <= SDPA_ATTN_MAX_BLOCK_KV, GEMM-style (broadcast k,
       vector loads of qt, no reductions), each s_ij one multiply by scale of the finished dot,
       as in scores_tile: a q scaled first could overflow or underflow where the dot does not,
       and a row's scores would then depend on the path the driver picks for it. */
    void (*pack_q)(float *qt, size_t ld_qt, const float *q, size_t q_stride, size_t nq, size_t d);
    void (*scores_packed)(float *s, size_t ld_s, const float *qt, size_t ld_qt, size_t nq,
                          const float *k, size_t k_stride, size_t nk, size_t d, float scale);
    /* optional pair (both or neither), with pack_q: one step of the online softmax for a block
       of nq queries (qt from pack_q) against nk keys that every one of them sees, with no mask,
       in two halves around the driver's bookkeeping (the new maxima m_new[i] = max(m[i],
       tile_max[i]), the check that they are finite, and the update of m and l).
       scores_max, S^T = scale B A^T key-major and its column max (nk up to
       SDPA_ATTN_MAX_BLOCK_KV): st[j * ld_st + i] = s_ij = scale * dot(q_i, k_j), the dot
       finished before the multiply (as scores_packed), for j < nk, i < nq (columns nq <= i <
       SDPA_ATTN_MAX_BLOCK_Q are the backend's own business), and tile_max[i] = max_j s_ij for
       i < nq, the max of the scaled scores (a negative scale reorders them; tile_max holds
       SDPA_ATTN_MAX_BLOCK_Q floats). st is 64-byte aligned.
       exp_pv, the weights and C = alpha C + P V with P key-major, given finite m_new: alpha[i] =
       exp(m[i] - m_new[i]), st's s_ij replaced by p_ij = exp(s_ij - m_new[i]), sums[i] =
       sum_j p_ij and acc_i = acc_i alpha[i] + sum_j p_ij v_j, for i < nq; alpha and sums hold
       SDPA_ATTN_MAX_BLOCK_Q floats. Each difference is rounded to float, and an alpha or p_ij
       below FLT_MIN may be 0 or any value below FLT_MIN, as in exp_tile. */
    void (*scores_max)(float *st, size_t ld_st, float *tile_max, const float *qt, size_t ld_qt,
                       size_t nq, const float *k, size_t k_stride, size_t nk, size_t d_k,
                       float scale);
    void (*exp_pv[SDPA_EXP_KINDS])(float *acc, size_t ld_acc, float *st, size_t ld_st,
                                   const float *m, const float *m_new, float *alpha, float *sums,
                                   size_t nq, size_t nk, const float *v, size_t v_stride,
                                   size_t d_v);
    /* optional, with pack_q (the backward's packed path): S^T = scale K Q^T key-major, one job:
       st[j * ld_st + i] = scale * dot(k_j, q_i) for j < nk (up to SDPA_ATTN_MAX_BLOCK_KV) and
       i < nq, from qt as pack_q leaves it (ld_qt), each the finished dot times scale, the bits
       of scores_max's tile. Columns nq <= i < SDPA_ATTN_MAX_BLOCK_Q are the backend's own
       business; nothing past them in a row is read or written. st is 64-byte aligned and ld_st
       a multiple of 16, at least SDPA_ATTN_MAX_BLOCK_Q. */
    void (*scores_keymajor)(float *st, size_t ld_st, const float *qt, size_t ld_qt, size_t nq,
                            const float *k, size_t k_stride, size_t nk, size_t d, float scale);
    /* optional (NULL: exp_sum key by key), the backward's P^T from S^T, one job, no sums: a
       key-major tile's st[j * ld_st + i] = exp(st[j * ld_st + i] - shift[i]) for j < nk and
       i < nq, each difference rounded to float, then the exp the backend's forward tiles take,
       bit for bit: exp_tile's at a zero shift where it has one, else exp_sum's at scale 1 and
       shift 0. shift[i] is at least column i's max (an lse), and a weight below FLT_MIN may be
       0 or any value below it, as in exp_tile. st is 64-byte aligned and ld_st a multiple of
       16. */
    void (*exp_keymajor[SDPA_EXP_KINDS])(float *st, size_t ld_st, size_t nk, size_t nq,
                                         const float *shift);
    /* the backward's dS^T = scale P^T o (dP^T - D) on key-major tiles, one job (every backend):
       ds[j * ld + i] = scale * (p[j * ld + i] * (ds[j * ld + i] - dd[i])) for j < nk and
       i < nq, each operation rounded to float in that order, so every backend gives the same
       bits. ds and p are 64-byte aligned and ld a multiple of 16. */
    void (*ds_keymajor)(float *ds, const float *p, size_t ld, size_t nk, size_t nq, const float *dd,
                        float scale);
} sdpa_attention_kernels;

/* An add-on of a backend: kernels compiled in a file of their own, with flags the backend's
 * CPUs may lack (meson.build: the record's 'addons'), so they live outside the backend's const
 * table; src/dispatch.c hands them out (sdpa_bf16_dot_for) only once the CPU has the features
 * the add-on requires and the environment has not turned it off.
 *
 * The bf16 dot: Q.K for the packed path (blocks of at least 8 queries, d <= SDPA_ATTN_PACK_MAX_D)
 * with bf16 Q and K, read as bf16 with no widening, each 32-bit word a pair of elements (the even
 * one in the low half), summed by a dot of pairs (AVX512_BF16's vdpbf16ps, AMX's TDPBF16PS,
 * Arm's BFDOT). Every product of two bf16 values is exact in float; the sums are float
 * additions, rounded to nearest whatever the rounding mode, a subnormal q or k element may count
 * as 0 and a partial sum below FLT_MIN may flush to 0 (vdpbf16ps and TDPBF16PS do both, whatever
 * MXCSR says; each costs less than 2^-126 times the other element, far inside the dot's rounding
 * bound). The tiles are the float pair's (pack_q, scores_packed, scores_max above), with their
 * leading dimensions:
 *   pack_q: qt[p * ld_qt + i] = the word (q[i * q_stride + 2p], q[i * q_stride + 2p + 1]) for
 *     p < ceil(d / 2), i < nq, with 0 as the second element of an odd d's last pair (reading no
 *     element past q[i * q_stride + d - 1]), and 0 for nq <= i < SDPA_ATTN_MAX_BLOCK_Q;
 *   scores_packed, scores_max: as the float pair, from k's bf16 rows (k_stride in elements; a
 *     row's last element read is k[j * k_stride + d - 1]), each s_ij one multiply by scale of
 *     the finished dot. */
typedef struct sdpa_bf16_dot_kernels {
    void (*pack_q)(uint32_t *qt, size_t ld_qt, const uint16_t *q, size_t q_stride, size_t nq,
                   size_t d);
    void (*scores_packed)(float *s, size_t ld_s, const uint32_t *qt, size_t ld_qt, size_t nq,
                          const uint16_t *k, size_t k_stride, size_t nk, size_t d, float scale);
    void (*scores_max)(float *st, size_t ld_st, float *tile_max, const uint32_t *qt, size_t ld_qt,
                       size_t nq, const uint16_t *k, size_t k_stride, size_t nk, size_t d_k,
                       float scale);
} sdpa_bf16_dot_kernels;

/* A tile of scores for the score stage's softcap and ALiBi (src/score_stage.h): s[j * ld + x]
 * for lines j < lines and positions x < n, changed in place, in this order:
 *   cap != 0: s = cap tanh(s / cap) (arch/score_stage_tile.h; docs/numerics.md: its bound), and
 *     where deriv is not NULL, deriv[j * ld + x] = 1 - tanh^2, the derivative of the cap;
 *   slope not NULL: s += slope[x] * (dist[x] + j), a key-major tile (x a query row, j a key), or
 *     with one_row (lines 1, x a key), s += slope[0] * (dist[0] + x);
 *   max not NULL: max[x] = the max over j of the new s, NaN if one of them is NaN.
 * dist holds integers below 2^24, so each bias is one rounding. */
typedef struct sdpa_stage_tile {
    float *s;
    size_t ld, lines, n;
    float cap;
    int one_row;
    float *deriv;
    const float *slope, *dist;
    float *max;
} sdpa_stage_tile;

typedef struct sdpa_kernels {
    const char *name; /* SDPA_BACKEND_NAME, which the build passes from the backend's record */
    /* sum a[i] * b[i]; n == 0 gives 0 and reads nothing (a and b may then be NULL) */
    float (*dot)(const float *a, const float *b, size_t n);
    /* dot, stored in *result; returns 0 (SDPA_OK): sdpa_dot_f32 jumps to it as its last act, with
       no frame and no return of its own (SDPA_DOT_TO below) */
    int (*dot_to)(const float *a, const float *b, size_t n, float *result);
    /* y[i] = alpha * x[i], one rounding; y may equal x */
    void (*scale)(float *y, const float *x, size_t n, float alpha);
    /* max over i of (scale * x[i]) rounded to float; -inf for an all -inf row; a NaN input may
       or may not come out as NaN (the softmax driver handles both) */
    float (*max_scaled)(const float *x, size_t n, float scale);
    /* whether n rows of d floats, stride apart, hold no inf or NaN (n or d 0: 1, reading
       nothing) */
    int (*rows_finite)(const float *x, size_t stride, size_t n, size_t d);
    /* y[i] = exp(scale * x[i] - shift); returns sum y[i]. y may equal x. NaN in x gives NaN in y
       and in the sum. Callers pass a shift of at least the max of scale * x[i] (so arguments are
       <= 0 up to rounding; beyond 88 the result is unspecified), and a result below FLT_MIN may
       be 0 or left subnormal: callers that need exact zeros run normalize after it. Each of
       those two checks would cost two of about fifteen vector operations per vector. */
    float (*exp_sum[SDPA_EXP_KINDS])(float *y, const float *x, size_t n, float scale, float shift);
    /* the longest n the softmax driver passes to one exp_sum call: its float sum (the backend's
       lane sums, then their reduction) must stay well inside softmax's 2e-5 for such n in the
       worst case, every rounding erring the same way; the driver adds the calls' sums in double.
       The more partial sums a backend keeps, the longer its blocks can be. */
    size_t exp_sum_block;
    /* optional (NULL: max_scaled, then exp_sum): exp_sum that also stores the max of scale * x[i]
       in *max (a NaN in x may or may not show in it), for a shift that may lie below that max
       (shift_guess.h, "A guessed shift"): results for arguments up to 88 are exp's; beyond, they
       are unspecified. y must not overlap x. */
    float (*exp_sum_max[SDPA_EXP_KINDS])(float *y, const float *x, size_t n, float scale,
                                         float shift, float *max);
    /* y[i] *= factor, then weights below FLT_MIN become exactly 0 */
    void (*normalize)(float *y, size_t n, float factor);
    /* dx[i] = scale * y[i] * (dy[i] - y_dot_dy); dx may equal y or dy */
    void (*softmax_backward)(float *dx, const float *y, const float *dy, size_t n, float scale,
                             float y_dot_dy);
    /* optional (NULL: the three passes above): the whole softmax of a row of at most
       SDPA_SOFTMAX_SHORT floats in one call, for rows where calls and the latency between
       passes cost more than the work: y = softmax(scale * x) with weights below FLT_MIN
       flushed to 0, as max_scaled + exp_sum + normalize would give up to rounding; y may equal
       x. Returns 0, so that the entry point can jump to it (SDPA_SHORT_ENTRY below). */
    int (*softmax_short[SDPA_EXP_KINDS])(float *y, const float *x, size_t n, float scale);
    /* y[i] = exp(x[i]); for tests of the exp itself */
    void (*exp[SDPA_EXP_KINDS])(float *y, const float *x, size_t n);
    /* dst[i] = src[i] of the 16-bit type t (f16, bf16) as a float, exactly; a NaN stays a NaN,
       quieted. widen[SDPA_TYPE_F32] is NULL. */
    void (*widen[SDPA_TYPES])(float *dst, const void *src, size_t n);
    /* dst[i] = src[i] rounded to the 16-bit type t, to nearest, ties to even, whatever the
       floating-point environment; a NaN stays a NaN, quieted, with its sign; past the largest
       f16 gives inf (arch/convert_portable.h is the definition). narrow[SDPA_TYPE_F32] is NULL. */
    void (*narrow[SDPA_TYPES])(void *dst, const float *src, size_t n);
    /* optional (NULL: src/score_stage.h's loops): sdpa_stage_tile's steps, with the exp kind's
       exp, for a tile with a softcap or ALiBi */
    void (*stage_tile[SDPA_EXP_KINDS])(const sdpa_stage_tile *t);
    /* dst[i] = src[i] of the 8-bit type SDPA_TYPE_FP8_E4M3 + t as f16 bits, exactly, e4m3 times
       2^-SDPA_FP8_E4M3_F16_SHIFT (every such value is an f16; a NaN stays a NaN), in integer
       operations, so in any floating-point environment (arch/convert_fp8.h is the definition) */
    void (*widen_fp8[2])(uint16_t *dst, const uint8_t *src, size_t n);
    /* attention microkernels (every backend has them) */
    const sdpa_attention_kernels *attention;
} sdpa_kernels;

/* A backend's dot_to, from its dot (inlined into it), so that the entry point can jump to it. A
 * 16-float dot is about a dozen vector instructions: the entry point's own frame, a second return
 * and the store after it would cost as much as the work. */
#define SDPA_DOT_TO(dot)                                                                           \
    __attribute__((flatten)) static int dot##_to(const float *a, const float *b, size_t n,         \
                                                 float *result) {                                  \
        *result = dot(a, b, n);                                                                    \
        return 0;                                                                                  \
    }

/* The softmax of a row whose max is not finite (sdpa.h's special values), from x: NaN anywhere
 * gives NaN everywhere, else the +inf entries share the mass (all zeros when there are none, a
 * fully masked row). Baseline code (arch/softmax_special.c), out of line and cold.
 * _from: found at element `from`, where x[0, from) may already be overwritten (y == x) but held
 * only finite z, and nan_before says whether a NaN was among them. sdpa_softmax_nonfinite
 * returns 0, so that a softmax_short can end in a jump to it. */
__attribute__((cold)) void sdpa_softmax_nonfinite_from(float *y, const float *x, size_t n,
                                                       float scale, size_t from, int nan_before);
__attribute__((cold)) int sdpa_softmax_nonfinite(float *y, const float *x, size_t n, float scale);

/* A backend's softmax_short, from a function `name` that returns a finite number (the row's max,
 * or the shift it used: "A capped guess" finds no max) when y holds the row's softmax, and
 * otherwise the max, which is not finite (a NaN in x may or may not show in it), with x as it
 * was and y unwritten if it is x. Such a row goes on to sdpa_softmax_nonfinite in tail position.
 * The check sits here rather than in the entry point, which would have to keep y, x, n and scale
 * across its call for it, and so need a frame that a short row's call cannot afford; here the
 * entry point jumps, and the kernel reaches the special-value path in tail position. */
static inline int sdpa_short_done(float got, float *y, const float *x, size_t n, float scale) {
    return __builtin_isfinite(got) ? 0 : sdpa_softmax_nonfinite(y, x, n, scale);
}
/* out of line, so that a caller choosing among such entries by n jumps to them and a long row's
 * registers and stack do not become the short rows' */
#define SDPA_SHORT_ENTRY(name)                                                                     \
    __attribute__((noinline)) static int name##_entry(float *y, const float *x, size_t n,          \
                                                      float scale) {                               \
        return sdpa_short_done(name(y, x, n, scale), y, x, n, scale);                              \
    }

/* One table per backend file; a backend that is not compiled in has no table. */
extern const sdpa_kernels sdpa_kernels_scalar;
extern const sdpa_kernels sdpa_kernels_sse41;
extern const sdpa_kernels sdpa_kernels_avx2;
extern const sdpa_kernels sdpa_kernels_avx512;
extern const sdpa_kernels sdpa_kernels_neon;
/* Each backend's attention microkernels, in <isa>_attention.c beside its table's file. */
extern const sdpa_attention_kernels sdpa_attention_kernels_scalar;
extern const sdpa_attention_kernels sdpa_attention_kernels_sse41;
extern const sdpa_attention_kernels sdpa_attention_kernels_avx2;
extern const sdpa_attention_kernels sdpa_attention_kernels_avx512;
extern const sdpa_attention_kernels sdpa_attention_kernels_neon;
/* The add-ons, each in its own file (arch/x86/avx512_amx.c, arch/x86/avx512_bf16.c). */
extern const sdpa_bf16_dot_kernels sdpa_bf16_dot_avx512_amx;
extern const sdpa_bf16_dot_kernels sdpa_bf16_dot_avx512;

#endif
