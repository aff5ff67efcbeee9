/* Attention's arguments: the problem a call or a descriptor states, its checks, and the
 * descriptor helpers. */
#include "attention_problem.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "error.h"
#include "kernels.h"
#include "sizes.h"

/* desc's caller compiled a header that has `field` (struct_size says how much of the struct it
 * knows); the v1 struct ends with mask_stride */
#define DESC_HAS(desc, field)                                                                      \
    ((desc)->struct_size >= offsetof(sdpa_mha_desc, field) + sizeof((desc)->field))

/* The descriptor up to its lse group, which sdpa_mha_desc_dense and _bshd fill */
#define DESC_V2_SIZE (offsetof(sdpa_mha_desc, lse_stride) + 2 * sizeof(size_t))

/* The rows of the output view never share a float: sorted by stride, each axis of more than one
 * entry (and the row itself) steps past everything the axes inside it span. Otherwise two rows
 * would write the same place, and a batch of any size with a stride of 0 would be accepted and
 * computed in full. Layouts that interleave axes without sharing a float are rejected too; no
 * tensor library makes one. */
static int view_is_disjoint(const size_t stride[3], const size_t dims[3], size_t row) {
    size_t axis_stride[3], axis_len[3], n = 0;
    for (int i = 0; i < 3; i++) {
        if (dims[i] < 2) continue;
        size_t j = n++;
        for (; j > 0 && axis_stride[j - 1] > stride[i]; j--) {
            axis_stride[j] = axis_stride[j - 1];
            axis_len[j] = axis_len[j - 1];
        }
        axis_stride[j] = stride[i];
        axis_len[j] = dims[i];
    }
    size_t span = row; /* floats spanned by the axes inside the current one; fits (checked) */
    for (size_t i = 0; i < n; i++) {
        if (axis_stride[i] < span) return 0;
        span += (axis_len[i] - 1) * axis_stride[i];
    }
    return 1;
}

/* The bytes from a view's first element to one past its last. Only for views whose extent was
 * checked to fit. */
typedef struct extent {
    const char *name;
    uintptr_t lo, hi;
} extent;

/* a view with elements (d0, d1, d2, row >= 1) */
static inline extent span(const char *name, const void *base, const size_t stride[3], size_t d0,
                          size_t d1, size_t d2, size_t row, size_t size) {
    const size_t end = (d0 - 1) * stride[0] + (d1 - 1) * stride[1] + (d2 - 1) * stride[2] + row;
    const extent e = {name, (uintptr_t)base, (uintptr_t)base + end * size};
    return e;
}

/* any view: empty (meeting nothing) without a base or elements */
static extent extent_of(const char *name, const void *base, const size_t stride[3], size_t d0,
                        size_t d1, size_t d2, size_t row, size_t size) {
    const extent none = {name, 0, 0};
    return base && d0 && d1 && d2 && row ? span(name, base, stride, d0, d1, d2, row, size) : none;
}

static int meet(extent a, extent b) { return a.lo < b.hi && b.lo < a.hi; }

/* The one overlap rule of the forward and the backward: no view a call writes meets another it
 * writes or one it reads, by extent (first to last element), so interleaved layouts, such as
 * out inside a packed qkv tensor, are rejected too. */
static sdpa_status check_overlaps(const extent *written, int n_written, const extent *read,
                                  int n_read) {
    for (int w = 0; w < n_written; w++) {
        for (int o = w + 1; o < n_written; o++)
            if (meet(written[w], written[o]))
                return sdpa_fail(SDPA_ERR_SIZE, "%s overlaps %s", written[w].name, written[o].name);
        for (int r = 0; r < n_read; r++)
            if (meet(written[w], read[r]))
                return sdpa_fail(SDPA_ERR_SIZE, "%s overlaps %s", written[w].name, read[r].name);
    }
    return SDPA_OK;
}

const char *const SDPA_TYPE_NAMES[SDPA_FP8_E5M2 + 1] = {"f32", "f16", "bf16", "fp8_e4m3",
                                                        "fp8_e5m2"};

/* the pointers a call with output rows needs */
static sdpa_status check_pointers(const attention_problem *p, int reads_inputs) {
    const char *missing = !p->out         ? "out"
                          : !reads_inputs ? NULL
                          : !p->q         ? "q"
                          : !p->k         ? "k"
                          : !p->v         ? "v"
                                          : NULL;
    if (!missing) return SDPA_OK;
    return sdpa_fail(SDPA_ERR_NULL, "%s is NULL with batch %zu, heads_q %zu, len_q %zu, len_kv %zu",
                     missing, p->batch, p->heads_q, p->len_q, p->len_kv);
}

