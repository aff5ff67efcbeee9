/* The row exps of an ISA whose exps take no folded shift (sse, neon), for arch/row_kernels.h:
 * z - shift is formed before the exp, and there is no faster form for callers that round to
 * nearest. The ISA still supplies row_exps, exp_whole, row_sums_after, ROW_EXPS and ROW_SUMS. */
#ifndef SDPA_ARCH_ROW_EXP_PLAIN_H
#define SDPA_ARCH_ROW_EXP_PLAIN_H

typedef struct row_exp {
    vf shift;
} row_exp;
ALWAYS_INLINE int row_exp_folds(int kind) { return (void)kind, 0; }
ALWAYS_INLINE int row_exp_nearest(int kind) { return kind; }
ALWAYS_INLINE row_exp row_exp_shift(float shift, int folded) {
    (void)folded;
    return (row_exp){vf_set1(shift)};
}

#endif
