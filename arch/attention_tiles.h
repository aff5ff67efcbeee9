/* The attention microkernels' algorithms, written once over a backend's vector vocabulary (the
 * blocks "the vector vocabulary" of arch/x86/<isa>.h, arch/arm/neon.h and arch/scalar/scalar.h;
 * docs/porting.md) and compiled into each <isa>_attention.c with its vector width W a constant: the
 * register blocks of scores_tile and pv_tile and the loops around them (BLIS's microkernel and its
 * loops). Every function is inlined, and its int parameters (block shapes, keys a step) are
 * constants at every call, so that each call compiles to straight-line code for its shape. What a
 * backend supplies besides its vocabulary is declared below ("the backend's part");
 * arch/attention_entries.h turns it all into the backend's entries. */
#ifndef SDPA_ARCH_ATTENTION_TILES_H
#define SDPA_ARCH_ATTENTION_TILES_H

#include "attention_vectors.h"
#ifdef ISA_TYPED_LOADS
#include "convert_rows.h"
#endif

/* ---- the backend's part (defined in <isa>_attention.c) ---- */

/* the dot of the scores' leftover keys */
ALWAYS_INLINE float isa_dot(const float *a, const float *b, size_t n);
/* The operands of a P V step: acc[i * ld_acc + c] = acc[i * ld_acc + c] alpha[i] + sum_j P(i, j)
 * v[j * v_stride + c] for i < nq, c < d_v, j < nk, with the weight P(i, j) at p[i * p_row +
 * j * p_key] (row-major tiles: p_row = ld_p, p_key = 1; the key-major tiles of exp_pv: p_row = 1,
 * p_key = SDPA_ATTN_MAX_BLOCK_Q) and alpha NULL for 1. */
typedef struct pv_operands {
    float *acc;
    size_t ld_acc;
    const float *p;
    size_t p_row, p_key;
    const float *alpha;
    size_t nq, nk;
    const void *v; /* rows of the type the caller passes beside o */
    size_t v_stride, d_v;
    const void *ahead; /* where the read-ahead goes past v's nk rows (prefetch_row) */
} pv_operands;
/* kernels.h's pv_tile on o, its v rows of v_type: pv_tile_loops with the backend's blocks, or
 * loops of its own (for f32 only) */
ALWAYS_INLINE void isa_pv(const pv_operands *o, int v_type);

/* ---- the element types of K and V ---- */

/* The scores' K and the P V product's V may be rows of f32 or of a 16-bit type (kernels.h's
 * sdpa_type), widened to float as each vector is loaded; the type is a constant at every call,
 * so the float instances compile as if it were not there. TILE_F16_EXACT is f16 through
 * convert_rows.h's integer widening, for a caller's DAZ under which the ISA's conversion would
 * read subnormals as 0. Only a backend that defines ISA_TYPED_LOADS (with vpart_count, the lanes of
 * an vpart) has the 16-bit loads. */
#define TILE_F16_EXACT SDPA_TYPES
/* Rows of an 8-bit type (kernels.h's scores_tile_fp8, pv_tile_fp8) are TILE_FP8, plus
 * TILE_FP8_E5M2 for e5m2 (else e4m3) and TILE_FP8_EXACT for the exact widening: each vector's W
 * codes become f16 bits in registers (convert_fp8.h's fp8_to_f16_lanes, e4m3 at 2^-8 of its
 * values), and those floats as an f16 row's would (the ISA's conversion, or TILE_F16_EXACT's),
 * so the results are those of widen_fp8 and then the f16 entry, bit for bit. */
#define TILE_FP8        8
#define TILE_FP8_E5M2   1
#define TILE_FP8_EXACT  2
#define TILE_FP8_NO_NAN 4 /* e4m3 rows known to hold no NaN: its fix-up left out */

ALWAYS_INLINE size_t elem_size(int type) {
    return type == SDPA_TYPE_F32 ? sizeof(float) : type >= TILE_FP8 ? 1 : sizeof(uint16_t);
}

ALWAYS_INLINE const void *elem_at(const void *p, size_t i, int type) {
    return (const char *)p + i * elem_size(type);
}

