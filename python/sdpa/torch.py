"""sdpa for torch tensors, with autograd: ``sdpa.torch.attention``.

Importing this module imports torch. The backward pass is libsdpa's sdpa_mha_backward_f32; with
a library that lacks it, backward raises NotImplementedError naming it.
"""

import torch as _torch

from . import _core

__all__ = ["attention"]


class _Attention(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, causal, scale, layout):
        out, lse, (qr, kr, vr, m) = _core.forward(q, k, v, causal, mask, scale, layout, True)
        ctx.causal, ctx.scale, ctx.layout = causal, scale, layout
        ctx.save_for_backward(qr, kr, vr, out, lse, m)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @_torch.autograd.function.once_differentiable
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, m = ctx.saved_tensors
        types = (q.dtype, k.dtype, v.dtype)
        if out.numel() == 0:
            # no query row (len_q or batch 0): no key is seen, every gradient is 0 (dout may
            # then be an expanded empty tensor whose strides no call would take)
            return (_torch.zeros(q.shape, dtype=types[0]), _torch.zeros(k.shape, dtype=types[1]),
                    _torch.zeros(v.shape, dtype=types[2]), None, None, None, None)
        # The C backward is float32: 16-bit views are widened (exactly) for it, and the
        # gradients rounded back to their inputs' types.
        q, k, v, out = (_dense_f32(t) for t in (q, k, v, out))
        dout = _dense_f32(dout)
        dq = _torch.empty(q.shape, dtype=_torch.float32)
        dk = _torch.empty(k.shape, dtype=_torch.float32)
        dv = _torch.empty(v.shape, dtype=_torch.float32)
        _core.backward(q, k, v, out, lse, m, dout, dq, dk, dv, ctx.causal, ctx.scale, ctx.layout)
        return dq.to(types[0]), dk.to(types[1]), dv.to(types[2]), None, None, None, None


def _dense_f32(t):
    """t as float32 whose strides the backward can take: a broadcast axis (stride 0) is
    materialised, since its gradient has the tensor's full shape."""
    t = t.to(_torch.float32)
    if any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape)) or (
        t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1
    ):
        t = t.contiguous()
    return t


def attention(q, k, v, causal=False, mask=None, scale=None, layout="bhsd", return_lse=False):
    """``sdpa.attention`` as a torch.autograd.Function: gradients flow to q, k and v.

    Arguments, shapes, copies and errors are those of ``sdpa.attention`` (CPU tensors, float32,
    float16 or bfloat16). The mask gets no gradient. lse, when returned, is not differentiable.

    The forward saves q, k, v, out, lse and the float32 mask; backward calls
    sdpa_mha_backward_f32, which recomputes the probabilities from lse. Its gradients are
    float32, rounded to the inputs' dtypes; for 16-bit inputs, q, k, v, out and the upstream
    gradient are widened to float32 first. dk and dv sum over the query heads of a group (GQA).
    The backward is not itself differentiable (no double backward).
    """
    out, lse = _Attention.apply(q, k, v, mask, causal, scale, layout)
    return (out, lse) if return_lse else out