/* the row strides and extents of q, k, v and the mask, read by a call with rows and keys */
static sdpa_status check_inputs(const attention_problem *p) {
    const size_t q_size = sdpa_type_size(p->q_type), kv_size = sdpa_type_size(p->kv_type);
    if (p->len_q > 1 && p->q_stride[2] < p->d_k)
        return sdpa_fail(SDPA_ERR_SIZE, "q's row stride (%zu) is smaller than d_k (%zu)",
                         p->q_stride[2], p->d_k);
    if (p->len_kv > 1 && p->k_stride[2] < p->d_k)
        return sdpa_fail(SDPA_ERR_SIZE, "k's row stride (%zu) is smaller than d_k (%zu)",
                         p->k_stride[2], p->d_k);
    if (p->len_kv > 1 && p->v_stride[2] < p->d_v)
        return sdpa_fail(SDPA_ERR_SIZE, "v's row stride (%zu) is smaller than d_v (%zu)",
                         p->v_stride[2], p->d_v);
    const char *big =
        !sdpa_view_fits_sized(p->q_stride, p->batch, p->heads_q, p->len_q, p->d_k, q_size) ? "q"
        : !sdpa_view_fits_sized(p->k_stride, p->batch, p->heads_kv, p->len_kv, p->d_k, kv_size)
            ? "k"
        : !sdpa_view_fits_sized(p->v_stride, p->batch, p->heads_kv, p->len_kv, p->d_v, kv_size)
            ? "v"
        : p->mask && !sdpa_view_fits(p->mask_stride, p->batch, p->heads_q, p->len_q, p->len_kv)
            ? "mask"
            : NULL;
    if (big) return sdpa_fail(SDPA_ERR_SIZE, "%s's extent is past PTRDIFF_MAX bytes", big);
    return SDPA_OK;
}

static sdpa_status check(const attention_problem *p, uint32_t flags) {
    int has_out = p->batch && p->heads_q && p->len_q;
    int reads_inputs = has_out && p->len_kv;
    sdpa_status st = has_out ? check_pointers(p, reads_inputs) : SDPA_OK;
    if (st != SDPA_OK) return st;
    if (flags & ~SDPA_CAUSAL)
        return sdpa_fail(SDPA_ERR_ARG, "flags (0x%x) hold unknown bits (0x%x)", (unsigned)flags,
                         (unsigned)(flags & ~SDPA_CAUSAL));
    if (!isfinite(p->scale))
        return sdpa_fail(SDPA_ERR_ARG, "scale (%g) is not finite", (double)p->scale);
    if (p->heads_kv == 0) return sdpa_fail(SDPA_ERR_SIZE, "heads_kv is 0");
    if (p->heads_q % p->heads_kv)
        return sdpa_fail(SDPA_ERR_SIZE, "heads_q (%zu) is not a multiple of heads_kv (%zu)",
                         p->heads_q, p->heads_kv);
    const size_t q_size = sdpa_type_size(p->q_type), kv_size = sdpa_type_size(p->kv_type);
    const size_t out_size = sdpa_type_size(p->out_type);
    /* whether or not there is work: the limit belongs to the types, not to the shape */
    if ((q_size < 4 || kv_size < 4 || out_size < 4) &&
        (p->d_k > SDPA_WIDE_FLOATS || p->d_v > SDPA_WIDE_FLOATS))
        return sdpa_fail(
            SDPA_ERR_SIZE,
            "%s (%zu) is above %d, the largest with a view narrower than f32 (q %s, k and v "
            "%s, out %s)",
            p->d_k > SDPA_WIDE_FLOATS ? "d_k" : "d_v", p->d_k > SDPA_WIDE_FLOATS ? p->d_k : p->d_v,
            SDPA_WIDE_FLOATS, SDPA_TYPE_NAMES[p->q_type], SDPA_TYPE_NAMES[p->kv_type],
            SDPA_TYPE_NAMES[p->out_type]);
    if (!has_out) return SDPA_OK;
    if (!p->d_k || !p->d_v)
        return sdpa_fail(SDPA_ERR_SIZE, "%s is 0 with output rows", p->d_k ? "d_v" : "d_k");
    if (p->len_q > 1 && p->out_stride[2] < p->d_v)
        return sdpa_fail(SDPA_ERR_SIZE, "out's row stride (%zu) is smaller than d_v (%zu)",
                         p->out_stride[2], p->d_v);
    if (!sdpa_view_fits_sized(p->out_stride, p->batch, p->heads_q, p->len_q, p->d_v, out_size))
        return sdpa_fail(SDPA_ERR_SIZE, "out's extent is past PTRDIFF_MAX bytes");
    const size_t out_dims[3] = {p->batch, p->heads_q, p->len_q};
    if (!view_is_disjoint(p->out_stride, out_dims, p->d_v))
        return sdpa_fail(SDPA_ERR_SIZE,
                         "out's rows share elements (strides %zu, %zu, %zu over batch %zu, "
                         "heads_q %zu, len_q %zu, rows of %zu)",
                         p->out_stride[0], p->out_stride[1], p->out_stride[2], p->batch, p->heads_q,
                         p->len_q, p->d_v);
    return reads_inputs ? check_inputs(p) : SDPA_OK;
}

