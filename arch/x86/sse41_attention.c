/* SSE4.1 attention microkernels (the tiling driver is src/attention.c); sse41.c's table points
 * at sdpa_attention_kernels_sse41. The algorithms are arch/attention_tiles.h's and
 * arch/attention_packed.h's, but for the two GEMM-like kernels (P V and the key-major scores),
 * which SSE's two-operand instructions make a different job (below). */
#include "sse41_exp.h"

#define ISA_NAME(f) f##_sse41

/* A compiler barrier after the first key's load of each step of the keywise scores
 * (attention_tiles.h), so that the step reads its keys from the first. This ISA's compiler
 * otherwise starts a step elsewhere among the eight keys' rows, and its scores from L3 or memory
 * then run far slower: the hardware's prefetchers follow the rows worse. A barrier after every
 * key is as fast from memory and slower for short calls; avx2 needs neither. */
#define ISA_FIRST_KEY_FIRST 1

#include "attention_packed.h"

enum { BLOCK_Q = 32, BLOCK_KV = 64 };
/* Scores: 2 x 4 blocks, the keys taken one at a time so that 8 sums, 2 query rows and the
 * temporaries fit the 16 registers without spilling, each row's 4 dots reduced by hadds; a
 * single query against 8 keys at a time. */
enum { SCORES_MR = 2, SCORES_NR = 4, SCORES_KEYWISE = 1, SCORES_ROW_NR = 8 };
/* four keys a step: an exp is a chain of some fifty cycles, and only four side by side keep the
 * pipes busy (sse41_exp.h) */
enum { EXP_PV_KEYS = 4 };

ALWAYS_INLINE float isa_dot(const float *a, const float *b, size_t n) { return dot_sse41(a, b, n); }

ALWAYS_INLINE vf isa_exp_table(void) { return vf_zero(); }
ALWAYS_INLINE void isa_exps(vf *x, int n, vf table, int kind) {
    (void)table;
    if (kind == SDPA_EXP_FAST)
        exp_fast_body(x, n, 0);
    else
        for (int u = 0; u < n; u++) x[u] = Sleef_expf4_u10sse4(x[u]);
}

/* Without AVX's three-operand forms every SSE arithmetic instruction overwrites one of its
 * operands, so a multiply-add whose operands both live on takes three instructions: a load (or
 * copy) into a temporary, mulps, addps. This core issues about six instructions a cycle, which
 * is just the two multiplies and two adds a cycle of its peak: every other instruction in a loop
 * costs time. The GEMM-like microkernels below therefore take one broadcast against 8 vectors
 * (32 floats) loaded straight into the products' registers: the broadcast is a single pshufd,
 * shared by 8 multiply-adds, and the 8 accumulators are more independent chains than the adds'
 * latency needs. */

/* lane L (a literal) of v in every lane: pshufd writes a new register and leaves v alone */
#define BCAST(v, L) _mm_castsi128_ps(_mm_shuffle_epi32(_mm_castps_si128(v), (L)*0x55))

/* lane `lane` (0..3) of the 16-byte aligned vector at p in every lane: one pshufd with a memory
 * operand once lane is a constant (the immediates must be literals). */
ALWAYS_INLINE __m128 bcast_aligned(const float *p, int lane) {
    const __m128i x = _mm_load_si128((const __m128i *)(const void *)p);
    return _mm_castsi128_ps(lane == 0   ? _mm_shuffle_epi32(x, 0x00)
                            : lane == 1 ? _mm_shuffle_epi32(x, 0x55)
                            : lane == 2 ? _mm_shuffle_epi32(x, 0xAA)
                                        : _mm_shuffle_epi32(x, 0xFF));
}

/* c[t] += row[t W ..] b for t < nv: one broadcast against nv vectors loaded straight into the
 * products' registers */
ALWAYS_INLINE void madd_row(vf *c, vf b, const float *row, int nv) {
    for (int t = 0; t < nv; t++) c[t] = vf_madd(vf_load(row + t * W), b, c[t]);
}

/* The P V microkernels (pv_operands in attention_tiles.h; the key-major weights of exp_pv are
 * 16-byte aligned). */

/* One row of acc, nv vectors (nv * W columns) of it: pw = p + i * p_row. Row-major weights
 * come four keys at a time in one load, broadcast from the register; key-major ones each with
 * one pshufd from memory, from the aligned vector that holds lane (= i mod 4). */
