/* Portable C attention microkernels: arch/attention_tiles.h's and
 * arch/attention_keymajor_steps.h's algorithms at W = 1, over scalar.h's vocabulary; scalar.c's
 * table points at sdpa_attention_kernels_scalar. No packed path and no typed loads: the driver
 * widens 16-bit and 8-bit K and V to float rows first. */
#include "scalar.h"

#define ISA_NAME(f) f##_scalar

/* ds_keymajor along each key's row (attention_keymajor_steps.h) */
#define DS_BY_KEYS

#include "attention_keymajor_steps.h"
#include "attention_tiles.h"

enum { BLOCK_Q = 16, BLOCK_KV = 64 };
/* Scores: no register blocks, a dot_scalar for each query and key, so that a score is the dot
 * entry's result, with its blocked order of sums. */
#define ISA_SCORES_DOTS

ALWAYS_INLINE float isa_dot(const float *a, const float *b, size_t n) {
    return dot_scalar(a, b, n);
}

/* P V (pv_operands, attention_tiles.h; f32 only, scalar has no typed loads): a row at a time,
 * two keys a pass over the row in memory, each output one chain of adds in key order. Not
 * pv_tile_loops: at W = 1 a register block holds a chain a lane, too few to hide the adds'
 * latency (16 columns measured about a fifth slower), where a row's columns are as many
 * independent chains, and a pass over them is a loop the compiler vectorises. */
ALWAYS_INLINE void isa_pv(const pv_operands *o, int vt) {
    (void)vt;
    const f32_any *v = o->v; /* rows at any address (any_address.h), as acc's */
    for (size_t i = 0; i < o->nq; i++) {
        f32_any *acc = o->acc + i * o->ld_acc;
        const f32_any *p = o->p + i * o->p_row;
        size_t j = 0;
        for (; j + 2 <= o->nk; j += 2) {
            const float p0 = p[j * o->p_key], p1 = p[(j + 1) * o->p_key];
            const f32_any *v0 = v + j * o->v_stride, *v1 = v0 + o->v_stride;
            for (size_t c = 0; c < o->d_v; c++) acc[c] = (acc[c] + p0 * v0[c]) + p1 * v1[c];
        }
        if (j < o->nk) {
            const float p0 = p[j * o->p_key];
            const f32_any *v0 = v + j * o->v_stride;
            for (size_t c = 0; c < o->d_v; c++) acc[c] += p0 * v0[c];
        }
    }
}

#include "attention_entries.h"