/* the lse view, [batch][heads_q] rows of len_q contiguous floats, written whenever out is */
static sdpa_status check_lse(const attention_problem *p) {
    if (!p->lse || !sdpa_problem_has_rows(p)) return SDPA_OK;
    const size_t stride[3] = {p->lse_stride[0], p->lse_stride[1], 1};
    const size_t dims[3] = {p->batch, p->heads_q, 1};
    if (!sdpa_view_fits(stride, p->batch, p->heads_q, 1, p->len_q))
        return sdpa_fail(SDPA_ERR_SIZE, "lse's extent is past PTRDIFF_MAX bytes");
    if (!view_is_disjoint(stride, dims, p->len_q))
        return sdpa_fail(SDPA_ERR_SIZE,
                         "lse's rows share elements (strides %zu, %zu over batch %zu, heads_q "
                         "%zu, rows of len_q %zu)",
                         p->lse_stride[0], p->lse_stride[1], p->batch, p->heads_q, p->len_q);
    return SDPA_OK;
}

/* The views of a checked forward problem with output rows: those a call reads (q, k, v and the
 * mask, with keys) to read[], those it writes (out, and lse if given) to written[]; returns how
 * many it read, *n_written the others. Views with no element are left out. */
static int forward_extents(const attention_problem *p, extent read[4], extent written[2],
                           int *n_written) {
    const size_t b = p->batch, hq = p->heads_q, hk = p->heads_kv, nq = p->len_q, nk = p->len_kv;
    written[0] = span("out", p->out, p->out_stride, b, hq, nq, p->d_v, sdpa_type_size(p->out_type));
    *n_written = 1;
    if (p->lse) {
        const size_t lse_stride[3] = {p->lse_stride[0], p->lse_stride[1], 1};
        written[(*n_written)++] = span("lse", p->lse, lse_stride, b, hq, 1, nq, sizeof(float));
    }
    if (!nk) return 0;
    const size_t q_size = sdpa_type_size(p->q_type), kv_size = sdpa_type_size(p->kv_type);
    read[0] = span("q", p->q, p->q_stride, b, hq, nq, p->d_k, q_size);
    read[1] = span("k", p->k, p->k_stride, b, hk, nk, p->d_k, kv_size);
    read[2] = span("v", p->v, p->v_stride, b, hk, nk, p->d_v, kv_size);
    if (!p->mask) return 3;
    read[3] = span("mask", p->mask, p->mask_stride, b, hq, nq, nk, sizeof(float));
    return 4;
}

