/* Partial vectors of the attention templates, over a backend's vector operations (the block
 * "vector operations for the attention templates" of arch/x86/<isa>.h and arch/arm/neon.h):
 * what arch/attention_tiles.h and arch/attention_keymajor.h share. Nothing here asks for the
 * backend's part, so a file that needs only these (an add-on with flags of its own, such as
 * arch/x86/avx512_bf16.c) can include it alone. */
#ifndef SDPA_ARCH_ATTENTION_VECTORS_H
#define SDPA_ARCH_ATTENTION_VECTORS_H

/* ---- partial vectors of up to W lanes ---- */

/* A vector whose first n (1..W) lanes are real, m = fv_first(n) (computed once by the caller):
 * a masked ISA's partial operations take all W lanes as well, the others' need a full vector
 * told apart. */
ALWAYS_INLINE fv fv_load_upto(const float *p, size_t n, fv_lanes m) {
    return FV_MASKED || n < W ? fv_load_part(p, m) : fv_load(p);
}
ALWAYS_INLINE void fv_store_upto(float *p, fv x, size_t n, fv_lanes m) {
    if (FV_MASKED || n < W)
        fv_store_part(p, x, m);
    else
        fv_store(p, x);
}
/* a full vector (m NULL) or the lanes m of one */
ALWAYS_INLINE fv tile_load(const float *p, const fv_lanes *m) {
    return m ? fv_load_part(p, *m) : fv_load(p);
}
ALWAYS_INLINE void tile_store(float *p, fv x, const fv_lanes *m) {
    if (m)
        fv_store_part(p, x, *m);
    else
        fv_store(p, x);
}

#endif
