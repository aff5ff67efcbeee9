/* Internal: the problem an attention call states, from its arguments or its descriptor, and
 * the one check every attention entry point (forward and backward) runs before any work.
 * Strides are in elements; [b][h][r][c] of a view X is X[b s0 + h s1 + r s2 + c]. */
#ifndef SDPA_SRC_ATTENTION_PROBLEM_H
#define SDPA_SRC_ATTENTION_PROBLEM_H

#include <stddef.h>
#include <stdint.h>

#include "sdpa.h"

/* A call's score modifiers (sdpa_score_mods), each off when zeroed: the window's bounds,
 * softcap, ALiBi slopes and sinks of the query heads (alibi[h], sinks[h]), and the segments of
 * the query rows and keys (q_segment[b q_segment_stride + i], k_segment[b k_segment_stride +
 * j]). */
typedef struct problem_mods {
    int has_window_left, has_window_right;
    size_t window_left, window_right;
    float softcap;
    const float *alibi, *sinks;
    const int32_t *q_segment, *k_segment;
    size_t q_segment_stride, k_segment_stride;
} problem_mods;

typedef struct attention_problem {
    size_t batch, heads_q, heads_kv, len_q, len_kv, d_k, d_v;
    float scale; /* after sdpa_problem_check: never SDPA_DEFAULT_SCALE */
    int causal;
    /* element types (sdpa_dtype) of q, of k and v, and of out; the mask and lse are float */
    uint32_t q_type, kv_type, out_type;
    const void *q, *k, *v;
    void *out;
    const float *mask;
    size_t q_stride[3], k_stride[3], v_stride[3], out_stride[3], mask_stride[3];
    /* optional: each query row's log-sum-exp of its scores, lse[b s0 + h s1 + r lse_row] */
    float *lse;
    size_t lse_stride[2];
    size_t lse_row; /* 0 for 1; not 1 only for a paged batch's [token][head] lse, which the
                       backward never reads */
    /* paged K/V (sdpa_attention_paged), NULL when dense: key j of a head sits in page
       pages[j / page_size] at token j % page_size, its elements at
       k + h k_stride[1] + pages[j / page_size] k_page_stride + (j % page_size) k_stride[2]
       (v likewise); batch is then 1 and k_stride[0] unused. */
    const int32_t *pages;
    size_t page_size, k_page_stride, v_page_stride;
    /* an 8-bit K or V stands for k_scale or v_scale times its values (0: 1); k_scale is folded
       into scale by sdpa_problem_check */
    float k_scale, v_scale;
    problem_mods mods;
} attention_problem;

/* The largest d_k and d_v of a problem with a 16-bit view: its rows are widened to float in
 * tiles of SDPA_WIDE_FLOATS on the stack, which must hold one. */
#define SDPA_WIDE_FLOATS 8192

/* The name of each sdpa_dtype, in its order. */
extern const char *const SDPA_TYPE_NAMES[SDPA_FP8_E5M2 + 1];

/* Floats between the lse of a head's query rows. */
static inline size_t sdpa_problem_lse_row(const attention_problem *p) {
    return p->lse_row ? p->lse_row : 1;
}

/* Bytes of one element of type t (a valid sdpa_dtype). */
static inline size_t sdpa_type_size(uint32_t t) {
    return t == SDPA_F32 ? 4 : t <= SDPA_BF16 ? 2 : 1;
}

/* One dense head (sdpa_attention_f32's arguments). */
void sdpa_problem_single(attention_problem *p, void *out, const float *q, const float *k,
                         const float *v, size_t len_q, size_t len_kv, size_t d_k, size_t d_v,
                         float scale);

/* The descriptor's problem; SDPA_ERR_NULL or SDPA_ERR_ARG for a missing or too short desc, or
 * an unknown type (and any type but f32 when !typed: sdpa_mha_f32). */
sdpa_status sdpa_problem_from_desc(attention_problem *p, const sdpa_mha_desc *desc, void *out,
                                   const void *q, const void *k, const void *v, int typed);

/* The modifiers of mods into p (its heads_q, batch, len_q and len_kv set), checked as sdpa.h
 * says (score_mods.c): SDPA_ERR_ARG naming the field, p untouched, on a bad one. */
sdpa_status sdpa_problem_set_mods(attention_problem *p, const sdpa_score_mods *mods);

/* The scales of an 8-bit K and V (0 means 1): SDPA_ERR_ARG for one not finite. */
sdpa_status sdpa_problem_set_scales(attention_problem *p, float k_scale, float v_scale);

/* Whether p has a score modifier. */
static inline int sdpa_problem_has_mods(const attention_problem *p) {
    const problem_mods *m = &p->mods;
    return m->has_window_left || m->has_window_right || m->softcap != 0.0f || m->alibi ||
           m->sinks || m->q_segment;
}

/* Every rule of sdpa.h's attention errors, in one place; on SDPA_OK the scale is resolved and
 * causal set from flags. */
sdpa_status sdpa_problem_check(attention_problem *p, uint32_t flags);

/* The backward's problem: the forward's (out read, as an input) and the gradients' views. */
typedef struct backward_problem {
    attention_problem fwd;
    float *dq, *dk, *dv;
    const float *dout;
    size_t dq_stride[3], dk_stride[3], dv_stride[3], dout_stride[3];
    float *dsinks; /* [heads_q], or NULL: not asked */
} backward_problem;

/* grads' dsinks of bp (score_mods.c), after its forward wrote out and lse. */
void sdpa_problem_dsinks(const backward_problem *bp);

/* The descriptor's and grads' problem, and every rule of sdpa.h's backward errors; on SDPA_OK
 * the scale is resolved and causal set, as sdpa_problem_check does. */
sdpa_status sdpa_backward_problem(backward_problem *bp, const sdpa_mha_desc *desc,
                                  const sdpa_mha_grads *grads, const float *q, const float *k,
                                  const float *v, const float *out);

/* There is at least one output row. */
static inline int sdpa_problem_has_rows(const attention_problem *p) {
    return p->batch && p->heads_q && p->len_q;
}

#endif