sdpa_status sdpa_problem_check(attention_problem *p, uint32_t flags) {
    sdpa_status st = check(p, flags);
    if (st == SDPA_OK) st = check_lse(p);
    if (st != SDPA_OK) return st;
    if (sdpa_problem_has_rows(p)) {
        extent read[4], written[2];
        int n_written;
        const int n_read = forward_extents(p, read, written, &n_written);
        st = check_overlaps(written, n_written, read, n_read);
        if (st != SDPA_OK) return st;
    }
    if (p->scale == SDPA_DEFAULT_SCALE && p->d_k) p->scale = (float)(1.0 / sqrt((double)p->d_k));
    /* an 8-bit K stands for k_scale times its values: folded into the scores' scale once; the
       kernels read e4m3 at 2^-8 (arch/kernels.h), put back here too */
    const float undo = p->kv_type == SDPA_FP8_E4M3 ? (float)(1 << SDPA_FP8_E4M3_F16_SHIFT) : 1.0f;
    const float scale = p->scale * (p->k_scale != 0.0f ? p->k_scale : 1.0f) * undo;
    const float v_scale =
        undo != 1.0f ? (p->v_scale != 0.0f ? p->v_scale : 1.0f) * undo : p->v_scale;
    if (!isfinite(scale) || !isfinite(v_scale))
        return sdpa_fail(SDPA_ERR_ARG,
                         "%s overflows float times the scale of the 8-bit values (scale %g, "
                         "k_scale %g, v_scale %g)",
                         isfinite(scale) ? "v_scale" : "k_scale", (double)p->scale,
                         (double)p->k_scale, (double)p->v_scale);
    p->scale = scale, p->v_scale = v_scale;
    p->causal = (flags & SDPA_CAUSAL) != 0;
    return SDPA_OK;
}

/* ---- the backward ---- */

/* the whole sdpa_mha_grads of the first release */
#define GRADS_V1_SIZE (offsetof(sdpa_mha_grads, dout_stride) + 3 * sizeof(size_t))

/* A gradient view of d0 x d1 x d2 rows: its row stride, its extent, and rows that share a float
 * only through a batch or head stride of 0 (an axis the gradient is summed over). */
static sdpa_status grad_view(const char *name, const size_t stride[3], size_t d0, size_t d1,
                             size_t d2, size_t row) {
    if (d2 > 1 && stride[2] < row)
        return sdpa_fail(SDPA_ERR_SIZE, "%s's row stride (%zu) is smaller than its row (%zu)", name,
                         stride[2], row);
    if (!sdpa_view_fits(stride, d0, d1, d2, row))
        return sdpa_fail(SDPA_ERR_SIZE, "%s's extent is past PTRDIFF_MAX bytes", name);
    const size_t dims[3] = {stride[0] ? d0 : 1, stride[1] ? d1 : 1, d2};
    if (!view_is_disjoint(stride, dims, row))
        return sdpa_fail(SDPA_ERR_SIZE,
                         "%s's rows share elements other than through a batch or head stride of "
                         "0 (strides %zu, %zu, %zu)",
                         name, stride[0], stride[1], stride[2]);
    return SDPA_OK;
}

/* grads' pointers and views, against the forward's problem p (checked) */
static sdpa_status check_grads(const backward_problem *bp, int rows, int keys) {
    const attention_problem *p = &bp->fwd;
    const size_t b = p->batch, hq = p->heads_q, hk = p->heads_kv;
    if (keys && (!p->d_k || !p->d_v))
        return sdpa_fail(SDPA_ERR_SIZE, "%s is 0 with keys", p->d_k ? "d_v" : "d_k");
    sdpa_status st = SDPA_OK;
    if (rows && p->len_q > 1 && bp->dout_stride[2] < p->d_v)
        return sdpa_fail(SDPA_ERR_SIZE, "dout's row stride (%zu) is smaller than d_v (%zu)",
                         bp->dout_stride[2], p->d_v);
    if (rows && !sdpa_view_fits(bp->dout_stride, b, hq, p->len_q, p->d_v))
        return sdpa_fail(SDPA_ERR_SIZE, "dout's extent is past PTRDIFF_MAX bytes");
    if (rows) st = grad_view("dq", bp->dq_stride, b, hq, p->len_q, p->d_k);
    if (keys && st == SDPA_OK) st = grad_view("dk", bp->dk_stride, b, hk, p->len_kv, p->d_k);
    if (keys && st == SDPA_OK) st = grad_view("dv", bp->dv_stride, b, hk, p->len_kv, p->d_v);
    return st;
}

