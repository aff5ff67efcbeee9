/* A backend's table, sdpa_attention_kernels_<isa>, and its entries, from arch/attention_tiles.h
 * (and arch/attention_packed.h, where the backend included it: the packed entries; and
 * arch/attention_keymajor_steps.h, included by it or alone: exp_keymajor, ds_keymajor) with the
 * backend's part, each named ISA_NAME(entry) (scores_tile_avx512, ...). Included once, last, by
 * <isa>_attention.c, after:
 *   ISA_NAME(f)             f with the backend's suffix (f##_avx512)
 *   BLOCK_Q, BLOCK_KV       the table's tile (kernels.h)
 *   SCORES_MR, SCORES_NR    the scores' register block (scores_block)
 *   SCORES_KEYWISE          its loads keywise (scores_step)
 *   ISA_FIRST_KEY_FIRST     defined before attention_tiles.h is included, for each step of
 *                           the keywise loads from the first key (a compiler barrier after
 *                           it, scores_step)
 *   SCORES_ROW_NR           the keys of a single query's block
 *   ISA_SCORES_DOTS         defined, for scores a dot each instead (attention_tiles.h's
 *                           scores_dots; the four above unused)
 *   EXP_PV_KEYS             exp_pv's keys a step, 2 or 4 (exp_pv_loops), with the packed entries
 *   ISA_EXP_TILE            defined, to give the table exp_tile: where one call a tile measured
 *                           faster than the driver's exp_sum row by row
 *   ISA_TYPED_LOADS         defined, to give the table scores_tile_typed and pv_tile_typed
 *                           (attention_tiles.h: the backend then has vpart_count)
 *   ISA_FP8_LOADS_E4M3, ISA_FP8_LOADS_E5M2  defined (with ISA_TYPED_LOADS), to give the table
 *                           scores_tile_fp8 and pv_tile_fp8 for that type: where widening
 *                           each vector in the loads measured faster than key_rows.c's pass
 *                           to f16 rows */
#ifndef SDPA_ARCH_ATTENTION_ENTRIES_H
#define SDPA_ARCH_ATTENTION_ENTRIES_H

/* kernels.h's scores_tile with k rows of type kt (attention_tiles.h) for several rows: blocks
 * of mr, then the rows left over one query each. */
ALWAYS_INLINE void scores_rows_as(float *s, size_t ld_s, const float *q, size_t q_stride, size_t nq,
                                  const void *k, size_t k_stride, const void *ahead, int kt,
                                  size_t nk, size_t d, float scale) {
#ifdef ISA_SCORES_DOTS
    (void)ahead;
    scores_dots(s, ld_s, q, q_stride, nq, k, k_stride, kt, nk, d, scale);
#else
    size_t i = scores_row_blocks(s, ld_s, q, q_stride, nq, k, k_stride, ahead, kt, nk, d, scale,
                                 SCORES_MR, SCORES_NR, SCORES_KEYWISE);
    for (; i < nq; i++)
        scores_query(s + i * ld_s, q + i * q_stride, k, k_stride, ahead, kt, nk, d, scale,
                     SCORES_ROW_NR);
#endif
}

/* The rows, a function of their own per type, so that a single query (decode, and the scores
 * entry) runs with no row loop around it: its row_nr key streams need every general register.
 * Rows with no rows to read ahead into (ahead NULL: a dense source's) take an instance compiled
 * for it, whose key loops carry no test of where a read-ahead goes (decode from L3 about 2 %
 * faster on a Xeon); those of ahead (kernels.h) take the other. */
typedef void scores_rows_fn(float *s, size_t ld_s, const float *q, size_t q_stride, size_t nq,
                            const void *k, size_t k_stride, const void *ahead, size_t nk, size_t d,
                            float scale);
#define SCORES_ROWS(name, kt)                                                                      \
    __attribute__((noinline)) static void ISA_NAME(name)(                                          \
        float *s, size_t ld_s, const float *q, size_t q_stride, size_t nq, const void *k,          \
        size_t k_stride, const void *ahead, size_t nk, size_t d, float scale) {                    \
        if (ahead)                                                                                 \
            scores_rows_as(s, ld_s, q, q_stride, nq, k, k_stride, ahead, kt, nk, d, scale);        \
        else                                                                                       \
            scores_rows_as(s, ld_s, q, q_stride, nq, k, k_stride, NULL, kt, nk, d, scale);         \
    }

