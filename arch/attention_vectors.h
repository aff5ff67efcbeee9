/* Partial vectors of the attention templates, over a backend's vector vocabulary (the blocks
 * "the vector vocabulary" of arch/x86/<isa>.h, arch/arm/neon.h and arch/scalar/scalar.h;
 * docs/porting.md):
 * what arch/attention_tiles.h and arch/attention_keymajor.h share. Nothing here asks for the
 * backend's part, so a file that needs only these (an add-on with flags of its own, such as
 * arch/x86/avx512_bf16.c) can include it alone. */
#ifndef SDPA_ARCH_ATTENTION_VECTORS_H
#define SDPA_ARCH_ATTENTION_VECTORS_H

/* ---- partial vectors of up to W lanes ---- */

/* A vector whose first n (1..W) lanes are real, m = vpart_first(n) (computed once by the caller):
 * a masked ISA's partial operations take all W lanes as well, the others' need a full vector
 * told apart. */
ALWAYS_INLINE vf vf_load_upto(const float *p, size_t n, vpart m) {
    return VF_MASKED || n < W ? vf_load_part(p, m) : vf_load(p);
}
ALWAYS_INLINE void vf_store_upto(float *p, vf x, size_t n, vpart m) {
    if (VF_MASKED || n < W)
        vf_store_part(p, m, x);
    else
        vf_store(p, x);
}
/* a full vector (m NULL) or the lanes m of one */
ALWAYS_INLINE vf tile_load(const float *p, const vpart *m) {
    return m ? vf_load_part(p, *m) : vf_load(p);
}
ALWAYS_INLINE void tile_store(float *p, vf x, const vpart *m) {
    if (m)
        vf_store_part(p, *m, x);
    else
        vf_store(p, x);
}

#endif
