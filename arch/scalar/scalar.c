/* Portable C backend: the baseline every CPU runs, and the fallback of every dispatch ladder.
 * The row kernels are arch/row_kernels.h's and the attention microkernels the templates'
 * (scalar_attention.c), at W = 1 over scalar.h's vocabulary, with its exps and its dot. */
#include "scalar.h"

SDPA_DOT_TO(dot_scalar)

#include "row_kernels.h"

const sdpa_kernels sdpa_kernels_scalar = {
    ROW_KERNELS(dot_scalar),
    .attention = &sdpa_attention_kernels_scalar,
};