sdpa_status sdpa_backward_problem(backward_problem *bp, const sdpa_mha_desc *desc,
                                  const sdpa_mha_grads *grads, const float *q, const float *k,
                                  const float *v, const float *out) {
    attention_problem *p = &bp->fwd;
    sdpa_status st = sdpa_problem_from_desc(p, desc, (void *)(uintptr_t)out, q, k, v, 0);
    if (st != SDPA_OK) return st;
    if (!grads) return sdpa_fail(SDPA_ERR_NULL, "grads is NULL");
    if (grads->struct_size < GRADS_V1_SIZE)
        return sdpa_fail(SDPA_ERR_ARG,
                         "grads->struct_size (%u) is smaller than sdpa_mha_grads (%zu)",
                         (unsigned)grads->struct_size, (size_t)GRADS_V1_SIZE);
    const size_t grads_v2 = offsetof(sdpa_mha_grads, dsinks) + sizeof(float *);
    if (grads->struct_size > GRADS_V1_SIZE && grads->struct_size < grads_v2)
        return sdpa_fail(SDPA_ERR_ARG,
                         "grads->struct_size (%u) ends inside its v2 group (dsinks, %zu bytes)",
                         (unsigned)grads->struct_size, grads_v2);
    if (grads->reserved) return sdpa_fail(SDPA_ERR_ARG, "grads->reserved is not 0");
    if (!DESC_HAS(desc, lse_stride))
        return sdpa_fail(SDPA_ERR_ARG,
                         "desc->struct_size (%u) has no lse: the backward needs "
                         "the v2 descriptor",
                         (unsigned)desc->struct_size);
    bp->dq = grads->dq;
    bp->dk = grads->dk;
    bp->dv = grads->dv;
    bp->dout = grads->dout;
    bp->dsinks = grads->struct_size >= grads_v2 && p->mods.sinks ? grads->dsinks : NULL;
    for (int i = 0; i < 3; i++) {
        bp->dq_stride[i] = grads->dq_stride[i];
        bp->dk_stride[i] = grads->dk_stride[i];
        bp->dv_stride[i] = grads->dv_stride[i];
        bp->dout_stride[i] = grads->dout_stride[i];
    }
    const size_t b = p->batch, hq = p->heads_q, hk = p->heads_kv;
    const int rows = sdpa_problem_has_rows(p), keys = b && hq && p->len_kv;
    const char *missing = !rows       ? NULL
                          : !p->lse   ? "desc->lse"
                          : !bp->dout ? "grads->dout"
                          : !bp->dq   ? "grads->dq"
                                      : NULL;
    if (!missing && keys) missing = !bp->dk ? "grads->dk" : !bp->dv ? "grads->dv" : NULL;
    if (missing) return sdpa_fail(SDPA_ERR_NULL, "%s is NULL", missing);
    st = check(p, desc->flags);
    if (st == SDPA_OK) st = check_lse(p);
    if (st == SDPA_OK) st = check_grads(bp, rows, keys);
    if (st != SDPA_OK) return st;
    /* what is written, against everything else: the views below all fit (checked above) */
    const size_t nq = rows ? p->len_q : 0, nk = keys ? p->len_kv : 0;
    const extent written[3] = {
        extent_of("dq", bp->dq, bp->dq_stride, b, hq, nq, p->d_k, sizeof(float)),
        extent_of("dk", bp->dk, bp->dk_stride, b, hk, nk, p->d_k, sizeof(float)),
        extent_of("dv", bp->dv, bp->dv_stride, b, hk, nk, p->d_v, sizeof(float)),
    };
    /* the forward's views, all read here: out and lse after q, k, v and the mask */
    extent read[7], forward_written[2];
    int n_read = 0, n_forward_written = 0;
    if (rows) n_read = forward_extents(p, read, forward_written, &n_forward_written);
    for (int i = 0; i < n_forward_written; i++) read[n_read++] = forward_written[i];
    read[n_read++] = extent_of("dout", bp->dout, bp->dout_stride, b, hq, nq, p->d_v, sizeof(float));
    st = check_overlaps(written, 3, read, n_read);
    return st != SDPA_OK ? st : sdpa_problem_check(p, desc->flags);
}

void sdpa_problem_single(attention_problem *p, void *out, const float *q, const float *k,
                         const float *v, size_t len_q, size_t len_kv, size_t d_k, size_t d_v,
                         float scale) {
    *p = (attention_problem){.batch = 1,
                             .heads_q = 1,
                             .heads_kv = 1,
                             .len_q = len_q,
                             .len_kv = len_kv,
                             .d_k = d_k,
                             .d_v = d_v,
                             .scale = scale,
                             .q = q,
                             .k = k,
                             .v = v,
                             .out = out,
                             .q_stride = {0, 0, d_k},
                             .k_stride = {0, 0, d_k},
                             .v_stride = {0, 0, d_v},
                             .out_stride = {0, 0, d_v}};
}

/* The descriptor's struct_size: at least the v1 struct, and not ending inside one of the groups
 * v2 added (the types, q_type to reserved; the lse, lse and lse_stride) or v3's (mods to
 * v_scale), each read whole. */
