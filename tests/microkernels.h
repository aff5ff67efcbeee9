/* What the two files of the microkernels test share (test_microkernels.c defines them): the
 * shapes each kernel is called at, and the tiles its results land in, with a sentinel border. */
#ifndef SDPA_TEST_MICROKERNELS_H
#define SDPA_TEST_MICROKERNELS_H

#include <stddef.h>

#include "dispatch.h"

#define MAX_D  257
#define BORDER 3 /* sentinel floats past each tile row */
enum { LD_S = SDPA_ATTN_MAX_BLOCK_KV + BORDER, LD_Q = SDPA_ATTN_MAX_BLOCK_Q };

/* The (nq, nk, d) triples a kernel is called with: every nq against a spread of nk, every nk
 * against a spread of nq, every d against a rotating pair. */
typedef struct shape {
    size_t nq, nk, d;
} shape;

/* the bf16 dot adds 2 x 4 x 12 shapes of its own (bf16_dot_shapes) */
#define MAX_SHAPES (SDPA_ATTN_MAX_BLOCK_Q * 15 + SDPA_ATTN_MAX_BLOCK_KV * 4 + MAX_D + 8 + 96)

/* backend name's table, once the test has chosen it (skips, visibly, what cannot run here) */
const sdpa_kernels *kernels_of(const char *name);
/* a's shapes up to d = max_d into out (MAX_SHAPES); returns how many */
size_t shapes_of(const sdpa_attention_kernels *a, size_t max_d, shape *out);
void fill_sentinel(float *x, size_t n); /* n floats of SENTINEL */

extern float s_tile[(SDPA_ATTN_MAX_BLOCK_Q + 1) * LD_S]; /* row-major scores, border after */
extern float st[SDPA_ATTN_MAX_BLOCK_KV * SDPA_ATTN_MAX_BLOCK_Q]; /* key-major scores */
extern shape shapes[MAX_SHAPES];

#endif