ALWAYS_INLINE void pv_row_sse41(float *acc, const float *alpha, const float *pw, size_t p_key,
                                int lane, size_t nk, const float *v, size_t v_stride, int nv) {
    __m128 c[8];
    for (int t = 0; t < nv; t++) c[t] = _mm_loadu_ps(acc + t * W);
    if (alpha) {
        const __m128 a = _mm_set1_ps(*alpha);
        for (int t = 0; t < nv; t++) c[t] = _mm_mul_ps(c[t], a);
    }
    const float *v0 = v;
    size_t j = 0;
    for (; j + 4 <= nk; j += 4, v0 += 4 * v_stride) {
        /* the stride opaque: else GCC keeps an address register per (key, vector) and spills */
        size_t vs = v_stride;
        __asm__("" : "+r"(vs));
        const float *v1 = v0 + vs, *v2 = v1 + vs, *v3 = v2 + vs;
        if (p_key == 1) {
            const __m128 w = _mm_loadu_ps(pw + j);
            madd_row(c, BCAST(w, 0), v0, nv);
            madd_row(c, BCAST(w, 1), v1, nv);
            madd_row(c, BCAST(w, 2), v2, nv);
            madd_row(c, BCAST(w, 3), v3, nv);
        } else {
            const float *pj = pw + j * p_key;
            madd_row(c, bcast_aligned(pj, lane), v0, nv);
            madd_row(c, bcast_aligned(pj + p_key, lane), v1, nv);
            madd_row(c, bcast_aligned(pj + 2 * p_key, lane), v2, nv);
            madd_row(c, bcast_aligned(pj + 3 * p_key, lane), v3, nv);
        }
    }
    for (; j < nk; j++, v0 += v_stride)
        madd_row(c, p_key == 1 ? _mm_set1_ps(pw[j]) : bcast_aligned(pw + j * p_key, lane), v0, nv);
    for (int t = 0; t < nv; t++) _mm_storeu_ps(acc + t * W, c[t]);
}

/* One row, the last len (1..3) columns; partial loads and stores, so that nothing past the
 * row is read or written. */
static void pv_row_partial_sse41(float *acc, const float *alpha, const float *pw, size_t p_key,
                                 size_t nk, const float *v, size_t v_stride, size_t len) {
    __m128 c = load_partial(acc, len, 0.0f);
    if (alpha) c = _mm_mul_ps(c, _mm_set1_ps(*alpha));
    for (size_t j = 0; j < nk; j++)
        c = vf_madd(_mm_set1_ps(pw[j * p_key]), load_partial(v + j * v_stride, len, 0.0f), c);
    store_partial(acc, c, len);
}

/* Columns [c0, c0 + nv * W) of every row. The rows of a key-major tile go four at a time, one
 * instance per lane. */
ALWAYS_INLINE void pv_rows_sse41(float *acc, size_t ld_acc, const float *p, size_t p_row,
                                 size_t p_key, const float *alpha, size_t nq, size_t nk,
                                 const float *v, size_t v_stride, size_t c0, int nv) {
    if (p_key == 1) {
        for (size_t i = 0; i < nq; i++)
            pv_row_sse41(acc + i * ld_acc + c0, alpha ? alpha + i : NULL, p + i * p_row, 1, 0, nk,
                         v + c0, v_stride, nv);
        return;
    }
#define PV_LANE(L)                                                                                 \
    if (i + (L) < nq)                                                                              \
    pv_row_sse41(acc + (i + (L)) * ld_acc + c0, alpha ? alpha + i + (L) : NULL, p + i * p_row,     \
                 p_key, (L), nk, v + c0, v_stride, nv)
    for (size_t i = 0; i < nq; i += 4) {
        PV_LANE(0);
        PV_LANE(1);
        PV_LANE(2);
        PV_LANE(3);
    }
#undef PV_LANE
}

/* A whole tile, column block by column block (32 columns, then 16, then what is left) so that
 * the block of v the rows share stays in L1. */
ALWAYS_INLINE void pv_tile_body(const pv_operands *o) {
    float *acc = o->acc;
    const float *p = o->p, *v = o->v, *alpha = o->alpha;
    const size_t ld_acc = o->ld_acc, p_row = o->p_row, p_key = o->p_key, nq = o->nq, nk = o->nk;
    const size_t v_stride = o->v_stride, d_v = o->d_v;
    size_t c = 0;
    for (; c + 8 * W <= d_v; c += 8 * W)
        pv_rows_sse41(acc, ld_acc, p, p_row, p_key, alpha, nq, nk, v, v_stride, c, 8);
    if (c + 4 * W <= d_v) {
        pv_rows_sse41(acc, ld_acc, p, p_row, p_key, alpha, nq, nk, v, v_stride, c, 4);
        c += 4 * W;
    }
    switch ((d_v - c) / W) {
    case 3: pv_rows_sse41(acc, ld_acc, p, p_row, p_key, alpha, nq, nk, v, v_stride, c, 3); break;
    case 2: pv_rows_sse41(acc, ld_acc, p, p_row, p_key, alpha, nq, nk, v, v_stride, c, 2); break;
    case 1: pv_rows_sse41(acc, ld_acc, p, p_row, p_key, alpha, nq, nk, v, v_stride, c, 1); break;
    default: break;
    }
    c += (d_v - c) / W * W;
    if (c < d_v)
        for (size_t i = 0; i < nq; i++)
            pv_row_partial_sse41(acc + i * ld_acc + c, alpha ? alpha + i : NULL, p + i * p_row,
                                 p_key, nk, v + c, v_stride, d_v - c);
}