static sdpa_status desc_size_check(uint32_t size) {
    const size_t v1 = offsetof(sdpa_mha_desc, q_type), types = offsetof(sdpa_mha_desc, lse);
    const size_t v2 = offsetof(sdpa_mha_desc, lse_stride) + 2 * sizeof(size_t);
    const size_t v3 = offsetof(sdpa_mha_desc, v_scale) + sizeof(float);
    if (size < v1)
        return sdpa_fail(SDPA_ERR_ARG,
                         "desc->struct_size (%u) is smaller than the v1 "
                         "sdpa_mha_desc (%zu)",
                         (unsigned)size, v1);
    if ((size > v1 && size < types) || (size > types && size < v2) || (size > v2 && size < v3))
        return sdpa_fail(SDPA_ERR_ARG,
                         "desc->struct_size (%u) ends inside a group of fields "
                         "(v1 %zu, with types %zu, with lse %zu, with mods %zu bytes)",
                         (unsigned)size, v1, types, v2, v3);
    return SDPA_OK;
}

/* the element types (sdpa_mha: any sdpa_dtype; sdpa_mha_f32 and the backward: f32) */
static sdpa_status desc_types_check(const sdpa_mha_desc *desc, int typed) {
    const uint32_t most = typed ? SDPA_BF16 : SDPA_F32, most_kv = typed ? SDPA_FP8_E5M2 : SDPA_F32;
    const char *field = desc->q_type > most       ? "q_type"
                        : desc->kv_type > most_kv ? "kv_type"
                        : desc->out_type > most   ? "out_type"
                                                  : NULL;
    if (field) {
        const uint32_t t = field[0] == 'q'   ? desc->q_type
                           : field[0] == 'k' ? desc->kv_type
                                             : desc->out_type;
        return sdpa_fail(SDPA_ERR_ARG, "desc->%s (%u) is %s", field, (unsigned)t,
                         t > SDPA_FP8_E5M2 ? "not an sdpa_dtype (0 to 4)"
                         : t > SDPA_BF16   ? "an 8-bit type, which only k and v take"
                                           : "not SDPA_F32, the only type of this entry point");
    }
    if (desc->reserved)
        return sdpa_fail(SDPA_ERR_ARG, "desc->reserved (%u) is not 0", (unsigned)desc->reserved);
    return SDPA_OK;
}

sdpa_status sdpa_problem_from_desc(attention_problem *p, const sdpa_mha_desc *desc, void *out,
                                   const void *q, const void *k, const void *v, int typed) {
    if (!desc) return sdpa_fail(SDPA_ERR_NULL, "desc is NULL");
    sdpa_status st = desc_size_check(desc->struct_size);
    if (st != SDPA_OK) return st;
    memset(p, 0, sizeof *p);
    p->batch = desc->batch;
    p->heads_q = desc->heads_q;
    p->heads_kv = desc->heads_kv;
    p->len_q = desc->len_q;
    p->len_kv = desc->len_kv;
    p->d_k = desc->d_k;
    p->d_v = desc->d_v;
    p->scale = desc->scale;
    p->q = q;
    p->k = k;
    p->v = v;
    p->out = out;
    p->mask = desc->mask;
    for (int i = 0; i < 3; i++) {
        p->q_stride[i] = desc->q_stride[i];
        p->k_stride[i] = desc->k_stride[i];
        p->v_stride[i] = desc->v_stride[i];
        p->out_stride[i] = desc->out_stride[i];
        p->mask_stride[i] = desc->mask_stride[i];
    }
    if (DESC_HAS(desc, reserved)) {
        st = desc_types_check(desc, typed);
        if (st != SDPA_OK) return st;
        p->q_type = desc->q_type;
        p->kv_type = desc->kv_type;
        p->out_type = desc->out_type;
    }
    if (DESC_HAS(desc, lse_stride)) {
        p->lse = desc->lse;
        p->lse_stride[0] = desc->lse_stride[0];
        p->lse_stride[1] = desc->lse_stride[1];
    }
    if (DESC_HAS(desc, v_scale) && p->kv_type > SDPA_BF16) {
        st = sdpa_problem_set_scales(p, desc->k_scale, desc->v_scale);
        if (st != SDPA_OK) return st;
    }
    if (DESC_HAS(desc, v_scale) && desc->mods) return sdpa_problem_set_mods(p, desc->mods);
    return SDPA_OK;
}

