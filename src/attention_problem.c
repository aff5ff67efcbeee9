/* Attention's arguments: the problem a call or a descriptor states, its checks, and the
 * descriptor helpers. */
#include "attention_problem.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "sizes.h"

/* desc's caller compiled a header that has `field` (struct_size says how much of the struct it
 * knows); the v1 struct ends with mask_stride */
#define DESC_HAS(desc, field)                                                                      \
    ((desc)->struct_size >= offsetof(sdpa_mha_desc, field) + sizeof((desc)->field))

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

static sdpa_status check(const attention_problem *p, uint32_t flags) {
    int has_out = p->batch && p->heads_q && p->len_q;
    int reads_inputs = has_out && p->len_kv;
    if (has_out && !p->out) return SDPA_ERR_NULL;
    if (reads_inputs && (!p->q || !p->k || !p->v)) return SDPA_ERR_NULL;
    if (flags & ~SDPA_CAUSAL) return SDPA_ERR_ARG;
    if (!isfinite(p->scale)) return SDPA_ERR_ARG;
    if (p->heads_kv == 0 || p->heads_q % p->heads_kv) return SDPA_ERR_SIZE;
    if (!has_out) return SDPA_OK;
    if (!p->d_k || !p->d_v) return SDPA_ERR_SIZE;
    if (p->len_q > 1 && p->out_stride[2] < p->d_v) return SDPA_ERR_SIZE;
    const size_t q_size = sdpa_type_size(p->q_type), kv_size = sdpa_type_size(p->kv_type);
    const size_t out_size = sdpa_type_size(p->out_type);
    if ((q_size < 4 || kv_size < 4 || out_size < 4) &&
        (p->d_k > SDPA_WIDE_FLOATS || p->d_v > SDPA_WIDE_FLOATS))
        return SDPA_ERR_SIZE;
    if (!sdpa_view_fits_sized(p->out_stride, p->batch, p->heads_q, p->len_q, p->d_v, out_size))
        return SDPA_ERR_SIZE;
    const size_t out_dims[3] = {p->batch, p->heads_q, p->len_q};
    if (!view_is_disjoint(p->out_stride, out_dims, p->d_v)) return SDPA_ERR_SIZE;
    if (!reads_inputs) return SDPA_OK;
    if ((p->len_q > 1 && p->q_stride[2] < p->d_k) || (p->len_kv > 1 && p->k_stride[2] < p->d_k) ||
        (p->len_kv > 1 && p->v_stride[2] < p->d_v))
        return SDPA_ERR_SIZE;
    if (!sdpa_view_fits_sized(p->q_stride, p->batch, p->heads_q, p->len_q, p->d_k, q_size) ||
        !sdpa_view_fits_sized(p->k_stride, p->batch, p->heads_kv, p->len_kv, p->d_k, kv_size) ||
        !sdpa_view_fits_sized(p->v_stride, p->batch, p->heads_kv, p->len_kv, p->d_v, kv_size))
        return SDPA_ERR_SIZE;
    if (p->mask && !sdpa_view_fits(p->mask_stride, p->batch, p->heads_q, p->len_q, p->len_kv))
        return SDPA_ERR_SIZE;
    return SDPA_OK;
}

/* the lse view, [batch][heads_q] rows of len_q contiguous floats, written whenever out is */
static sdpa_status check_lse(const attention_problem *p) {
    if (!p->lse || !sdpa_problem_has_rows(p)) return SDPA_OK;
    const size_t stride[3] = {p->lse_stride[0], p->lse_stride[1], 1};
    const size_t dims[3] = {p->batch, p->heads_q, 1};
    if (!sdpa_view_fits(stride, p->batch, p->heads_q, 1, p->len_q) ||
        !view_is_disjoint(stride, dims, p->len_q))
        return SDPA_ERR_SIZE;
    return SDPA_OK;
}

