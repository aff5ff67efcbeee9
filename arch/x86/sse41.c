/* SSE4.1 backend: 4 floats a vector, no FMA. Tails are loaded and stored element by element
 * (load_partial, store_partial), so no load or store ever reaches past the end of an array. The
 * row kernels are arch/row_kernels.h, over this ISA's vector operations (sse41.h) and exps. */
#include "sse41_exp.h"

SDPA_DOT_TO(dot_sse41)

ALWAYS_INLINE __m128 row_weight(__m128 e, __m128 factor, __m128 keep_from, int from_e) {
    (void)keep_from, (void)from_e;
    const __m128 w = e * factor;
    return _mm_andnot_ps(_mm_cmplt_ps(w, _mm_set1_ps(FLT_MIN)), w);
}

#include "row_kernels.h"
#include "score_stage_tile.h"

const sdpa_kernels sdpa_kernels_sse41 = {
    ROW_KERNELS(dot_sse41),
    STAGE_TILE_ENTRIES,
    .attention = &sdpa_attention_kernels_sse41,
};