sdpa_status sdpa_problem_set_scales(attention_problem *p, float k_scale, float v_scale) {
    if (!isfinite(k_scale) || !isfinite(v_scale))
        return sdpa_fail(SDPA_ERR_ARG, "%s (%g) is not finite",
                         isfinite(k_scale) ? "v_scale" : "k_scale",
                         (double)(isfinite(k_scale) ? v_scale : k_scale));
    p->k_scale = k_scale;
    p->v_scale = v_scale;
    return SDPA_OK;
}

/* The strides of a [d0][d1][d2][row] tensor, or its [d0][d2][d1][row] transpose (bshd). Sizes
 * whose products overflow give strides that sdpa_mha_f32's extent check rejects. */
static void set_strides(size_t stride[3], size_t heads, size_t len, size_t row, int bshd) {
    int ok = 1;
    size_t plane = sdpa_mul_add(heads, sdpa_mul_add(len, row, 0, &ok), 0, &ok);
    size_t head_row = sdpa_mul_add(heads, row, 0, &ok), len_row = sdpa_mul_add(len, row, 0, &ok);
    stride[0] = plane;
    stride[1] = bshd ? row : len_row;
    stride[2] = bshd ? head_row : row;
    if (!ok) stride[0] = stride[1] = stride[2] = SIZE_MAX;
}

/* A descriptor of dense tensors in the BHSD layout, or BSHD (bshd), with no mask or lse. */
static sdpa_status desc_layout(sdpa_mha_desc *desc, size_t batch, size_t heads_q, size_t heads_kv,
                               size_t len_q, size_t len_kv, size_t d_k, size_t d_v, float scale,
                               uint32_t flags, int bshd) {
    if (!desc) return sdpa_fail(SDPA_ERR_NULL, "desc is NULL");
    /* the v2 descriptor: a caller compiled before v3 has no room for more */
    memset(desc, 0, DESC_V2_SIZE);
    desc->struct_size = (uint32_t)DESC_V2_SIZE;
    desc->flags = flags;
    desc->batch = batch;
    desc->heads_q = heads_q;
    desc->heads_kv = heads_kv;
    desc->len_q = len_q;
    desc->len_kv = len_kv;
    desc->d_k = d_k;
    desc->d_v = d_v;
    desc->scale = scale;
    set_strides(desc->q_stride, heads_q, len_q, d_k, bshd);
    set_strides(desc->k_stride, heads_kv, len_kv, d_k, bshd);
    set_strides(desc->v_stride, heads_kv, len_kv, d_v, bshd);
    set_strides(desc->out_stride, heads_q, len_q, d_v, bshd);
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_mha_desc_dense(sdpa_mha_desc *desc, size_t batch, size_t heads_q,
                                         size_t heads_kv, size_t len_q, size_t len_kv, size_t d_k,
                                         size_t d_v, float scale, uint32_t flags) {
    return desc_layout(desc, batch, heads_q, heads_kv, len_q, len_kv, d_k, d_v, scale, flags, 0);
}

SDPA_API sdpa_status sdpa_mha_desc_bshd(sdpa_mha_desc *desc, size_t batch, size_t heads_q,
                                        size_t heads_kv, size_t len_q, size_t len_kv, size_t d_k,
                                        size_t d_v, float scale, uint32_t flags) {
    return desc_layout(desc, batch, heads_q, heads_kv, len_q, len_kv, d_k, d_v, scale, flags, 1);
}

SDPA_API sdpa_status sdpa_mha_desc_set_mask(sdpa_mha_desc *desc, const float *mask,
                                            size_t stride_batch, size_t stride_head,
                                            size_t stride_row) {
    if (!desc) return sdpa_fail(SDPA_ERR_NULL, "desc is NULL");
    desc->mask = mask;
    desc->mask_stride[0] = stride_batch;
    desc->mask_stride[1] = stride_head;
    desc->mask_stride[2] = stride_row;
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_mha_desc_set_mods(sdpa_mha_desc *desc, const sdpa_score_mods *mods) {
    if (!desc) return sdpa_fail(SDPA_ERR_NULL, "desc is NULL");
    if (!DESC_HAS(desc, v_scale)) {
        desc->k_scale = desc->v_scale = 0.0f;
        desc->struct_size = (uint32_t)sizeof *desc;
    }
    desc->mods = mods;
    return SDPA_OK;
}