#ifdef ISA_TYPED_LOADS
/* W elements at p as floats. bf16 is only moved into the upper half, a signaling NaN left
 * signaling (widen quiets it): every use is an FMA or a multiply, which returns its first NaN
 * operand quieted whichever kind it is, so the results are widen's bit for bit, for two
 * instructions fewer a vector. */
ALWAYS_INLINE vf widen_as(const uint16_t *p, int type) {
    if (type == SDPA_TYPE_BF16) {
        vu16_ raw;
        memcpy(&raw, p, sizeof raw);
        return (vf)(__builtin_convertvector(raw, vu32_) << 16);
    }
    return widen_vector(p, SDPA_TYPE_F16, type == TILE_F16_EXACT);
}

/* W 8-bit codes at p as floats (TILE_FP8 above) */
ALWAYS_INLINE vf widen_fp8_as(const uint8_t *p, int type) {
    const vu16_fp8_w_ h = fp8_to_f16_lanes(p, type & TILE_FP8_E5M2, type & TILE_FP8_NO_NAN);
    uint16_t bits[W];
    memcpy(bits, &h, sizeof bits);
    return widen_vector(bits, SDPA_TYPE_F16, type & TILE_FP8_EXACT);
}

/* whether nk rows of d e4m3 codes at k, stride apart, hold no NaN */
ALWAYS_INLINE int e4m3_rows_no_nan(const void *k, size_t stride, size_t nk, size_t d) {
    if (stride == d) return !e4m3_any_nan(k, nk * d);
    for (size_t j = 0; j < nk; j++)
        if (e4m3_any_nan((const uint8_t *)k + j * stride, d)) return 0;
    return 1;
}

/* a row of n <= SDPA_ATTN_TYPED_MAX_D elements at k of the given type as floats in row */
ALWAYS_INLINE void widen_row_as(float *row, const void *k, size_t n, int type) {
    if (type >= TILE_FP8) {
        uint16_t h[SDPA_ATTN_TYPED_MAX_D];
        widen_fp8_loops(h, k, n, type & TILE_FP8_E5M2);
        widen_loops(row, h, n, SDPA_TYPE_F16, type & TILE_FP8_EXACT);
        return;
    }
    widen_loops(row, k, n, type == TILE_F16_EXACT ? SDPA_TYPE_F16 : type, type == TILE_F16_EXACT);
}
#endif

/* tile_load of a vector of the given type: a full one (m NULL) or the lanes m of one, read
 * without touching an element past them (no 16-bit masked loads in AVX-512F: a partial vector
 * goes through a zeroed copy on the stack, as the float one loads 0 in the other lanes) */
ALWAYS_INLINE vf tile_load_as(const void *p, int type, const vpart *m) {
#ifdef ISA_TYPED_LOADS
    if (type >= TILE_FP8) {
        if (!m) return widen_fp8_as(p, type);
        uint8_t part[W] = {0};
        memcpy(part, p, vpart_count(*m));
        return widen_fp8_as(part, type);
    }
    if (type != SDPA_TYPE_F32) {
        if (!m) return widen_as(p, type);
        uint16_t part[W] = {0};
        memcpy(part, p, vpart_count(*m) * sizeof(uint16_t));
        return widen_as(part, type);
    }
#endif
    (void)type;
    return tile_load(p, m);
}

/* the backend's dot of q and key row k of the given type, as on the widened row: a 16-bit row
 * (d <= SDPA_ATTN_TYPED_MAX_D) is widened on the stack, so that the dot's order of operations,
 * and with it the result, is the float entry's */
ALWAYS_INLINE float dot_as(const float *q, const void *k, size_t d, int type) {
#ifdef ISA_TYPED_LOADS
    if (type != SDPA_TYPE_F32) {
        float row[SDPA_ATTN_TYPED_MAX_D];
        widen_row_as(row, k, d, type);
        return isa_dot(q, row, d);
    }
#endif
    (void)type;
    return isa_dot(q, k, d);
}

/* Rows of 16-bit K and V, which decode reads from beyond L2, are prefetched a little ahead of
 * their loads, a line for each line loaded: a 16-bit vector feeds a conversion and a handful of
 * FMAs, so the out-of-order window alone holds too few misses to hide the latency (decode from
 * L3 about a fifth faster on a 2 MiB-L2 Xeon). Float rows are prefetched where few rows read
 * them (STREAM_ROWS, below). An address may lie past the rows given (the next block's, in a dense
 * layout): a prefetch never faults. */
