/* What an outside probe of sdpa.h's promises found to break, one test each, named after the
 * promise (part of the regressions test, test_regressions.c); every backend. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "bounds.h"
#include "checks.h"
#include "common.h"
#include "reference.h"

/* sdpa_last_error_detail names the argument and the rule: the status alone said "invalid size"
 * for a heads_kv that does not divide heads_q, and "invalid argument" for an unknown kv_type. */
BACKEND_TEST(regressions, error_detail_names_the_argument_and_the_rule) {
    static float in[64], out[64];
    sdpa_mha_desc d;
    cr_assert_eq(sdpa_mha_desc_dense(&d, 1, 8, 3, 2, 2, 2, 2, 0.0f, 0), SDPA_OK);
    cr_assert_eq(sdpa_mha_f32(&d, out, in, in, in), SDPA_ERR_SIZE);
    cr_assert_str_eq(sdpa_last_error_detail(), "heads_q (8) is not a multiple of heads_kv (3)");
    cr_assert_eq(sdpa_mha_desc_dense(&d, 1, 2, 1, 2, 2, 2, 2, 0.0f, 0), SDPA_OK);
    d.kv_type = 7;
    cr_assert_eq(sdpa_mha(&d, out, in, in, in), SDPA_ERR_ARG);
    cr_assert_str_eq(sdpa_last_error_detail(), "desc->kv_type (7) is not an sdpa_dtype (0 to 4)");
    /* a success leaves the detail as it was, as the header says */
    d.kv_type = SDPA_F32;
    cr_assert_eq(sdpa_mha(&d, out, in, in, in), SDPA_OK);
    cr_assert_str_eq(sdpa_last_error_detail(), "desc->kv_type (7) is not an sdpa_dtype (0 to 4)");
    /* the plugin table serves the same function */
    const sdpa_api *api = sdpa_get_api(SDPA_ABI_VERSION);
    cr_assert(SDPA_API_HAS(api, last_error_detail));
    cr_assert_eq(api->last_error_detail, sdpa_last_error_detail);
}

static void *detail_of_new_thread(void *arg) {
    (void)arg;
    return (void *)sdpa_last_error_detail();
}

/* the detail is the thread's own: another thread's failures do not change it */
Test(regressions, error_detail_is_per_thread) {
    cr_assert_eq(sdpa_set_num_threads(5000), SDPA_ERR_ARG);
    cr_assert_str_eq(sdpa_last_error_detail(), "n (5000) is above 1024 threads");
    pthread_t t;
    void *seen;
    cr_assert_eq(pthread_create(&t, NULL, detail_of_new_thread, NULL), 0);
    cr_assert_eq(pthread_join(t, &seen), 0);
    cr_assert_str_eq((const char *)seen, "");
}

/* A known detail first, then the call: it must fail with status and replace the detail with its
 * own, which holds `names` (the argument it rejects). */