sdpa_status sdpa_problem_check(attention_problem *p, uint32_t flags) {
    sdpa_status st = check(p, flags);
    if (st == SDPA_OK) st = check_lse(p);
    if (st != SDPA_OK) return st;
    if (p->scale == SDPA_DEFAULT_SCALE && p->d_k) p->scale = (float)(1.0 / sqrt((double)p->d_k));
    p->causal = (flags & SDPA_CAUSAL) != 0;
    return SDPA_OK;
}

/* ---- the backward ---- */

/* the whole sdpa_mha_grads of the first release */
#define GRADS_V1_SIZE (offsetof(sdpa_mha_grads, dout_stride) + 3 * sizeof(size_t))

/* A gradient view of d0 x d1 x d2 rows: its row stride, its extent, and rows that share a float
 * only through a batch or head stride of 0 (an axis the gradient is summed over). */
static int grad_view_ok(const size_t stride[3], size_t d0, size_t d1, size_t d2, size_t row) {
    if (d2 > 1 && stride[2] < row) return 0;
    if (!sdpa_view_fits(stride, d0, d1, d2, row)) return 0;
    const size_t dims[3] = {stride[0] ? d0 : 1, stride[1] ? d1 : 1, d2};
    return view_is_disjoint(stride, dims, row);
}

/* The bytes from a view's first element to one past its last (empty for no rows). Only called
 * on views whose extent was checked to fit. */
typedef struct extent {
    uintptr_t lo, hi;
} extent;

static extent extent_of(const void *base, const size_t stride[3], size_t d0, size_t d1, size_t d2,
                        size_t row) {
    extent e = {0, 0};
    if (!base || !d0 || !d1 || !d2 || !row) return e;
    const size_t end = (d0 - 1) * stride[0] + (d1 - 1) * stride[1] + (d2 - 1) * stride[2] + row;
    e.lo = (uintptr_t)base;
    e.hi = e.lo + end * sizeof(float);
    return e;
}

static int meet(extent a, extent b) { return a.lo < b.hi && b.lo < a.hi; }

sdpa_status sdpa_backward_problem(backward_problem *bp, const sdpa_mha_desc *desc,
                                  const sdpa_mha_grads *grads, const float *q, const float *k,
                                  const float *v, const float *out) {
    attention_problem *p = &bp->fwd;
    sdpa_status st = sdpa_problem_from_desc(p, desc, (void *)(uintptr_t)out, q, k, v, 0);
    if (st != SDPA_OK) return st;
    if (!grads) return SDPA_ERR_NULL;
    if (grads->struct_size < GRADS_V1_SIZE || grads->reserved || !DESC_HAS(desc, lse_stride))
        return SDPA_ERR_ARG;
    bp->dq = grads->dq;
    bp->dk = grads->dk;
    bp->dv = grads->dv;
    bp->dout = grads->dout;
    for (int i = 0; i < 3; i++) {
        bp->dq_stride[i] = grads->dq_stride[i];
        bp->dk_stride[i] = grads->dk_stride[i];
        bp->dv_stride[i] = grads->dv_stride[i];
        bp->dout_stride[i] = grads->dout_stride[i];
    }
    const size_t b = p->batch, hq = p->heads_q, hk = p->heads_kv;
    const int rows = sdpa_problem_has_rows(p), keys = b && hq && p->len_kv;
    if (rows && (!p->lse || !bp->dout || !bp->dq)) return SDPA_ERR_NULL;
    if (keys && (!bp->dk || !bp->dv)) return SDPA_ERR_NULL;
    st = check(p, desc->flags);
    if (st == SDPA_OK) st = check_lse(p);
    if (st != SDPA_OK) return st;
    if (keys && (!p->d_k || !p->d_v)) return SDPA_ERR_SIZE;
    if (rows && ((p->len_q > 1 && bp->dout_stride[2] < p->d_v) ||
                 !sdpa_view_fits(bp->dout_stride, b, hq, p->len_q, p->d_v) ||
                 !grad_view_ok(bp->dq_stride, b, hq, p->len_q, p->d_k)))
        return SDPA_ERR_SIZE;
    if (keys && (!grad_view_ok(bp->dk_stride, b, hk, p->len_kv, p->d_k) ||
                 !grad_view_ok(bp->dv_stride, b, hk, p->len_kv, p->d_v)))
        return SDPA_ERR_SIZE;
    /* what is written, against everything else: the views below all fit (checked above) */
    const size_t nq = rows ? p->len_q : 0, nk = keys ? p->len_kv : 0;
    const size_t lse_stride[3] = {p->lse_stride[0], p->lse_stride[1], 1};
    const extent written[3] = {
        extent_of(bp->dq, bp->dq_stride, b, hq, nq, p->d_k),
        extent_of(bp->dk, bp->dk_stride, b, hk, nk, p->d_k),
        extent_of(bp->dv, bp->dv_stride, b, hk, nk, p->d_v),
    };
    const int reads = rows && keys;
    const extent read[7] = {
        extent_of(p->q, p->q_stride, b, hq, reads ? nq : 0, p->d_k),
        extent_of(p->k, p->k_stride, b, hk, reads ? nk : 0, p->d_k),
        extent_of(p->v, p->v_stride, b, hk, reads ? nk : 0, p->d_v),
        extent_of(p->out, p->out_stride, b, hq, nq, p->d_v),
        extent_of(bp->dout, bp->dout_stride, b, hq, nq, p->d_v),
        extent_of(p->lse, lse_stride, b, hq, 1, nq),
        extent_of(p->mask, p->mask_stride, b, hq, reads ? nq : 0, nk),
    };
    for (int w = 0; w < 3; w++) {
        for (int o = w + 1; o < 3; o++)
            if (meet(written[w], written[o])) return SDPA_ERR_SIZE;
        for (int r = 0; r < 7; r++)
            if (meet(written[w], read[r])) return SDPA_ERR_SIZE;
    }
    return sdpa_problem_check(p, desc->flags);
}

