/* Every size and stride argument of every entry point at the edges of size arithmetic: SIZE_MAX,
 * SIZE_MAX / 4 + 1 (the first count of floats whose bytes overflow), 2^62 and 2^63, one argument
 * at a time with the others valid. Each call must return a status without reading an input or
 * writing an output: the arrays lie in PROT_NONE memory, so a single access faults, and dot's
 * result must keep its sentinel. Every backend, since a check that a backend skipped would show
 * only there. */
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "common.h"

static const size_t HUGE_SIZES[] = {SIZE_MAX, SIZE_MAX / 4 + 1, (size_t)1 << 62, (size_t)1 << 63};
#define N_HUGE (sizeof HUGE_SIZES / sizeof HUGE_SIZES[0])

/* A page no access may touch: every array of these tests points into it. */
static float *no_access(void) {
    static float *page;
    if (!page) {
        void *p = mmap(NULL, 1 << 16, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        cr_assert_neq(p, MAP_FAILED);
        page = (float *)p + 1024;
    }
    return page;
}

BACKEND_TEST(sizes, kernels_reject_counts_past_any_array) {
    float *p = no_access();
    for (size_t h = 0; h < N_HUGE; h++) {
        const size_t n = HUGE_SIZES[h];
        float result = SENTINEL;
        cr_assert_eq(sdpa_dot_f32(p, p, n, &result), SDPA_ERR_SIZE, "dot n=%#zx", n);
        cr_assert_eq(result, SENTINEL, "dot wrote its result on error");
        cr_assert_eq(sdpa_scale_f32(p, p, n, 2.0f), SDPA_ERR_SIZE, "scale n=%#zx", n);
        cr_assert_eq(sdpa_softmax_f32(p, p, n, 1.0f), SDPA_ERR_SIZE, "softmax n=%#zx", n);
        cr_assert_eq(sdpa_softmax_backward_f32(p, p, p, n, 1.0f), SDPA_ERR_SIZE,
                     "softmax_backward n=%#zx", n);
    }
}

BACKEND_TEST(sizes, scores_rejects_every_overflowing_argument) {
    float *p = no_access();
    for (size_t h = 0; h < N_HUGE; h++) {
        const size_t big = HUGE_SIZES[h];
        cr_assert_eq(sdpa_scores_f32(p, p, p, big, 4, 4, 1.0f), SDPA_ERR_SIZE, "n_keys %#zx", big);
        /* one key of d floats, and two keys big apart */
        cr_assert_eq(sdpa_scores_f32(p, p, p, 1, big, big, 1.0f), SDPA_ERR_SIZE, "d %#zx", big);
        cr_assert_eq(sdpa_scores_f32(p, p, p, 2, big, big, 1.0f), SDPA_ERR_SIZE, "d %#zx", big);
        cr_assert_eq(sdpa_scores_f32(p, p, p, 2, 4, big, 1.0f), SDPA_ERR_SIZE, "stride %#zx", big);
        cr_assert_eq(sdpa_scores_f32(p, p, p, big, big, big, 1.0f), SDPA_ERR_SIZE, "all %#zx", big);
    }
    /* the reproducer: d and k_stride of 2^62, where SIZE_MAX / 4 - d wrapped */
    cr_assert_eq(sdpa_scores_f32(p, p, p, 1, (size_t)1 << 62, (size_t)1 << 62, 1.0f),
                 SDPA_ERR_SIZE);
    cr_assert_eq(sdpa_scores_f32(p, p, p, 2, SIZE_MAX, SIZE_MAX, 1.0f), SDPA_ERR_SIZE);
}

BACKEND_TEST(sizes, attention_rejects_every_overflowing_size) {
    float *p = no_access();
    for (size_t h = 0; h < N_HUGE; h++) {
        const size_t big = HUGE_SIZES[h];
        cr_assert_eq(sdpa_attention_f32(p, p, p, p, big, 3, 4, 4, 0.0f, 0), SDPA_ERR_SIZE);
        cr_assert_eq(sdpa_attention_f32(p, p, p, p, 3, big, 4, 4, 0.0f, 0), SDPA_ERR_SIZE);
        cr_assert_eq(sdpa_attention_f32(p, p, p, p, 3, 3, big, 4, 0.0f, 0), SDPA_ERR_SIZE);
        cr_assert_eq(sdpa_attention_f32(p, p, p, p, 3, 3, 4, big, 0.0f, 0), SDPA_ERR_SIZE);
        cr_assert_eq(sdpa_attention_f32(p, p, p, p, 1, 1, big, big, 0.0f, 0), SDPA_ERR_SIZE);
    }
}

/* The descriptor's fields by offset, so that one loop sets each in turn. */
static size_t *field(sdpa_mha_desc *d, size_t offset) { return (size_t *)((char *)d + offset); }

#define SIZE_FIELD(name)                                                                           \
    { #name, offsetof(sdpa_mha_desc, name) }
#define STRIDE_FIELDS(name)                                                                        \
    {#name "[0]", offsetof(sdpa_mha_desc, name)},                                                  \
        {#name "[1]", offsetof(sdpa_mha_desc, name) + sizeof(size_t)}, {                           \
#name "[2]", offsetof(sdpa_mha_desc, name) + 2 * sizeof(size_t)                            \
    }

static const struct {
    const char *name;
    size_t offset;
} MHA_FIELDS[] = {
    SIZE_FIELD(batch),       SIZE_FIELD(heads_q),       SIZE_FIELD(heads_kv),
    SIZE_FIELD(len_q),       SIZE_FIELD(len_kv),        SIZE_FIELD(d_k),
    SIZE_FIELD(d_v),         STRIDE_FIELDS(q_stride),   STRIDE_FIELDS(k_stride),
    STRIDE_FIELDS(v_stride), STRIDE_FIELDS(out_stride), STRIDE_FIELDS(mask_stride),
};

/* Every field of a descriptor whose every axis has more than one entry (so every stride is
 * used), masked, causal and not. */
BACKEND_TEST(sizes, mha_rejects_every_overflowing_field) {
    float *p = no_access();
    for (int causal = 0; causal < 2; causal++) {
        sdpa_mha_desc ok;
        cr_assert_eq(sdpa_mha_desc_dense(&ok, 2, 4, 2, 3, 5, 4, 3, 0.0f, causal ? SDPA_CAUSAL : 0),
                     SDPA_OK);
        cr_assert_eq(sdpa_mha_desc_set_mask(&ok, p, 4 * 3 * 5, 3 * 5, 5), SDPA_OK);
        for (size_t f = 0; f < sizeof MHA_FIELDS / sizeof MHA_FIELDS[0]; f++)
            for (size_t h = 0; h < N_HUGE; h++) {
                sdpa_mha_desc d = ok;
                *field(&d, MHA_FIELDS[f].offset) = HUGE_SIZES[h];
                sdpa_status st = sdpa_mha_f32(&d, p, p, p, p);
                cr_assert(st == SDPA_ERR_SIZE, "%s = %#zx: status %d", MHA_FIELDS[f].name,
                          HUGE_SIZES[h], st);
            }
    }
}

/* The layout helpers with one huge size: strides that overflow, which the call rejects. */
BACKEND_TEST(sizes, layout_helpers_give_descriptors_the_call_rejects) {
    float *p = no_access();
    for (int bshd = 0; bshd < 2; bshd++)
        for (size_t arg = 0; arg < 7; arg++)
            for (size_t h = 0; h < N_HUGE; h++) {
                size_t s[7] = {2, 4, 2, 3, 5, 4, 3};
                s[arg] = HUGE_SIZES[h];
                if (arg == 2) s[1] = s[2]; /* heads_kv: keep it dividing heads_q */
                sdpa_mha_desc d;
                sdpa_status st = (bshd ? sdpa_mha_desc_bshd : sdpa_mha_desc_dense)(
                    &d, s[0], s[1], s[2], s[3], s[4], s[5], s[6], 0.0f, 0);
                cr_assert_eq(st, SDPA_OK);
                st = sdpa_mha_f32(&d, p, p, p, p);
                cr_assert_eq(st, SDPA_ERR_SIZE, "%s, argument %zu = %#zx: status %d",
                             bshd ? "bshd" : "dense", arg, HUGE_SIZES[h], st);
            }
}
