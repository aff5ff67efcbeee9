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

/* P V: a row at a time, 8 columns a block, a key a step: each output is one chain of adds in
 * key order, (o + p0 v0) + p1 v1 ... */
ALWAYS_INLINE void isa_pv(const pv_operands *o, int vt) { pv_tile_loops(o, vt, 1, 16, 0, 0, 0, 1); }

#include "attention_entries.h"