/* Keys ahead, the scores' and P V's: a register block ahead left decode from DRAM waiting on K
 * (16 keys of 128 halves are 4 KiB). */
#define PREFETCH_KEYS 16

/* A call of at most this many rows reads each key and value from memory once when the keys
 * are many (decode: the query heads of a kv head), so its float rows are prefetched ahead too:
 * the hardware's prefetchers alone keep too few misses in flight for its key streams from DRAM
 * (Zen 5). A single row does without: its prefetches cost more than they hide where K and V sit
 * in L3. */
#define STREAM_ROWS 8

/* Whether the register block of rows from row i prefetches the rows of type t ahead of its
 * loads: only the first block, the one that brings them in (a call of nq rows). */
ALWAYS_INLINE int rows_ahead(int t, size_t nq, size_t i) {
    return i == 0 && (t != SDPA_TYPE_F32 || (nq > 1 && nq <= STREAM_ROWS));
}

/* Keys ahead for rows of type t: an 8-bit row is half a 16-bit one's lines, and its vectors
 * take fewer cycles each (decode's K and V from DRAM), so it is prefetched FP8_AHEAD times as
 * many keys ahead: twice the bytes in flight (measured faster than the same bytes) */
#define FP8_AHEAD 4
ALWAYS_INLINE size_t keys_ahead(size_t keys, int t) {
    return t >= TILE_FP8 ? FP8_AHEAD * keys : keys;
}

/* The lines of elements [0, n) of row `row` of x's rows (stride elements apart, type t), where
 * x holds nk rows: past them, rows of ahead, a stride apart (kernels.h: the rows the caller reads
 * next), or with ahead NULL those that follow x's in memory. Rows of ahead (a paged cache's next
 * page, anywhere in memory) go to L2 alone (prefetcht1): there the core keeps many more misses in
 * flight than in L1's few fill buffers, which a prefetch into L1 holds until its line comes
 * (paged decode on a Xeon measured faster than dense so). */
ALWAYS_INLINE void prefetch_row(const void *x, const void *ahead, size_t row, size_t nk,
                                size_t stride, size_t n, int t) {
    const size_t step = 64 / elem_size(t);
    if (ahead && row >= nk) {
        const void *r = elem_at(ahead, (row - nk) * stride, t);
        for (size_t l = 0; l < n; l += step) __builtin_prefetch(elem_at(r, l, t), 0, 2);
    } else {
        const void *r = elem_at(x, row * stride, t);
        for (size_t l = 0; l < n; l += step) __builtin_prefetch(elem_at(r, l, t));
    }
}

/* ---- scores: s = scale * q k^T, a register block of dots along d ---- */

#define SCORES_MAX_SUMS 16 /* mr * nr, the dots a block keeps in registers */

/* One step along d of an mr x nr block of dots, a[r * nr + c] += q_r k_c over W (or the lanes
 * m) of d. keywise: each key's vector is loaded and used against every query before the next is
 * loaded, for few registers (16-register ISAs; and a single query, whose keys are then read
 * straight into their FMAs); else every vector is loaded first and kept in a register. */
ALWAYS_INLINE void scores_step(vf *a, const float *q, size_t q_stride, const void *k,
                               size_t k_stride, int kt, int mr, int nr, int keywise,
                               const vpart *m) {
    vf vq[SCORES_MAX_SUMS], vk[SCORES_MAX_SUMS];
    for (int r = 0; r < mr; r++) vq[r] = tile_load(q + r * q_stride, m);
    if (keywise) {
        for (int c = 0; c < nr; c++) {
            const vf kc = tile_load_as(elem_at(k, c * k_stride, kt), kt, m);
#ifdef ISA_FIRST_KEY_FIRST
            /* the first key's load first (the ISA's file says why) */
            if (c == 0) __asm__("" ::: "memory");
#endif
            for (int r = 0; r < mr; r++) a[r * nr + c] = vf_madd(vq[r], kc, a[r * nr + c]);
        }
        return;
    }
    for (int c = 0; c < nr; c++) vk[c] = tile_load_as(elem_at(k, c * k_stride, kt), kt, m);
    for (int r = 0; r < mr; r++) vf_pin(&vq[r]);
    for (int c = 0; c < nr; c++) vf_pin(&vk[c]);
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < nr; c++) a[r * nr + c] = vf_madd(vq[r], vk[c], a[r * nr + c]);
}

