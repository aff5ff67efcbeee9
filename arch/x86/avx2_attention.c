/* AVX2 + FMA attention microkernels (the tiling driver is src/attention.c); avx2.c's table points
 * at sdpa_attention_kernels_avx2. The algorithms are arch/attention_tiles.h's and
 * arch/attention_packed.h's; this file gives them avx2's register blocks and exps. With 16
 * registers, a block's shared operands are pinned in registers (vf_pin) so that each is loaded
 * once for all its FMAs. */
#include "avx2_exp.h"

#define ISA_NAME(f)     f##_avx2
#define ISA_TYPED_LOADS 1 /* K and V of f16 and bf16 read as they are (kernels.h) */

#include "attention_packed.h"

enum { BLOCK_Q = 32, BLOCK_KV = 64 };
/* Scores: 2 x 4 blocks, 6 loads for 8 FMAs (16 registers hold no more) and the 8 dots reduced by
 * one vf_hsums; a single query against 8 keys at a time. */
enum { SCORES_MR = 2, SCORES_NR = 4, SCORES_KEYWISE = 0, SCORES_ROW_NR = 8 };
enum { EXP_PV_KEYS = 2 }; /* as on avx512 */

ALWAYS_INLINE float isa_dot(const float *a, const float *b, size_t n) { return dot_avx2(a, b, n); }

/* P V: 6 rows x 16 columns, 12 accumulators (more chains than the 8 that two FMA pipes need), 2
 * loads of v and 6 broadcasts for 12 FMAs a key; then pairs of rows x 32 columns (8
 * accumulators, 4 loads and 2 broadcasts for 8 FMAs); the columns left over 8 at a time, masked,
 * row by row with four keys a step. */
ALWAYS_INLINE void isa_pv(const pv_operands *o, int vt) { pv_tile_loops(o, vt, 6, 2, 2, 4, 1, 4); }

/* Key-major scores: 6 keys x 16 queries (12 accumulators, 2 loads of qt and 6 broadcasts for 12
 * FMAs a step), then 2 keys x 32 queries, then a last key. */
static void ISA_NAME(scores_keymajor)(float *st, size_t ld_st, const float *qt, size_t ld_qt,
                                      size_t nq, const float *k, size_t k_stride, size_t nk,
                                      size_t d, float scale) {
    (void)nq;
    const vf vscale = vf_set1(scale);
    size_t j = keymajor_blocks(st, ld_st, qt, ld_qt, k, k_stride, 0, nk, d, vscale, 6, 2);
    j = keymajor_blocks(st, ld_st, qt, ld_qt, k, k_stride, j, nk, d, vscale, 2, 4);
    keymajor_blocks(st, ld_st, qt, ld_qt, k, k_stride, j, nk, d, vscale, 1, 4);
}

ALWAYS_INLINE vf isa_exp_table(void) { return exp_table_avx2(); }
ALWAYS_INLINE void isa_exps(vf *x, int n, vf table, int kind) {
    for (int u = 0; u < n; u++)
        x[u] =
            kind == SDPA_EXP_FAST ? exp_fast_avx2(x[u], table, 0) : exp_sleef_avx2(x[u], table, 0);
}

#include "attention_entries.h"
