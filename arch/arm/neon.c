/* AArch64 Advanced SIMD (NEON) backend: 4 floats a vector, fused multiply-add. Advanced SIMD
 * is part of the AArch64 baseline, so this file needs no extra compiler flags. Tails are
 * loaded and stored lane by lane (neon_tails.h), so no load or store ever reaches past the end
 * of an array. The row kernels are arch/row_kernels.h, over neon.h's vector vocabulary. */
#include "neon_exp.h"

SDPA_DOT_TO(dot_neon)

#include "row_kernels.h"
#include "score_stage_tile.h"

const sdpa_kernels sdpa_kernels_neon = {
    ROW_KERNELS(dot_neon),
    STAGE_TILE_ENTRIES,
    .attention = &sdpa_attention_kernels_neon,
};