#define EXPECT_DETAIL(status, names, call)                                                         \
    do {                                                                                           \
        float r_;                                                                                  \
        cr_assert_eq(sdpa_dot_f32(NULL, NULL, 1, &r_), SDPA_ERR_NULL);                             \
        cr_assert_str_eq(sdpa_last_error_detail(), "a is NULL with n = 1");                        \
        cr_assert_eq(call, status, "%s", #call);                                                   \
        cr_assert(strstr(sdpa_last_error_detail(), names), "%s: detail \"%s\", want \"%s\"",       \
                  #call, sdpa_last_error_detail(), names);                                         \
    } while (0)

/* Every entry point that can fail sets the detail when it does. */
BACKEND_TEST(regressions, every_failing_entry_point_sets_the_detail) {
    static float in[64], out[64], lse[8];
    uint16_t h[4] = {0};
    float r;
    sdpa_mha_desc d;
    sdpa_mha_grads g;
    memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    cr_assert_eq(sdpa_mha_desc_dense(&d, 1, 1, 1, 2, 2, 2, 2, 0.0f, 0), SDPA_OK);
    EXPECT_DETAIL(SDPA_ERR_NULL, "result is NULL", sdpa_dot_f32(in, in, 3, NULL));
    EXPECT_DETAIL(SDPA_ERR_NULL, "b is NULL", sdpa_dot_f32(in, NULL, 3, &r));
    EXPECT_DETAIL(SDPA_ERR_NULL, "y is NULL", sdpa_scale_f32(NULL, in, 3, 1.0f));
    EXPECT_DETAIL(SDPA_ERR_ARG, "scale (0)", sdpa_softmax_f32(out, in, 3, 0.0f));
    EXPECT_DETAIL(SDPA_ERR_NULL, "dy is NULL", sdpa_softmax_backward_f32(out, in, NULL, 3, 1.0f));
    EXPECT_DETAIL(SDPA_ERR_SIZE, "k_stride (3)", sdpa_scores_f32(out, in, in, 2, 4, 3, 1.0f));
    EXPECT_DETAIL(SDPA_ERR_UNSUPPORTED, "\"no-such\"", sdpa_set_backend("no-such"));
    EXPECT_DETAIL(SDPA_ERR_NULL, "name is NULL", sdpa_set_backend(NULL));
    EXPECT_DETAIL(SDPA_ERR_UNSUPPORTED, "\"slow\"", sdpa_set_exp_mode("slow"));
    EXPECT_DETAIL(SDPA_ERR_SIZE, "d_k is 0",
                  sdpa_attention_f32(out, in, in, in, 2, 2, 0, 2, 0.0f, 0));
    EXPECT_DETAIL(SDPA_ERR_ARG, "flags (0x2)",
                  sdpa_attention_f32(out, in, in, in, 2, 2, 2, 2, 0.0f, 2));
    EXPECT_DETAIL(SDPA_ERR_NULL, "desc is NULL", sdpa_mha_f32(NULL, out, in, in, in));
    EXPECT_DETAIL(SDPA_ERR_NULL, "q is NULL", sdpa_mha(&d, out, NULL, in, in));
    EXPECT_DETAIL(SDPA_ERR_NULL, "desc is NULL",
                  sdpa_mha_desc_dense(NULL, 1, 1, 1, 1, 1, 1, 1, 0.0f, 0));
    EXPECT_DETAIL(SDPA_ERR_NULL, "desc is NULL",
                  sdpa_mha_desc_bshd(NULL, 1, 1, 1, 1, 1, 1, 1, 0.0f, 0));
    EXPECT_DETAIL(SDPA_ERR_NULL, "desc is NULL", sdpa_mha_desc_set_mask(NULL, in, 0, 0, 0));
    EXPECT_DETAIL(SDPA_ERR_ARG, "src_type (9)", sdpa_convert(h, SDPA_F16, in, 9, 4));
    EXPECT_DETAIL(SDPA_ERR_ARG, "n (2000)", sdpa_set_num_threads(2000));
    EXPECT_DETAIL(SDPA_ERR_NULL, "lse_b is NULL",
                  sdpa_attention_merge_f32(out, lse, in, NULL, 2, 2, 2, 2));
    EXPECT_DETAIL(SDPA_ERR_NULL, "grads is NULL", sdpa_mha_backward_f32(&d, NULL, in, in, in, out));
    EXPECT_DETAIL(SDPA_ERR_NULL, "desc->lse is NULL",
                  sdpa_mha_backward_f32(&d, &g, in, in, in, out));
}

/* "Two such parts give zeros and -inf": merging two parts that both saw no key left out as it
 * was (here, garbage) instead of zeros. */
BACKEND_TEST(regressions, merge_of_two_empty_parts_gives_zeros) {
    float out[6] = {1, 2, NAN, 4, INFINITY, 6}, out_b[6] = {7, 8, 9, 10, 11, 12};
    float lse[2] = {-INFINITY, -INFINITY}, lse_b[2] = {-INFINITY, -INFINITY};
    cr_assert_eq(sdpa_attention_merge_f32(out, lse, out_b, lse_b, 2, 3, 3, 3), SDPA_OK);
    for (int i = 0; i < 6; i++)
        cr_assert(out[i] == 0.0f && !signbit(out[i]), "out[%d] %g", i, out[i]);
    cr_assert(lse[0] == -INFINITY && lse[1] == -INFINITY);
    /* a part merged with itself, both empty: zeros too */
    float self[3] = {5, 5, 5}, self_lse = -INFINITY;
    cr_assert_eq(sdpa_attention_merge_f32(self, &self_lse, self, &self_lse, 1, 3, 3, 3), SDPA_OK);
    for (int i = 0; i < 3; i++) cr_assert(self[i] == 0.0f, "self[%d] %g", i, self[i]);
}

/* The v2 fields come in groups: a struct_size that covers the types but not lse must have its
 * types read (they were ignored, so f16 K/V was read as float); one that ends inside a group is
 * no header's and is SDPA_ERR_ARG. */
BACKEND_TEST(regressions, descriptor_types_are_read_without_lse) {
    enum { L = 3, D = 4 };
    float q[L * D], kf[L * D], vf[L * D], want[L * D], got[L * D];
    uint16_t k16[L * D], v16[L * D];
    rng r = rng_seed(3401);
    fill_normal(&r, q, L * D);
    fill_normal(&r, kf, L * D);
    fill_normal(&r, vf, L * D);
    cr_assert_eq(sdpa_convert(k16, SDPA_F16, kf, SDPA_F32, L * D), SDPA_OK);
    cr_assert_eq(sdpa_convert(v16, SDPA_F16, vf, SDPA_F32, L * D), SDPA_OK);
    cr_assert_eq(sdpa_convert(kf, SDPA_F32, k16, SDPA_F16, L * D), SDPA_OK); /* the stored values */
    cr_assert_eq(sdpa_convert(vf, SDPA_F32, v16, SDPA_F16, L * D), SDPA_OK);
    sdpa_mha_desc d;
    cr_assert_eq(sdpa_mha_desc_dense(&d, 1, 1, 1, L, L, D, D, 0.0f, 0), SDPA_OK);
    cr_assert_eq(sdpa_attention_f32(want, q, kf, vf, L, L, D, D, 0.0f, 0), SDPA_OK);
    d.kv_type = SDPA_F16;
    d.struct_size = (uint32_t)offsetof(sdpa_mha_desc, lse);
    cr_assert_eq(sdpa_mha(&d, got, q, k16, v16), SDPA_OK);
    for (int i = 0; i < L * D; i++)
        cr_assert(fabsf(got[i] - want[i]) <= 1e-5f * 4.0f, "out[%d] %g, want %g", i, got[i],
                  want[i]);
    d.kv_type = 7; /* read, so rejected */
    cr_assert_eq(sdpa_mha(&d, got, q, k16, v16), SDPA_ERR_ARG);
    d.kv_type = SDPA_F16;
    d.struct_size = (uint32_t)offsetof(sdpa_mha_desc, kv_type);
    cr_assert_eq(sdpa_mha(&d, got, q, k16, v16), SDPA_ERR_ARG);
    d.struct_size = (uint32_t)offsetof(sdpa_mha_desc, lse_stride) + sizeof(size_t);
    cr_assert_eq(sdpa_mha(&d, got, q, k16, v16), SDPA_ERR_ARG);
}

/* "With any 16-bit view, d_k and d_v must be at most 8192": also when there is no output row. */
BACKEND_TEST(regressions, sixteen_bit_limit_holds_without_rows) {
    sdpa_mha_desc d;
    uint16_t x[1];
    for (size_t len_q = 0; len_q < 2; len_q++) {
        cr_assert_eq(sdpa_mha_desc_dense(&d, 1, 1, 1, len_q, 0, 8193, 4, 0.0f, 0), SDPA_OK);
        d.kv_type = SDPA_F16;
        cr_assert_eq(sdpa_mha(&d, x, x, x, x), SDPA_ERR_SIZE, "len_q %zu", len_q);
        cr_assert(strstr(sdpa_last_error_detail(), "d_k (8193)"));
        cr_assert_eq(sdpa_mha_desc_dense(&d, 0, 1, 1, 1, 1, 4, 8193, 0.0f, 0), SDPA_OK);
        d.out_type = SDPA_BF16;
        cr_assert_eq(sdpa_mha(&d, x, x, x, x), SDPA_ERR_SIZE, "batch 0");
    }
}

/* "A NaN stays a NaN, quieted, with its sign": a copy to the same type left signalling NaNs
 * signalling. Each type, apart and in place; quiet NaNs and other values keep their bits. */
BACKEND_TEST(regressions, convert_to_the_same_type_quiets_nans) {
    const uint32_t f32_in[] = {0x7f800001u, 0xff800001u, 0x7fa00000u,
                               0x7fc00001u, 0x7f800000u, 0x3f800000u};
    const uint32_t f32_want[] = {0x7fc00001u, 0xffc00001u, 0x7fe00000u,
                                 0x7fc00001u, 0x7f800000u, 0x3f800000u};
    const uint16_t f16_in[] = {0x7c01u, 0xfc01u, 0x7d00u, 0x7e01u, 0x7c00u, 0x3c00u};
    const uint16_t f16_want[] = {0x7e01u, 0xfe01u, 0x7f00u, 0x7e01u, 0x7c00u, 0x3c00u};
    const uint16_t bf_in[] = {0x7f81u, 0xff81u, 0x7fa0u, 0x7fc1u, 0x7f80u, 0x3f80u};
    const uint16_t bf_want[] = {0x7fc1u, 0xffc1u, 0x7fe0u, 0x7fc1u, 0x7f80u, 0x3f80u};
    for (int in_place = 0; in_place < 2; in_place++) {
        uint32_t a[6];
        uint16_t b[6], c[6];
        memcpy(a, f32_in, sizeof a);
        memcpy(b, f16_in, sizeof b);
        memcpy(c, bf_in, sizeof c);
        uint32_t a2[6];
        uint16_t b2[6], c2[6];
        cr_assert_eq(sdpa_convert(in_place ? a : a2, SDPA_F32, a, SDPA_F32, 6), SDPA_OK);
        cr_assert_eq(sdpa_convert(in_place ? b : b2, SDPA_F16, b, SDPA_F16, 6), SDPA_OK);
        cr_assert_eq(sdpa_convert(in_place ? c : c2, SDPA_BF16, c, SDPA_BF16, 6), SDPA_OK);
        for (int i = 0; i < 6; i++) {
            cr_assert_eq(in_place ? a[i] : a2[i], f32_want[i], "f32 %d in place %d", i, in_place);
            cr_assert_eq(in_place ? b[i] : b2[i], f16_want[i], "f16 %d in place %d", i, in_place);
            cr_assert_eq(in_place ? c[i] : c2[i], bf_want[i], "bf16 %d in place %d", i, in_place);
        }
    }
}

/* "out must not overlap q, k, v or the mask", and lse neither the inputs nor out: such calls
 * returned SDPA_OK and computed from inputs they were overwriting. Checked by extent, as the
 * backward checks its gradients; out is left untouched. */
BACKEND_TEST(regressions, out_overlapping_an_input_is_rejected) {
    enum { L = 4, D = 4, N = L * D };
    static float buf[8 * N], lse_buf[L];
    float *q = buf + N, *k = buf + 2 * N, *v = buf + 3 * N, *mask = buf + 4 * N, *out = buf + 5 * N;
    rng r = rng_seed(3402);
    fill_normal(&r, buf, 5 * N);
    sdpa_mha_desc d;
    cr_assert_eq(sdpa_mha_desc_dense(&d, 1, 1, 1, L, L, D, D, 0.0f, 0), SDPA_OK);
    cr_assert_eq(sdpa_mha_f32(&d, out, q, k, v), SDPA_OK);
    const float *inputs[3] = {q, k, v};
    const char *names[3] = {"q", "k", "v"};
    for (int i = 0; i < 3; i++) {
        for (size_t shift = 0; shift < N; shift += 5) {
            float *o = (float *)inputs[i] + shift; /* starts inside the input */
            float saved[8 * N];
            memcpy(saved, buf, sizeof saved);
            const float *a[3] = {q, k, v};
            cr_assert_eq(sdpa_mha_f32(&d, o, a[0], a[1], a[2]), SDPA_ERR_SIZE, "out in %s + %zu",
                         names[i], shift);
            cr_assert(strstr(sdpa_last_error_detail(), names[i]), "%s", sdpa_last_error_detail());
            cr_assert(memcmp(saved, buf, sizeof saved) == 0, "out in %s written", names[i]);
        }
    }
    /* out ending one float into q, from below */
    cr_assert_eq(sdpa_mha_f32(&d, q - N + 1, q, k, v), SDPA_ERR_SIZE);
    cr_assert_eq(sdpa_attention_f32(q + 1, q, k, v, L, L, D, D, 0.0f, 0), SDPA_ERR_SIZE);
    sdpa_mha_desc_set_mask(&d, mask, 0, 0, L);
    cr_assert_eq(sdpa_mha_f32(&d, out, q, k, v), SDPA_OK);
    cr_assert_eq(sdpa_mha_f32(&d, mask + 3, q, k, v), SDPA_ERR_SIZE);
    cr_assert(strstr(sdpa_last_error_detail(), "mask"));
    d.lse = lse_buf;
    cr_assert_eq(sdpa_mha_f32(&d, out, q, k, v), SDPA_OK);
    d.lse = k + 2;
    cr_assert_eq(sdpa_mha_f32(&d, out, q, k, v), SDPA_ERR_SIZE);
    d.lse = out + N - 1;
    cr_assert_eq(sdpa_mha_f32(&d, out, q, k, v), SDPA_ERR_SIZE);
    cr_assert_str_eq(sdpa_last_error_detail(), "out overlaps lse");
    /* 16-bit views by their bytes: an f16 q of N elements spans N / 2 floats */
    d.lse = NULL;
    d.q_type = d.kv_type = SDPA_F16;
    cr_assert_eq(sdpa_mha(&d, out, q, k, v), SDPA_OK);
    cr_assert_eq(sdpa_mha(&d, (float *)q + N / 2 - 1, q, k, v), SDPA_ERR_SIZE);
    /* with no key nothing is read, so nothing can be overwritten before it is read */
    cr_assert_eq(sdpa_mha_desc_dense(&d, 1, 1, 1, L, 0, D, D, 0.0f, 0), SDPA_OK);
    cr_assert_eq(sdpa_mha_f32(&d, q, q, k, v), SDPA_OK);
}