ALWAYS_INLINE void scores_tile_as(float *s, size_t ld_s, const float *q, size_t q_stride, size_t nq,
                                  const void *k, size_t k_stride, const void *ahead, int kt,
                                  size_t nk, size_t d, float scale, scores_rows_fn *rows) {
#ifdef ISA_SCORES_DOTS
    (void)kt; /* rows has it */
    rows(s, ld_s, q, q_stride, nq, k, k_stride, ahead, nk, d, scale);
#else
    if (nq == 1 && ahead) /* as in SCORES_ROWS */
        scores_query(s, q, k, k_stride, ahead, kt, nk, d, scale, SCORES_ROW_NR);
    else if (nq == 1)
        scores_query(s, q, k, k_stride, NULL, kt, nk, d, scale, SCORES_ROW_NR);
    else
        rows(s, ld_s, q, q_stride, nq, k, k_stride, ahead, nk, d, scale);
#endif
}

SCORES_ROWS(scores_rows, SDPA_TYPE_F32)

static void ISA_NAME(scores_tile)(float *s, size_t ld_s, const float *q, size_t q_stride, size_t nq,
                                  const float *k, size_t k_stride, size_t nk, size_t d,
                                  float scale) {
    scores_tile_as(s, ld_s, q, q_stride, nq, k, k_stride, NULL, SDPA_TYPE_F32, nk, d, scale,
                   ISA_NAME(scores_rows));
}

static void ISA_NAME(pv_tile)(float *acc, size_t ld_acc, const float *p, size_t ld_p, size_t nq,
                              size_t nk, const float *v, size_t v_stride, size_t d_v) {
    const pv_operands o = {acc, ld_acc, p, ld_p, 1, NULL, nq, nk, v, v_stride, d_v, NULL};
    isa_pv(&o, SDPA_TYPE_F32);
}

#ifdef ISA_TYPED_LOADS

/* kernels.h's scores_tile_typed and pv_tile_typed: one instance per type, and for f16 a second
 * through the exact widening for a caller under DAZ (attention_tiles.h, TILE_F16_EXACT), chosen
 * a call at a time as widen[] does. */
