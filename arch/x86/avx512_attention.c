/* AVX-512F attention microkernels (the tiling driver is src/attention.c); avx512.c's table points
 * at sdpa_attention_kernels_avx512. The algorithms are arch/attention_tiles.h's and
 * arch/attention_packed.h's; this file gives them avx512's register blocks and exps. */
#include "avx512_exp.h"

#define ISA_NAME(f)     f##_avx512
#define ISA_TYPED_LOADS 1 /* K and V of f16 and bf16 read as they are (kernels.h) */
#define ISA_SCORES_HELD 1 /* a single query's vectors held in registers (attention_tiles.h) */
/* fp8 K and V widened in the loads (kernels.h's scores_tile_fp8): e5m2 in three operations a
 * vector (vpmovsxbw, vpsllw, vcvtph2ps) beside its FMAs, e4m3 in one more where its rows hold
 * no NaN (with the NaN fix-up in every load it measured slower than key_rows.c's pass) */
#define ISA_FP8_LOADS_E4M3 1
#define ISA_FP8_LOADS_E5M2 1

#include "attention_packed.h"

enum { BLOCK_Q = 32, BLOCK_KV = 64 };
/* Scores: 4 x 4 blocks, 8 loads for 16 FMAs and the 16 dots reduced by one vf_hsums; a single
 * query against 16 keys at a time. */
enum { SCORES_MR = 4, SCORES_NR = 4, SCORES_KEYWISE = 0, SCORES_ROW_NR = 16 };
/* exp_pv two keys a step: two exps side by side already keep the pipes busy */
enum { EXP_PV_KEYS = 2 };
/* decode: the exps of a whole tile in one call */
#define ISA_EXP_TILE 1

ALWAYS_INLINE float isa_dot(const float *a, const float *b, size_t n) {
    return dot_avx512(a, b, n);
}

/* A single row of f32 (decode): pv_tile_loops' blocks of 4 vectors and two keys a step, but two
 * blocks of them side by side (128 columns, 16 chains), so that each row of v is read once from
 * start to end rather than in two passes of half a row; each column's chains are the 4-vector
 * block's, so the sums are too, bit for bit. The columns past the last 128 as pv_tile_loops
 * takes them. */
ALWAYS_INLINE void pv_single_row(const pv_operands *o) {
    size_t c = 0;
    for (; c + 8 * W <= o->d_v; c += 8 * W)
        bcast_block(o->acc + c, o->ld_acc, o->p, o->p_row, o->p_key, (const float *)o->v + c,
                    o->v_stride, SDPA_TYPE_F32, 0, NULL, o->nk, 1, 8, 2, o->alpha, NULL, NULL);
    if (c == o->d_v) return;
    pv_operands rest = *o;
    rest.acc += c;
    rest.v = (const float *)o->v + c;
    rest.d_v -= c;
    pv_tile_loops(&rest, SDPA_TYPE_F32, 4, 4, 0, 0, 4, 4);
}

/* P V: 6 rows x 64 columns, the block of acc in 24 of the 32 registers for all nk keys (4 loads
 * of v and 6 broadcasts for 24 FMAs a key, where 4 rows take 8 for 16), then blocks of 2 rows
 * (what 6 leaves of a 32-row tile or a 128-key block). Decode's few rows (the query heads of a
 * kv head) go 4 to a block instead, so that 4 heads read each row of v once, not twice. The
 * columns left over 16 at a time, masked, for the rows of a block at once; the rows left over
 * one at a time. */
ALWAYS_INLINE void isa_pv(const pv_operands *o, int vt) {
    if (o->nq >= 16) {
        pv_tile_loops(o, vt, 6, 4, 2, 4, 6, 4);
        return;
    }
    if (o->nq == 1 && vt == SDPA_TYPE_F32)
        pv_single_row(o);
    else
        pv_tile_loops(o, vt, 4, 4, 0, 0, 4, 4);
}

/* Key-major scores: 8 keys x 32 queries, 2 loads of qt and 8 broadcasts of k for 16 FMAs a step,
 * then the keys left over one at a time. */
static void ISA_NAME(scores_keymajor)(float *st, size_t ld_st, const float *qt, size_t ld_qt,
                                      size_t nq, const float *k, size_t k_stride, size_t nk,
                                      size_t d, float scale) {
    (void)nq;
    const vf vscale = vf_set1(scale);
    const size_t j = keymajor_blocks(st, ld_st, qt, ld_qt, k, k_stride, 0, nk, d, vscale, 8, 2);
    keymajor_blocks(st, ld_st, qt, ld_qt, k, k_stride, j, nk, d, vscale, 1, 2);
}

/* the exps of scores minus their row's max, <= 0: exp_sum's light form */
ALWAYS_INLINE vf isa_exp_table(void) { return exp_table_avx512(); }
ALWAYS_INLINE void isa_exps(vf *x, int n, vf table, int kind) {
    for (int u = 0; u < n; u++)
        x[u] = kind == SDPA_EXP_FAST ? exp_fast_avx512(x[u], table, 0)
                                     : exp_sleef_avx512(x[u], table, 0);
}

#include "attention_entries.h"