/* The key-major tile of exp_pv (one copy for both exp kinds). */
static void pv_keymajor_sse41(const pv_operands *o) { pv_tile_body(o); }

/* v is f32: this backend has no typed entries */
ALWAYS_INLINE void isa_pv(const pv_operands *o, int v_type) {
    (void)v_type;
    if (o->p_key == 1)
        pv_tile_body(o);
    else
        pv_keymajor_sse41(o);
}

/* st[j][i] = scale * sum_p k[j][p] qt[p][i] for nkeys keys and nv vectors of queries
 * (nkeys * nv = 8 accumulators): per 4 values of p one load of each key's row and 4 pshufd
 * broadcasts, each against nv vectors of qt. The scale multiplies the finished dots, as in
 * scores_tile: scaling q first could overflow or underflow where the dot does not. st is 16-byte
 * aligned, and its rows ld_st floats apart (qt's ld_qt). */
ALWAYS_INLINE void keymajor_block_sse41(float *st, size_t ld_st, const float *qt, size_t ld_qt,
                                        const float *k, size_t k_stride, size_t d, __m128 vscale,
                                        int nkeys, int nv) {
    __m128 a[8];
    for (int t = 0; t < nkeys * nv; t++) a[t] = _mm_setzero_ps();
    size_t p = 0;
    for (; p + 4 <= d; p += 4) {
        const float *q0 = qt + p * ld_qt;
        for (int key = 0; key < nkeys; key++) {
            const __m128 k4 = _mm_loadu_ps(k + key * k_stride + p);
            madd_row(a + key * nv, BCAST(k4, 0), q0, nv);
            madd_row(a + key * nv, BCAST(k4, 1), q0 + ld_qt, nv);
            madd_row(a + key * nv, BCAST(k4, 2), q0 + 2 * ld_qt, nv);
            madd_row(a + key * nv, BCAST(k4, 3), q0 + 3 * ld_qt, nv);
        }
    }
    for (; p < d; p++)
        for (int key = 0; key < nkeys; key++)
            madd_row(a + key * nv, _mm_set1_ps(k[key * k_stride + p]), qt + p * ld_qt, nv);
    for (int key = 0; key < nkeys; key++)
        for (int t = 0; t < nv; t++)
            _mm_store_ps(st + key * ld_st + t * W, _mm_mul_ps(a[key * nv + t], vscale));
}

/* nk keys from j in blocks of nkeys keys x nv vectors of queries; returns the first key not
 * done */
ALWAYS_INLINE size_t keymajor_blocks_sse41(float *st, size_t ld_st, const float *qt, size_t ld_qt,
                                           const float *k, size_t k_stride, size_t j, size_t nk,
                                           size_t d, __m128 vscale, int nkeys, int nv) {
    for (; j + nkeys <= nk; j += nkeys)
        keymajor_block_sse41(st + j * ld_st, ld_st, qt, ld_qt, k + j * k_stride, k_stride, d,
                             vscale, nkeys, nv);
    return j;
}

/* The key-major scores of nk keys for the first nq queries (rounded up to 8, 16 or all 32): one
 * key across 8 vectors, two across 4, four across 2. */
static void ISA_NAME(scores_keymajor)(float *st, size_t ld_st, const float *qt, size_t ld_qt,
                                      size_t nq, const float *k, size_t k_stride, size_t nk,
                                      size_t d, float scale) {
    const __m128 vs = _mm_set1_ps(scale);
    if (nq > 4 * W) {
        keymajor_blocks_sse41(st, ld_st, qt, ld_qt, k, k_stride, 0, nk, d, vs, 1, 8);
    } else if (nq > 2 * W) {
        const size_t j =
            keymajor_blocks_sse41(st, ld_st, qt, ld_qt, k, k_stride, 0, nk, d, vs, 2, 4);
        keymajor_blocks_sse41(st, ld_st, qt, ld_qt, k, k_stride, j, nk, d, vs, 1, 4);
    } else {
        const size_t j =
            keymajor_blocks_sse41(st, ld_st, qt, ld_qt, k, k_stride, 0, nk, d, vs, 4, 2);
        keymajor_blocks_sse41(st, ld_st, qt, ld_qt, k, k_stride, j, nk, d, vs, 1, 2);
    }
}

#include "attention_entries.h"