#define TYPED_ENTRIES(name, kt)                                                                    \
    SCORES_ROWS(scores_rows_##name, kt)                                                            \
    __attribute__((noinline)) static void ISA_NAME(scores_tile_##name)(                            \
        float *s, size_t ld_s, const float *q, size_t q_stride, size_t nq, const void *k,          \
        size_t k_stride, const void *ahead, size_t nk, size_t d, float scale) {                    \
        scores_tile_as(s, ld_s, q, q_stride, nq, k, k_stride, ahead, kt, nk, d, scale,             \
                       ISA_NAME(scores_rows_##name));                                              \
    }                                                                                              \
    __attribute__((noinline)) static void ISA_NAME(pv_tile_##name)(                                \
        float *acc, size_t ld_acc, const float *p, size_t ld_p, size_t nq, size_t nk,              \
        const void *v, size_t v_stride, const void *ahead, size_t d_v) {                           \
        pv_operands o = {acc, ld_acc, p, ld_p, 1, NULL, nq, nk, v, v_stride, d_v, NULL};           \
        if (!ahead) { /* as in SCORES_ROWS */                                                      \
            isa_pv(&o, kt);                                                                        \
            return;                                                                                \
        }                                                                                          \
        o.ahead = ahead;                                                                           \
        isa_pv(&o, kt);                                                                            \
    }

TYPED_ENTRIES(f16_fast, SDPA_TYPE_F16)
TYPED_ENTRIES(f16_exact, TILE_F16_EXACT)
TYPED_ENTRIES(bf16, SDPA_TYPE_BF16)

static void ISA_NAME(scores_tile_f16)(float *s, size_t ld_s, const float *q, size_t q_stride,
                                      size_t nq, const void *k, size_t k_stride, const void *ahead,
                                      size_t nk, size_t d, float scale) {
    if (vf_widen_f16_ok())
        ISA_NAME(scores_tile_f16_fast)(s, ld_s, q, q_stride, nq, k, k_stride, ahead, nk, d, scale);
    else
        ISA_NAME(scores_tile_f16_exact)(s, ld_s, q, q_stride, nq, k, k_stride, ahead, nk, d, scale);
}

static void ISA_NAME(pv_tile_f16)(float *acc, size_t ld_acc, const float *p, size_t ld_p, size_t nq,
                                  size_t nk, const void *v, size_t v_stride, const void *ahead,
                                  size_t d_v) {
    if (vf_widen_f16_ok())
        ISA_NAME(pv_tile_f16_fast)(acc, ld_acc, p, ld_p, nq, nk, v, v_stride, ahead, d_v);
    else
        ISA_NAME(pv_tile_f16_exact)(acc, ld_acc, p, ld_p, nq, nk, v, v_stride, ahead, d_v);
}

/* kernels.h's scores_tile_fp8 and pv_tile_fp8, for the 8-bit types the backend names
 * (ISA_FP8_LOADS_E4M3, ISA_FP8_LOADS_E5M2): 8-bit rows widened in registers, through the f16
 * conversion the f16 entries would take in the caller's environment (attention_tiles.h,
 * TILE_FP8) */
#define FP8_TILE_ENTRIES(t, kt, no_nan)                                                            \
    TYPED_ENTRIES(t##_fast, kt)                                                                    \
    TYPED_ENTRIES(t##_exact, (kt) | TILE_FP8_EXACT)                                                \
    static void ISA_NAME(scores_tile_##t)(float *s, size_t ld_s, const float *q, size_t q_stride,  \
                                          size_t nq, const void *k, size_t k_stride,               \
                                          const void *ahead, size_t nk, size_t d, float scale) {   \
        if (!vf_widen_f16_ok()) {                                                                  \
            ISA_NAME(scores_tile_##t##_exact)                                                      \
            (s, ld_s, q, q_stride, nq, k, k_stride, ahead, nk, d, scale);                          \
            return;                                                                                \
        }                                                                                          \
        ISA_NAME(scores_tile_##no_nan)                                                             \
        (s, ld_s, q, q_stride, nq, k, k_stride, ahead, nk, d, scale);                              \
        if (fp8_redo(kt, k, k_stride, nk, d)) {                                                    \
            ISA_NAME(scores_tile_##t##_fast)                                                       \
            (s, ld_s, q, q_stride, nq, k, k_stride, ahead, nk, d, scale);                          \
        }                                                                                          \
    }                                                                                              \
    static void ISA_NAME(pv_tile_##t)(float *acc, size_t ld_acc, const float *p, size_t ld_p,      \
                                      size_t nq, size_t nk, const void *v, size_t v_stride,        \
                                      const void *ahead, size_t d_v) {                             \
        if (!vf_widen_f16_ok()) {                                                                  \
            ISA_NAME(pv_tile_##t##_exact)(acc, ld_acc, p, ld_p, nq, nk, v, v_stride, ahead, d_v);  \
            return;                                                                                \
        }                                                                                          \
        float kept[FP8_KEPT_ACC];                                                                  \
        if (!fp8_keep_acc(kt, kept, acc, ld_acc, nq, d_v) &&                                       \
            fp8_redo(kt, v, v_stride, nk, d_v)) { /* too many to keep: NaN looked for first */     \
            ISA_NAME(pv_tile_##t##_fast)(acc, ld_acc, p, ld_p, nq, nk, v, v_stride, ahead, d_v);   \
            return;                                                                                \
        }                                                                                          \
        ISA_NAME(pv_tile_##no_nan)(acc, ld_acc, p, ld_p, nq, nk, v, v_stride, ahead, d_v);         \
        if (fp8_kept(kt, nq, d_v) && fp8_redo(kt, v, v_stride, nk, d_v)) {                         \
            fp8_restore_acc(acc, ld_acc, kept, nq, d_v);                                           \
            ISA_NAME(pv_tile_##t##_fast)(acc, ld_acc, p, ld_p, nq, nk, v, v_stride, ahead, d_v);   \
        }                                                                                          \
    }

/* e4m3 rows are first read without the NaN fix-up (a third of the widening's operations in
 * every load), then looked at for NaN, while they are still in L1, and read again with it where
 * they hold one: looked at before, the rows would come from memory with no work beside the
 * misses. fp8_redo: whether rows of type kt must be read again (e5m2: never, its form has no
 * fix-up to leave out). A P V block of at most FP8_KEPT_ACC sums (decode's) keeps acc to start
 * again from; a larger one is looked at first. */
#define FP8_KEPT_ACC 1024
ALWAYS_INLINE int fp8_redo(int kt, const void *rows, size_t stride, size_t nk, size_t d) {
    return !(kt & TILE_FP8_E5M2) && !e4m3_rows_no_nan(rows, stride, nk, d);
}
ALWAYS_INLINE int fp8_kept(int kt, size_t nq, size_t d_v) {
    return (kt & TILE_FP8_E5M2) || nq * d_v <= FP8_KEPT_ACC;
}
ALWAYS_INLINE int fp8_keep_acc(int kt, float *kept, const float *acc, size_t ld_acc, size_t nq,
                               size_t d_v) {
    if (!fp8_kept(kt, nq, d_v)) return 0;
    if (!(kt & TILE_FP8_E5M2))
        for (size_t i = 0; i < nq; i++)
            memcpy(kept + i * d_v, acc + i * ld_acc, d_v * sizeof(float));
    return 1;
}
ALWAYS_INLINE void fp8_restore_acc(float *acc, size_t ld_acc, const float *kept, size_t nq,
                                   size_t d_v) {
    for (size_t i = 0; i < nq; i++) memcpy(acc + i * ld_acc, kept + i * d_v, d_v * sizeof(float));
}

#ifdef ISA_FP8_LOADS_E4M3
TYPED_ENTRIES(e4m3_no_nan, TILE_FP8 | TILE_FP8_NO_NAN)
FP8_TILE_ENTRIES(e4m3, TILE_FP8, e4m3_no_nan)
#define FP8_E4M3_(entry) ISA_NAME(entry##_e4m3)
#else
#define FP8_E4M3_(entry) NULL
#endif
#ifdef ISA_FP8_LOADS_E5M2
FP8_TILE_ENTRIES(e5m2, TILE_FP8 | TILE_FP8_E5M2, e5m2_fast)
#define FP8_E5M2_(entry) ISA_NAME(entry##_e5m2)
#else
#define FP8_E5M2_(entry) NULL
#endif

#endif

/* pv_tile_t's keys a pass: the rows of v of one pass (16 KiB at d_v = 128) stay in L1 while every
 * block of acc rows runs over them; over all nk keys at once, each block of rows would read v's
 * rows again from L2 (the backward's dQ += dS K: 128 keys of 128 floats, 64 KiB) */
#define PV_T_KEYS 32

static void ISA_NAME(pv_tile_t)(float *acc, size_t ld_acc, const float *p, size_t ld_p, size_t nq,
                                size_t nk, const float *v, size_t v_stride, size_t d_v) {
    for (size_t j = 0; j < nk; j += PV_T_KEYS) {
        const size_t n = nk - j < PV_T_KEYS ? nk - j : PV_T_KEYS;
        const pv_operands o = {acc, ld_acc, p + j * ld_p,     1,        ld_p, NULL,
                               nq,  n,      v + j * v_stride, v_stride, d_v,  NULL};
        isa_pv(&o, SDPA_TYPE_F32);
    }
}

#ifdef SDPA_ARCH_ATTENTION_PACKED_H

static void ISA_NAME(pack_q)(float *qt, size_t ld_qt, const float *q, size_t q_stride, size_t nq,
                             size_t d) {
    pack_q_loops(qt, ld_qt, q, q_stride, nq, d);
}

static void ISA_NAME(scores_packed)(float *s, size_t ld_s, const float *qt, size_t ld_qt, size_t nq,
                                    const float *k, size_t k_stride, size_t nk, size_t d,
                                    float scale) {
    scores_packed_loops(s, ld_s, qt, ld_qt, nq, k, k_stride, nk, d, scale);
}

static void ISA_NAME(scores_max)(float *st, size_t ld_st, float *tile_max, const float *qt,
                                 size_t ld_qt, size_t nq, const float *k, size_t k_stride,
                                 size_t nk, size_t d_k, float scale) {
    scores_max_loops(st, ld_st, tile_max, qt, ld_qt, nq, k, k_stride, nk, d_k, scale);
}

/* kernels.h's exp_pv, one instance per exp kind */
#define EXP_PV_ENTRY(name, kind)                                                                   \
    static void ISA_NAME(name)(float *acc, size_t ld_acc, float *st, size_t ld_st, const float *m, \
                               const float *m_new, float *alpha, float *sums, size_t nq,           \
                               size_t nk, const float *v, size_t v_stride, size_t d_v) {           \
        exp_pv_loops(acc, ld_acc, st, ld_st, m, m_new, alpha, sums, nq, nk, v, v_stride, d_v,      \
                     kind, EXP_PV_KEYS);                                                           \
    }

EXP_PV_ENTRY(exp_pv_fast, SDPA_EXP_FAST)
EXP_PV_ENTRY(exp_pv_sleef, SDPA_EXP_SLEEF)

#ifdef ISA_EXP_TILE
static void ISA_NAME(exp_tile_fast)(float *s, size_t ld_s, size_t nq, size_t nk, const float *shift,
                                    float *sums) {
    exp_tile_loops(s, ld_s, nq, nk, shift, sums, SDPA_EXP_FAST);
}

static void ISA_NAME(exp_tile_sleef)(float *s, size_t ld_s, size_t nq, size_t nk,
                                     const float *shift, float *sums) {
    exp_tile_loops(s, ld_s, nq, nk, shift, sums, SDPA_EXP_SLEEF);
}
#endif

#endif

#ifdef SDPA_ARCH_ATTENTION_KEYMAJOR_STEPS_H

static void ISA_NAME(ds_keymajor)(float *ds, const float *p, size_t ld, size_t nk, size_t nq,
                                  const float *dd, float scale) {
    ds_keymajor_loops(ds, p, ld, nk, nq, dd, scale);
}

/* exp_keymajor's kind, in the faster form that exp_sum takes when the caller rounds to nearest
 * (row_exp_nearest; none where the exps are exp_tile's) */
ALWAYS_INLINE void exp_keymajor_entry(float *st, size_t ld_st, size_t nk, size_t nq,
                                      const float *shift, int kind) {
#ifndef ISA_EXP_TILE
    if (row_exp_nearest(kind) != kind && rounds_to_nearest()) {
        exp_keymajor_loops(st, ld_st, nk, nq, shift, row_exp_nearest(kind));
        return;
    }
#endif
    exp_keymajor_loops(st, ld_st, nk, nq, shift, kind);
}

static void ISA_NAME(exp_keymajor_fast)(float *st, size_t ld_st, size_t nk, size_t nq,
                                        const float *shift) {
    exp_keymajor_entry(st, ld_st, nk, nq, shift, SDPA_EXP_FAST);
}

static void ISA_NAME(exp_keymajor_sleef)(float *st, size_t ld_st, size_t nk, size_t nq,
                                         const float *shift) {
    exp_keymajor_entry(st, ld_st, nk, nq, shift, SDPA_EXP_SLEEF);
}

#endif

const sdpa_attention_kernels ISA_NAME(sdpa_attention_kernels) = {
    .block_q = BLOCK_Q,
    .block_kv = BLOCK_KV,
    .scores_tile = ISA_NAME(scores_tile),
    .pv_tile = ISA_NAME(pv_tile),
    .pv_tile_t = ISA_NAME(pv_tile_t),
#ifdef ISA_TYPED_LOADS
    .scores_tile_typed = {NULL, ISA_NAME(scores_tile_f16), ISA_NAME(scores_tile_bf16)},
    .pv_tile_typed = {NULL, ISA_NAME(pv_tile_f16), ISA_NAME(pv_tile_bf16)},
    .scores_tile_fp8 = {FP8_E4M3_(scores_tile), FP8_E5M2_(scores_tile)},
    .pv_tile_fp8 = {FP8_E4M3_(pv_tile), FP8_E5M2_(pv_tile)},
#endif
#ifdef SDPA_ARCH_ATTENTION_PACKED_H
#ifdef ISA_EXP_TILE
    .exp_tile = {ISA_NAME(exp_tile_fast), ISA_NAME(exp_tile_sleef)},
#endif
    .pack_q = ISA_NAME(pack_q),
    .scores_packed = ISA_NAME(scores_packed),
    .scores_max = ISA_NAME(scores_max),
    .exp_pv = {ISA_NAME(exp_pv_fast), ISA_NAME(exp_pv_sleef)},
    .scores_keymajor = ISA_NAME(scores_keymajor),
#endif
#ifdef SDPA_ARCH_ATTENTION_KEYMAJOR_STEPS_H
    .exp_keymajor = {ISA_NAME(exp_keymajor_fast), ISA_NAME(exp_keymajor_sleef)},
    .ds_keymajor = ISA_NAME(ds_keymajor),
#endif
};

#endif