/* s[r * ld_s + c] = scale * the sum of the lanes of a[r * nr + c], for the dots of scores_block,
 * reduced W at a time (vf_hsums) */
ALWAYS_INLINE void scores_store(float *s, size_t ld_s, const vf *a, vf vscale, int mr, int nr) {
    for (int g = 0; g < mr * nr / W; g++) {
        const vf sum = vf_hsums(a + g * W) * vscale;
        const int r = g * W / nr;
        if (nr >= W)
            vf_store(s + r * ld_s + g * W % nr, sum);
        else
            for (int h = 0; h < W / 4; h++) vf_store4(s + (r + h) * ld_s, sum, h);
    }
}

/* s[r * ld_s + c] = scale * dot(q_r, k_c) for r < mr queries and c < nr keys: mr * nr dots in
 * registers for all of d, then reduced W at a time (vf_hsums), which takes mr * nr a multiple
 * of W, and nr a multiple of W or 4 (a reduced vector then spans W / 4 rows). */
ALWAYS_INLINE void scores_block(float *s, size_t ld_s, const float *q, size_t q_stride,
                                const void *k, size_t k_stride, int kt, size_t d, vf vscale, int mr,
                                int nr, int keywise) {
    vf a[SCORES_MAX_SUMS];
    for (int t = 0; t < mr * nr; t++) a[t] = vf_zero();
    size_t p = 0;
    for (; p + W <= d; p += W)
        scores_step(a, q + p, q_stride, elem_at(k, p, kt), k_stride, kt, mr, nr, keywise, NULL);
    if (p < d) {
        const vpart m = vpart_first(d - p);
        scores_step(a, q + p, q_stride, elem_at(k, p, kt), k_stride, kt, mr, nr, keywise, &m);
    }
    scores_store(s, ld_s, a, vscale, mr, nr);
}

/* kernels.h's scores_tile (k rows of type kt) for the rows from 0 in blocks of mr, against nr
 * keys at a time (keywise as in scores_step), the keys left over one dot each; returns the first
 * row not done */
ALWAYS_INLINE size_t scores_row_blocks(float *s, size_t ld_s, const float *q, size_t q_stride,
                                       size_t nq, const void *k, size_t k_stride, const void *ahead,
                                       int kt, size_t nk, size_t d, float scale, int mr, int nr,
                                       int keywise) {
    const vf vscale = vf_set1(scale);
    size_t i = 0;
    for (; i + mr <= nq; i += mr) {
        const float *qi = q + i * q_stride;
        float *si = s + i * ld_s;
        size_t j = 0;
        for (; j + nr <= nk; j += nr) {
            if (rows_ahead(kt, nq, i)) /* the next block's keys */
                for (int c = 0; c < nr; c++)
                    prefetch_row(k, ahead, j + keys_ahead(PREFETCH_KEYS, kt) + c, nk, k_stride, d,
                                 kt);
            scores_block(si + j, ld_s, qi, q_stride, elem_at(k, j * k_stride, kt), k_stride, kt, d,
                         vscale, mr, nr, keywise);
        }
        for (; j < nk; j++)
            for (int r = 0; r < mr; r++)
                si[r * ld_s + j] =
                    scale * dot_as(qi + r * q_stride, elem_at(k, j * k_stride, kt), d, kt);
    }
    return i;
}

#define SCORES_HELD_MAX_V 8 /* the query's vectors scores_query_held keeps in registers */

/* scores_query's blocks of row_nr float keys, returning the first key not done, with the query
 * held in registers: its nv vectors (d in ((nv - 1) W, nv W]) loaded once for the call, and each
 * key's row then read from its start to its end, into one chain of nv FMAs. The chains are
 * scores_block's (the same vectors of q and k, in the same order, from the same zero), so the
 * bits are too; the keys' rows are read one after another rather than row_nr streams side by
 * side, and the query's vectors are not loaded again for every block: a decode's K, read once
 * from L2 or beyond, then comes in as one stream, not row_nr of a line each, and the loads are
 * half as many. */
