/* The score stage's softcap and ALiBi on a tile (kernels.h, sdpa_stage_tile), written once over
 * the vector vocabulary and the backend's exp. A backend file includes this after
 * arch/row_kernels.h (for exp_whole and row_exp_shift) and puts STAGE_TILE_ENTRIES in its table.
 *
 * Beyond the vocabulary it uses the compiler's vector operators on vf (/, the comparisons, and
 * the bitwise ones on an integer vector of the same size), which every ISA's vf supports.
 *
 * The softcap c tanh(s / c), with a = |s| / c: for a >= 1/4, tanh a = (1 - t) / (1 + t) with
 * t = exp(-2a) in (0, 0.61] (1 - t magnifies t's error at most 1.6 times); below, where it
 * would magnify it more, the series to a^9, whose next term is under 2^-26 a there. Each lane
 * takes the one for its a; the exp is formed only for vectors with a lane at or past 1/4, and a
 * lane gives the same bits either way. docs/numerics.md states the bound. */
#ifndef SDPA_ARCH_SCORE_STAGE_TILE_H
#define SDPA_ARCH_SCORE_STAGE_TILE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

typedef int32_t stage_vi __attribute__((vector_size(sizeof(vf))));

#define STAGE_SIGN 0x80000000u

/* lanes of `yes` where m is set (all ones), else `no` */
ALWAYS_INLINE vf stage_select(stage_vi m, vf yes, vf no) {
    return (vf)(((stage_vi)yes & m) | ((stage_vi)no & ~m));
}

/* tanh(s / c) for one vector, c > 0 (inv_c = 1 / c, m2c = -2 / c); +-inf gives +-1, NaN NaN */
ALWAYS_INLINE vf stage_tanh(vf s, vf inv_c, vf m2c, const row_exp *e, int kind) {
    const stage_vi sign = (stage_vi)s & (int32_t)STAGE_SIGN;
    const vf mag = (vf)((stage_vi)s & (int32_t)~STAGE_SIGN);
    const vf one = vf_set1(1.0f), a = mag * inv_c, a2 = a * a;
    vf th = a * (one - a2 * (vf_set1(1.0f / 3.0f) -
                             a2 * (vf_set1(2.0f / 15.0f) - a2 * (vf_set1(17.0f / 315.0f) -
                                                                 a2 * vf_set1(62.0f / 2835.0f)))));
    /* the exp only where a lane needs it (scores well inside the cap need none); a NaN lane
       gives NaN either way */
    if (!(vf_hmax(a) < 0.25f)) {
        const vf t = exp_whole(mag * m2c, e, kind);
        th = stage_select(a < vf_set1(0.25f), th, (one - t) / (one + t));
    }
    return (vf)((stage_vi)th | sign);
}

/* The stage's constants, once per call. */
typedef struct stage_consts {
    vf c, inv_c, m2c;
    vf lanes; /* 0, 1, ..., W - 1 */
    row_exp e;
} stage_consts;

/* One vector of the tile at line j (float jf), positions [x, x + W): softcap (its derivative to
   deriv), ALiBi (slope times dist + j, or along a row dist + x + lane), as kernels.h's
   sdpa_stage_tile says. */
ALWAYS_INLINE vf stage_vector(const stage_consts *k, vf s, float *deriv, vf slope, vf dist, vf jf,
                              vpart part, int whole, int kind, int cap, int alibi) {
    if (cap) {
        const vf th = stage_tanh(s, k->inv_c, k->m2c, &k->e, kind);
        s = k->c * th;
        if (deriv) store_some(deriv, part, whole, vf_set1(1.0f) - th * th);
    }
    if (alibi) s = s + slope * (dist + jf);
    return s;
}

/* The positions [x, x + W) of every line, with the steps known at compile time (cap, alibi);
   deriv and max are tested in the loop, the same way for every line. */
ALWAYS_INLINE void stage_lanes(const sdpa_stage_tile *t, const stage_consts *k, size_t x, int whole,
                               int kind, int cap, int alibi) {
    const vpart part = vpart_first(whole ? 1 : t->n - x); /* used when !whole */
    vf slope = vf_zero(), dist = vf_zero();
    if (alibi && t->one_row) { /* dist + x + lane: integers, exact */
        slope = vf_set1(t->slope[0]);
        dist = (vf_set1(t->dist[0]) + vf_set1((float)x)) + k->lanes;
    } else if (alibi) {
        slope = load_some(t->slope + x, part, whole);
        dist = load_some(t->dist + x, part, whole);
    }
    vf top = vf_set1(-INFINITY);
    stage_vi nan = (stage_vi)vf_zero();
    for (size_t j = 0; j < t->lines; j++) {
        float *p = t->s + j * t->ld + x;
        const vf jf = vf_set1((float)j);
        const vf s =
            stage_vector(k, load_some(p, part, whole), t->deriv ? t->deriv + j * t->ld + x : NULL,
                         slope, dist, jf, part, whole, kind, cap, alibi);
        if (cap || alibi) store_some(p, part, whole, s);
        if (t->max) {
            top = vf_max(s, top);
            nan |= s != s;
        }
    }
    if (t->max) store_some(t->max + x, part, whole, stage_select(nan, vf_set1(NAN), top));
}

ALWAYS_INLINE void stage_tile_of(const sdpa_stage_tile *t, int kind, int cap, int alibi) {
    stage_consts k;
    const float c = cap ? t->cap : 1.0f;
    k.c = vf_set1(c);
    k.inv_c = vf_set1(1.0f / c);
    k.m2c = vf_set1(-2.0f / c);
    k.e = row_exp_shift(0.0f, 0);
    float lanes[W];
    for (int l = 0; l < W; l++) lanes[l] = (float)l;
    k.lanes = vf_load(lanes);
    size_t x = 0;
    for (; t->n - x >= W; x += W) stage_lanes(t, &k, x, 1, kind, cap, alibi);
    if (x < t->n) stage_lanes(t, &k, x, 0, kind, cap, alibi);
}

ALWAYS_INLINE void stage_tile(const sdpa_stage_tile *t, int kind) {
    if (t->cap != 0.0f && t->slope)
        stage_tile_of(t, kind, 1, 1);
    else if (t->cap != 0.0f)
        stage_tile_of(t, kind, 1, 0);
    else if (t->slope)
        stage_tile_of(t, kind, 0, 1);
    else /* the max alone */
        stage_tile_of(t, kind, 0, 0);
}

static void stage_tile_fast(const sdpa_stage_tile *t) { stage_tile(t, SDPA_EXP_FAST); }
static void stage_tile_sleef(const sdpa_stage_tile *t) { stage_tile(t, SDPA_EXP_SLEEF); }

#define STAGE_TILE_ENTRIES .stage_tile = {stage_tile_fast, stage_tile_sleef}

#endif
