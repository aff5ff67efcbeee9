/* NEON (AArch64 Advanced SIMD) attention microkernels: 4 floats a vector, 32 registers, FMA.
 * Kept apart from arch/arm/neon.c so that both can be written at once; neon.c's table points
 * at sdpa_attention_kernels_neon. The algorithms are arch/attention_tiles.h's (and
 * exp_keymajor arch/attention_keymajor_steps.h's, over neon_exp.h's row exps); this file gives
 * them NEON's register blocks. Tails are loaded and stored lane by lane (neon_tails.h), so nothing
 * past the end of a row is read or written. */
#include "neon_exp.h"

#define ISA_NAME(f) f##_neon

#include "attention_keymajor_steps.h"
#include "attention_tiles.h"

enum { BLOCK_Q = 32, BLOCK_KV = 64 };
/* Scores: 4 x 4 blocks, 8 loads for 16 FMAs (24 of the 32 registers), each row's 4 dots reduced
 * by two pairwise adds; a single query against 8 keys at a time. */
enum { SCORES_MR = 4, SCORES_NR = 4, SCORES_KEYWISE = 0, SCORES_ROW_NR = 8 };

ALWAYS_INLINE float isa_dot(const float *a, const float *b, size_t n) { return dot_neon(a, b, n); }

/* P V: 4 rows x 16 columns, 16 accumulators, 4 loads of v and 4 weights for 16 FMAs a key; the
 * columns left over a vector at a time, row by row. */
ALWAYS_INLINE void isa_pv(const pv_operands *o, int vt) { pv_tile_loops(o, vt, 4, 4, 0, 0, 1, 2); }

#include "attention_entries.h"