ALWAYS_INLINE size_t scores_query_held(float *s, const float *q, const float *k, size_t k_stride,
                                       size_t nk, size_t d, vf vscale, int row_nr, int nv) {
    vf vq[SCORES_HELD_MAX_V];
    const size_t n_last = d - (size_t)(nv - 1) * W;
    const vpart last = vpart_first(n_last);
    for (int t = 0; t + 1 < nv; t++) vq[t] = vf_load(q + t * W);
    vq[nv - 1] = vf_load_upto(q + (nv - 1) * W, n_last, last);
    size_t j = 0;
    for (; j + row_nr <= nk; j += row_nr) {
        vf a[SCORES_MAX_SUMS];
        for (int c = 0; c < row_nr; c++) {
            const float *kc = k + (j + c) * k_stride;
            vf x = vf_zero();
            for (int t = 0; t + 1 < nv; t++) x = vf_madd(vq[t], vf_load(kc + t * W), x);
            a[c] = vf_madd(vq[nv - 1], vf_load_upto(kc + (nv - 1) * W, n_last, last), x);
        }
        scores_store(s + j, 0, a, vscale, 1, row_nr);
    }
    return j;
}

/* one query's scores (a row left over, or decode): row_nr keys at a time, the query's vector
 * loaded once for all of them (or, where the backend defines ISA_SCORES_HELD, held for the call:
 * scores_query_held, for d up to SCORES_HELD_MAX_V vectors), then a dot each */
ALWAYS_INLINE void scores_query(float *s, const float *q, const void *k, size_t k_stride,
                                const void *ahead, int kt, size_t nk, size_t d, float scale,
                                int row_nr) {
    const vf vscale = vf_set1(scale);
    size_t j = 0;
#ifdef ISA_SCORES_HELD
    /* nv a constant in each case, for vq and the chains in registers */
    if (kt == SDPA_TYPE_F32 && d <= SCORES_HELD_MAX_V * W) {
        const float *kf = k;
        switch ((d + W - 1) / W) {
        case 1: j = scores_query_held(s, q, kf, k_stride, nk, d, vscale, row_nr, 1); break;
        case 2: j = scores_query_held(s, q, kf, k_stride, nk, d, vscale, row_nr, 2); break;
        case 3: j = scores_query_held(s, q, kf, k_stride, nk, d, vscale, row_nr, 3); break;
        case 4: j = scores_query_held(s, q, kf, k_stride, nk, d, vscale, row_nr, 4); break;
        case 5: j = scores_query_held(s, q, kf, k_stride, nk, d, vscale, row_nr, 5); break;
        case 6: j = scores_query_held(s, q, kf, k_stride, nk, d, vscale, row_nr, 6); break;
        case 7: j = scores_query_held(s, q, kf, k_stride, nk, d, vscale, row_nr, 7); break;
        default: j = scores_query_held(s, q, kf, k_stride, nk, d, vscale, row_nr, 8); break;
        }
    }
#endif
    for (; j + row_nr <= nk; j += row_nr) {
        if (kt != SDPA_TYPE_F32)
            for (int c = 0; c < row_nr; c++)
                prefetch_row(k, ahead, j + keys_ahead(PREFETCH_KEYS, kt) + c, nk, k_stride, d, kt);
        scores_block(s + j, 0, q, 0, elem_at(k, j * k_stride, kt), k_stride, kt, d, vscale, 1,
                     row_nr, 1);
    }
    for (; j < nk; j++) s[j] = scale * dot_as(q, elem_at(k, j * k_stride, kt), d, kt);
}

/* kernels.h's scores_tile as a dot (isa_dot) for every query and key: for a backend whose dot
 * sums in an order no register block gives (scalar's blocked lanes), ISA_SCORES_DOTS */
ALWAYS_INLINE void scores_dots(float *s, size_t ld_s, const float *q, size_t q_stride, size_t nq,
                               const void *k, size_t k_stride, int kt, size_t nk, size_t d,
                               float scale) {
    for (size_t i = 0; i < nq; i++)
        for (size_t j = 0; j < nk; j++)
            s[i * ld_s + j] = scale * dot_as(q + i * q_stride, elem_at(k, j * k_stride, kt), d, kt);
}