void sdpa_problem_single(attention_problem *p, void *out, const float *q, const float *k,
                         const float *v, size_t len_q, size_t len_kv, size_t d_k, size_t d_v,
                         float scale) {
    memset(p, 0, sizeof *p);
    p->batch = p->heads_q = p->heads_kv = 1;
    p->len_q = len_q;
    p->len_kv = len_kv;
    p->d_k = d_k;
    p->d_v = d_v;
    p->scale = scale;
    p->q = q;
    p->k = k;
    p->v = v;
    p->out = out;
    p->q_stride[2] = p->k_stride[2] = d_k;
    p->v_stride[2] = p->out_stride[2] = d_v;
}

sdpa_status sdpa_problem_from_desc(attention_problem *p, const sdpa_mha_desc *desc, void *out,
                                   const void *q, const void *k, const void *v, int typed) {
    if (!desc) return SDPA_ERR_NULL;
    if (!DESC_HAS(desc, mask_stride)) return SDPA_ERR_ARG;
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
    if (DESC_HAS(desc, lse_stride)) {
        const uint32_t most = typed ? SDPA_BF16 : SDPA_F32;
        if (desc->q_type > most || desc->kv_type > most || desc->out_type > most || desc->reserved)
            return SDPA_ERR_ARG;
        p->q_type = desc->q_type;
        p->kv_type = desc->kv_type;
        p->out_type = desc->out_type;
        p->lse = desc->lse;
        p->lse_stride[0] = desc->lse_stride[0];
        p->lse_stride[1] = desc->lse_stride[1];
    }
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
    if (!desc) return SDPA_ERR_NULL;
    memset(desc, 0, sizeof *desc);
    desc->struct_size = (uint32_t)sizeof *desc;
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
    if (!desc) return SDPA_ERR_NULL;
    desc->mask = mask;
    desc->mask_stride[0] = stride_batch;
    desc->mask_stride[1] = stride_head;
    desc->mask_stride[2] = stride_row;
    return SDPA_OK;
}
