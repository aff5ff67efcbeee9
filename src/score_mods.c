/* The score modifiers of a call (sdpa.h, sdpa_score_mods): checked, then resolved into the
 * problem's fields, which visibility.h (the window) and score_stage.h (the rest) read. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "attention_problem.h"
#include "error.h"
#include "score_stage.h"

/* The first of n values that is NaN, or +inf where !inf_ok, or n */
static size_t first_bad(const float *x, size_t n, int inf_ok) {
    for (size_t i = 0; i < n; i++)
        if (isnan(x[i]) || (!inf_ok && isinf(x[i])) || x[i] == INFINITY) return i;
    return n;
}

static sdpa_status mods_fields_check(const sdpa_score_mods *m) {
    if (m->struct_size < sizeof(sdpa_score_mods))
        return sdpa_fail(SDPA_ERR_ARG,
                         "mods->struct_size (%u) is smaller than sdpa_score_mods (%zu)",
                         (unsigned)m->struct_size, sizeof(sdpa_score_mods));
    if (m->reserved || m->reserved2 != 0.0f)
        return sdpa_fail(SDPA_ERR_ARG, "mods->%s is not 0", m->reserved ? "reserved" : "reserved2");
    if (m->window_left < -1 || m->window_right < -1)
        return sdpa_fail(SDPA_ERR_ARG, "mods->%s (%lld) is below -1",
                         m->window_left < -1 ? "window_left" : "window_right",
                         (long long)(m->window_left < -1 ? m->window_left : m->window_right));
    if (!(m->softcap >= 0.0f && m->softcap <= 3.4028235e38f))
        return sdpa_fail(SDPA_ERR_ARG, "mods->softcap (%g) is negative or not finite",
                         (double)m->softcap);
    if (!m->q_segment != !m->k_segment)
        return sdpa_fail(SDPA_ERR_ARG, "mods->%s is NULL but mods->%s is not: give both or neither",
                         m->q_segment ? "k_segment" : "q_segment",
                         m->q_segment ? "q_segment" : "k_segment");
    return SDPA_OK;
}

sdpa_status sdpa_problem_set_mods(attention_problem *p, const sdpa_score_mods *m) {
    sdpa_status st = mods_fields_check(m);
    if (st != SDPA_OK) return st;
    /* per-head values are read once here: a NaN slope or sink would poison every row of its
       head, and a sink of +inf would leave no weight to any key */
    size_t h;
    if (m->alibi_slopes && (h = first_bad(m->alibi_slopes, p->heads_q, 0)) < p->heads_q)
        return sdpa_fail(SDPA_ERR_ARG, "mods->alibi_slopes[%zu] (%g) is not finite", h,
                         (double)m->alibi_slopes[h]);
    if (m->sinks && (h = first_bad(m->sinks, p->heads_q, 1)) < p->heads_q)
        return sdpa_fail(SDPA_ERR_ARG, "mods->sinks[%zu] (%g) is NaN or +inf", h,
                         (double)m->sinks[h]);
    problem_mods mods = {m->window_left >= 0,
                         m->window_right >= 0,
                         0,
                         0,
                         m->softcap,
                         m->alibi_slopes,
                         m->sinks,
                         m->q_segment,
                         m->k_segment,
                         m->q_segment_stride,
                         m->k_segment_stride};
    if (mods.has_window_left) mods.window_left = (size_t)m->window_left;
    if (mods.has_window_right) mods.window_right = (size_t)m->window_right;
    p->mods = mods;
    return SDPA_OK;
}

score_stage score_stage_of(const attention_problem *p, size_t b, size_t h, int heads_as_rows,
                           ptrdiff_t shift, const float *mask, size_t mask_row) {
    const problem_mods *m = &p->mods;
    const score_stage st = {
        .mask = mask,
        .mask_row = mask_row,
        .softcap = m->softcap,
        .alibi = m->alibi ? m->alibi + h : NULL,
        .sinks = m->sinks ? m->sinks + h : NULL,
        .head_row = heads_as_rows ? 1 : 0,
        .shift = shift,
        .row_step = heads_as_rows ? 0 : 1,
        .q_segment = m->q_segment ? m->q_segment + b * m->q_segment_stride : NULL,
        .k_segment = m->k_segment ? m->k_segment + b * m->k_segment_stride : NULL,
    };
    return st;
}

/* dL/dsink_h = -sum over rows of P(sink) D = -sum e^(sink_h - lse) (dout . out): the sink
   takes a share of each row's weight and gives it no value. In double, batch entries then rows
   in order, on the calling thread. */
void sdpa_problem_dsinks(const backward_problem *bp) {
    const attention_problem *p = &bp->fwd;
    for (size_t h = 0; h < p->heads_q; h++) {
        double sum = 0.0;
        /* a sink of -inf is none: its gradient is 0, also for rows whose lse is -inf */
        for (size_t b = 0; b < p->batch && p->mods.sinks[h] != -INFINITY; b++)
            for (size_t i = 0; i < p->len_q; i++) {
                const float *o = (const float *)p->out + b * p->out_stride[0] +
                                 h * p->out_stride[1] + i * p->out_stride[2];
                const float *g = bp->dout + b * bp->dout_stride[0] + h * bp->dout_stride[1] +
                                 i * bp->dout_stride[2];
                const float lse = p->lse[b * p->lse_stride[0] + h * p->lse_stride[1] + i];
                double dd = 0.0;
                for (size_t c = 0; c < p->d_v; c++) dd += (double)g[c] * o[c];
                sum += exp((double)p->mods.sinks[h] - lse) * dd; /* lse >= the sink: e^ <= 1 */
            }
        bp->dsinks[h] = (float)-sum;
    }
}