/* ---- broadcast GEMM: the P V product and the key-major scores ---- */

#define BLOCK_MAX_CHAINS 24 /* mr * nv * u, the accumulators a block keeps in registers */

/* One value of kk: ch[r * nv + t] += A(r, kk) B[kk][t] for r < mr, t < nv vectors, from a =
 * &A(0, kk) (rows a_row apart) and b = B[kk] (of type bt). B's vectors are loaded once for all mr
 * rows. */
ALWAYS_INLINE void block_step(vf *ch, const float *a, size_t a_row, const void *b, int bt, int mr,
                              int nv, const vpart *m) {
    vf bv[8]; /* nv <= 8 */
    for (int t = 0; t < nv; t++) bv[t] = tile_load_as(elem_at(b, t * W, bt), bt, m);
    if (mr > 1)
        for (int t = 0; t < nv; t++) vf_pin(&bv[t]);
    for (int r = 0; r < mr; r++) {
        const vf w = vf_bcast(a + r * a_row);
        for (int t = 0; t < nv; t++) ch[r * nv + t] = vf_madd(w, bv[t], ch[r * nv + t]);
    }
}

/* C[r][t] for r < mr rows (c + r * ldc) and t < nv vectors of W columns (or the lanes m of one,
 * nv = 1), summed over kk < kn of A(r, kk) = a[r * a_row + kk * a_col] times B's row kk (b +
 * kk * ldb), the A values broadcast against B's vectors: with scale NULL, C = C alpha[r] + A B
 * (alpha NULL: 1), the P V step, whose rescaling of a row for a new max then costs a multiply at
 * the load rather than a pass over the row; else C = scale (A B), the key-major scores, each a
 * finished dot times scale. u values of kk a step, each into accumulators of its own (more
 * independent FMA chains where mr * nv is small), added at the end; mr * nv * u <=
 * BLOCK_MAX_CHAINS. ahead: B's rows are prefetched PREFETCH_KEYS ahead of their loads, past kn
 * into b_ahead's (prefetch_row). */
ALWAYS_INLINE void bcast_block(float *c, size_t ldc, const float *a, size_t a_row, size_t a_col,
                               const void *b, size_t ldb, int bt, int ahead, const void *b_ahead,
                               size_t kn, int mr, int nv, int u, const float *alpha,
                               const vf *scale, const vpart *m) {
    const int n = mr * nv;
    float *row[BLOCK_MAX_CHAINS];
    vf ch[BLOCK_MAX_CHAINS];
    for (int r = 0; r < mr; r++) row[r] = c + r * ldc;
    for (int x = 0; x < u; x++)
        for (int r = 0; r < mr; r++)
            for (int t = 0; t < nv; t++) {
                vf c0 = vf_zero();
                if (!scale && x == 0) {
                    c0 = tile_load(row[r] + t * W, m);
                    if (alpha) c0 = c0 * vf_bcast(alpha + r);
                }
                ch[x * n + r * nv + t] = c0;
            }
    size_t j = 0;
    /* x unrolled early, so that ch is put in registers (unrolled late, it stays in memory) */
    for (; j + u <= kn; j += u) {
#pragma GCC unroll 4
        for (int x = 0; x < u; x++) {
            if (ahead) /* the columns of a row ahead */
                prefetch_row(b, b_ahead, j + x + keys_ahead(PREFETCH_KEYS, bt), kn, ldb, nv * W,
                             bt);
            block_step(ch + x * n, a + (j + x) * a_col, a_row, elem_at(b, (j + x) * ldb, bt), bt,
                       mr, nv, m);
        }
    }
    if (u == 2) {
        if (j < kn) block_step(ch, a + j * a_col, a_row, elem_at(b, j * ldb, bt), bt, mr, nv, m);
    } else if (u > 2) {
        for (; j < kn; j++)
            block_step(ch, a + j * a_col, a_row, elem_at(b, j * ldb, bt), bt, mr, nv, m);
    }
    for (int r = 0; r < mr; r++)
        for (int t = 0; t < nv; t++) {
            const int i = r * nv + t;
            vf sum = ch[i];
            if (u == 2) sum = sum + ch[n + i];
            if (u == 4) {
                /* the later pair formed first: the registers of the measured code */
                const vf late = ch[2 * n + i] + ch[3 * n + i];
                sum = (sum + ch[n + i]) + late;
            }
            if (scale) sum = sum * *scale;
            tile_store(row[r] + t * W, sum, m);
        }
}

/* The block of nv vectors of columns from c (the lanes m of one vector, or whole vectors for m
 * NULL) of mr rows from row i, u keys a step; v of type vt */
ALWAYS_INLINE void pv_block(const pv_operands *o, int vt, size_t i, size_t c, int mr, int nv, int u,
                            const vpart *m) {
    bcast_block(o->acc + i * o->ld_acc + c, o->ld_acc, o->p + i * o->p_row, o->p_row, o->p_key,
                elem_at(o->v, c, vt), o->v_stride, vt, rows_ahead(vt, o->nq, i),
                o->ahead ? elem_at(o->ahead, c, vt) : NULL, o->nk, mr, nv, u,
                o->alpha ? o->alpha + i : NULL, NULL, m);
}

/* the partial vector of columns at c (the lanes m, or a whole vector for m NULL) of mr rows from
 * row i, u keys a step; v of type vt */
ALWAYS_INLINE void pv_vector(const pv_operands *o, int vt, size_t i, size_t c, int mr, int u,
                             const vpart *m) {
    pv_block(o, vt, i, c, mr, 1, u, m);
}

/* Rows from i in blocks of mr, while whole blocks are left: column blocks of nv vectors (u keys
 * a step), then the columns left over a vector at a time, where the rows go together if there
 * are at most tail_rows of them (two keys a step for two chains a row), else one by one with
 * tail_keys keys a step. On an ISA without masked loads, a whole vector takes tail_keys keys a
 * step and a partial one a key at a time. Returns the first row not done. */
ALWAYS_INLINE size_t pv_rows(const pv_operands *o, int vt, size_t i, int mr, int nv, int u,
                             int tail_rows, int tail_keys) {
    const int far = o->nq * o->d_v > 8192;
    for (; i + mr <= o->nq; i += mr) {
        size_t c = 0;
        for (; c + nv * W <= o->d_v; c += nv * W) {
            /* the next rows' block of acc, a cache line at a time, where acc is past 32 KiB:
               the backward's dk and dv rows (64 KiB each at d = 128) come from L2, and their
               loads at the start of a block would otherwise stall the FMAs; an acc that stays
               in L1 (the forward's, d = 64) only pays for the prefetches */
            if (far && i + 2 * mr <= o->nq)
                for (int r = 0; r < mr; r++)
                    for (int f = 0; f < nv * W; f += 16)
                        __builtin_prefetch(o->acc + (i + mr + r) * o->ld_acc + c + f, 1);
            pv_block(o, vt, i, c, mr, nv, u, NULL);
        }
        for (; c < o->d_v; c += W) {
            const size_t n = o->d_v - c < W ? o->d_v - c : W;
            const vpart m = vpart_first(n);
            if (VF_MASKED && mr <= tail_rows)
                pv_vector(o, vt, i, c, mr, mr > 1 ? 2 : tail_keys, &m);
            else
                for (int r = 0; r < mr; r++) {
                    if (VF_MASKED)
                        pv_vector(o, vt, i + r, c, 1, tail_keys, &m);
                    else if (n == W)
                        pv_vector(o, vt, i + r, c, 1, tail_keys, NULL);
                    else
                        pv_vector(o, vt, i + r, c, 1, 1, &m);
                }
        }
    }
    return i;
}

/* kernels.h's pv_tile (and exp_pv's P V step), v of type vt: blocks of mr_a rows (nv_a vectors a
 * block), then of mr_b (none if 0), then single rows, 4 vectors with two keys a step for eight
 * chains. */
ALWAYS_INLINE void pv_tile_loops(const pv_operands *o, int vt, int mr_a, int nv_a, int mr_b,
                                 int nv_b, int tail_rows, int tail_keys) {
    size_t i = pv_rows(o, vt, 0, mr_a, nv_a, 1, tail_rows, tail_keys);
    if (mr_b) i = pv_rows(o, vt, i, mr_b, nv_b, 1, tail_rows, tail_keys);
    pv_rows(o, vt, i, 1, 4, 2, tail_rows, tail_keys);
}

#endif
