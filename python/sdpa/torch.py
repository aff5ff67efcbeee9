"""sdpa for torch tensors, with autograd: ``sdpa.torch.attention``, and
``sdpa.torch.scaled_dot_product_attention``, a drop-in for torch's function of that name.

Importing this module imports torch. The backward pass is libsdpa's sdpa_mha_backward_f32; with
a library that lacks it, backward raises NotImplementedError naming it.
"""

import math as _math
import numbers as _numbers

import torch as _torch

from . import _core

__all__ = ["attention", "scaled_dot_product_attention"]


class _Attention(_torch.autograd.Function):
    # sinks is an input of its own (also inside mods) so that a sinks tensor that requires grad
    # gets its gradient, dsinks, from the backward
    @staticmethod
    def forward(ctx, q, k, v, mask, causal, scale, layout, mods=None, sinks=None):
        out, lse, (qr, kr, vr, m) = _core.forward(q, k, v, causal, mask, scale, layout, True,
                                                  mods)
        ctx.causal, ctx.scale, ctx.layout, ctx.mods = causal, scale, layout, mods
        ctx.sinks_meta = None if sinks is None else (sinks.shape, sinks.dtype)
        ctx.save_for_backward(qr, kr, vr, out, lse, m)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @_torch.autograd.function.once_differentiable
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, m = ctx.saved_tensors
        types = (q.dtype, k.dtype, v.dtype)
        want_dsinks = ctx.sinks_meta is not None and ctx.needs_input_grad[8]
        dsinks = None
        if want_dsinks:
            dsinks = _torch.empty(ctx.sinks_meta[0], dtype=_torch.float32)
        if out.numel() == 0:
            # no query row (len_q or batch 0): no key is seen, every gradient is 0 (dout may
            # then be an expanded empty tensor whose strides no call would take)
            return (_torch.zeros(q.shape, dtype=types[0]), _torch.zeros(k.shape, dtype=types[1]),
                    _torch.zeros(v.shape, dtype=types[2]), None, None, None, None, None,
                    None if dsinks is None else dsinks.zero_().to(ctx.sinks_meta[1]))
        # The C backward is float32: 16-bit views are widened (exactly) for it, and the
        # gradients rounded back to their inputs' types.
        q, k, v, out = (_dense_f32(t) for t in (q, k, v, out))
        dout = _dense_f32(dout)
        dq = _torch.empty(q.shape, dtype=_torch.float32)
        dk = _torch.empty(k.shape, dtype=_torch.float32)
        dv = _torch.empty(v.shape, dtype=_torch.float32)
        _core.backward(q, k, v, out, lse, m, dout, dq, dk, dv, ctx.causal, ctx.scale, ctx.layout,
                       ctx.mods, dsinks)
        return (dq.to(types[0]), dk.to(types[1]), dv.to(types[2]), None, None, None, None, None,
                None if dsinks is None else dsinks.to(ctx.sinks_meta[1]))


def _dense_f32(t):
    """t as float32 whose strides the backward can take: a broadcast axis (stride 0) is
    materialised, since its gradient has the tensor's full shape."""
    t = t.to(_torch.float32)
    if any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape)) or (
        t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1
    ):
        t = t.contiguous()
    return t


def attention(q, k, v, causal=False, mask=None, scale=None, layout="bhsd", return_lse=False,
              window=None, softcap=None, sinks=None, alibi_slopes=None, segments=None):
    """``sdpa.attention`` as a torch.autograd.Function: gradients flow to q, k and v.

    Arguments, shapes, copies and errors are those of ``sdpa.attention`` (CPU tensors, float32,
    float16 or bfloat16). The mask gets no gradient. lse, when returned, is not differentiable.

    The forward saves q, k, v, out, lse and the float32 mask; backward calls
    sdpa_mha_backward_f32, which recomputes the probabilities from lse. Its gradients are
    float32, rounded to the inputs' dtypes; for 16-bit inputs, q, k, v, out and the upstream
    gradient are widened to float32 first. dk and dv sum over the query heads of a group (GQA).
    The backward is not itself differentiable (no double backward).

    Score modifiers (window, softcap, sinks, alibi_slopes, segments) are those of
    ``sdpa.attention``, and the backward takes them too: softcap's derivative flows into q and
    k, and a sinks tensor that requires grad gets dL/dsinks (summed over batch and rows). The
    window, the segments and the ALiBi slopes get no gradient.
    """
    mods = (window, softcap, sinks, alibi_slopes, segments)
    if all(x is None for x in mods):
        mods = None
    if _custom_op is not None and layout == "bhsd" and _torch.compiler.is_compiling():
        # the registered op keeps torch.compile's graph whole, modifiers included
        out, lse = _custom_op(q, k, v, mask, causal, None if scale is None else float(scale),
                              *_op_mods(window, softcap, sinks, alibi_slopes, segments))
        return (out, lse) if return_lse else out
    sink_input = sinks if isinstance(sinks, _torch.Tensor) else None
    out, lse = _Attention.apply(q, k, v, mask, causal, scale, layout, mods, sink_input)
    return (out, lse) if return_lse else out


def _op_mods(window, softcap, sinks, alibi_slopes, segments):
    """The modifiers as the custom op's arguments: window as [left, right] (-1 unbounded),
    softcap a float, the arrays tensors, segments split in two."""
    if window is not None:
        window = [-1 if w is None else int(w) for w in window]
    softcap = None if softcap is None else float(softcap)
    sinks, alibi_slopes = (None if x is None else _torch.as_tensor(x)
                           for x in (sinks, alibi_slopes))
    q_seg, k_seg = (None, None) if segments is None else (_torch.as_tensor(x) for x in segments)
    return window, softcap, sinks, alibi_slopes, q_seg, k_seg


def _mods_tuple(window, softcap, sinks, alibi_slopes, q_segment, k_segment):
    """The custom op's modifier arguments as _core takes them (None when none is set)."""
    segments = None if q_segment is None else (q_segment, k_segment)
    mods = (window, softcap, sinks, alibi_slopes, segments)
    return None if all(x is None for x in mods) else mods


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """``torch.nn.functional.scaled_dot_product_attention`` (torch 2.x's signature and meaning)
    computed by sdpa, with autograd, on torch 1.13 as on 2.x.

    query (N, ..., Hq, L, E), key (N, ..., H, S, E), value (N, ..., H, S, Ev): any number of
    leading axes (2-d included), the same in all three; returns (N, ..., Hq, L, Ev) of query's
    dtype (float32, float16 or bfloat16, CPU). The axes before the heads are merged into
    sdpa's batch, as a view where their strides allow (4-d and 3-d inputs: always).
    attn_mask: bool (True keeps the key) or floating point (added to the scores), broadcastable
        to (N, ..., Hq, L, S); it gets no gradient, so one that requires grad raises.
    is_causal: top-left aligned, as torch's: query i sees keys j <= i (with L > S, the rows
        from S on see every key). With L == S this is sdpa's causal flag; otherwise an (L, S)
        float mask is built for the call. Not with attn_mask (ValueError, as torch).
    scale: None for 1/sqrt(E); otherwise as ``sdpa.attention`` takes it (0 raises).
    enable_gqa: heads Hq a multiple of key and value's H (query head h reads head h // (Hq/H));
        without it, heads that differ raise ValueError.
    dropout_p: sdpa has no dropout: any value but 0 raises NotImplementedError.

    A row that sees no key (every key masked) is zeros, as torch >= 2.5 gives (older versions
    give NaN). A +inf mask entry gives a NaN row. Autograd is ``sdpa.torch.attention``'s.
    """
    _check_dropout(dropout_p)
    if attn_mask is not None and is_causal:
        raise ValueError("is_causal=True and attn_mask: pass one of them (as torch, which "
                         "raises for both)")
    if attn_mask is not None and _torch.is_grad_enabled() and getattr(
            attn_mask, "requires_grad", False):
        raise NotImplementedError("attn_mask requires grad; sdpa gives the mask no gradient "
                                  "(pass attn_mask.detach())")
    q, k, v = _bhsd_views(query, key, value, enable_gqa)
    len_q, len_kv = q.shape[2], k.shape[2]
    causal = bool(is_causal) and len_q == len_kv
    mask = attn_mask
    if is_causal and len_q != len_kv:
        # top-left: sdpa's causal flag is bottom-right, the same only when L == S
        mask = _torch.full((len_q, len_kv), -_math.inf).triu_(1)
    elif mask is not None:
        mask = _mask_view(mask, query.shape[:-1] + (len_kv,), q.shape[:2])
    if _custom_op is not None and _torch.compiler.is_compiling():
        # the registered op keeps torch.compile's graph whole (a Function calling ctypes
        # would break it); eager calls skip its dispatch cost
        out = _custom_op(q, k, v, mask, causal, None if scale is None else float(scale))[0]
    elif _torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        out = _Attention.apply(q, k, v, mask, causal, scale, "bhsd")[0]
    else:
        out = _core.forward(q, k, v, causal, mask, scale, "bhsd", False)[0]
    return out.view(tuple(query.shape[:-1]) + (value.shape[-1],))


def _check_dropout(dropout_p):
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, _numbers.Real):
        raise TypeError(f"dropout_p must be a real number, not {type(dropout_p).__name__}")
    if dropout_p != 0:
        raise NotImplementedError(f"dropout_p={dropout_p!r}: sdpa has no dropout; pass "
                                  "dropout_p=0.0 (as in eval mode)")


def _bhsd_views(query, key, value, enable_gqa):
    """query, key and value as 4-d (batch, heads, len, d) tensors: the axes before the heads
    merged (a view where the strides allow), 2-d and 3-d inputs given leading axes of 1."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, _torch.Tensor):
            raise TypeError(f"{name}: expected a torch tensor, got {type(x).__name__}")
        if x.dtype not in (_torch.float32, _torch.float16, _torch.bfloat16):
            raise TypeError(f"{name}: dtype {x.dtype} is not float32, float16 or bfloat16")
        if x.dim() < 2:
            raise ValueError(f"{name}: expected at least 2 axes (..., len, d), got shape "
                             f"{tuple(x.shape)}")
    if not query.dim() == key.dim() == value.dim():
        raise ValueError(f"query, key and value must have the same number of axes; got shapes "
                         f"{tuple(query.shape)}, {tuple(key.shape)} and {tuple(value.shape)}")
    if query.dim() > 3 and not (query.shape[:-3] == key.shape[:-3] == value.shape[:-3]):
        raise ValueError("query, key and value must have the same leading axes (N, ...) before "
                         f"the heads; got shapes {tuple(query.shape)}, {tuple(key.shape)} and "
                         f"{tuple(value.shape)}")
    if query.dim() > 2:
        hq, hk, hv = query.shape[-3], key.shape[-3], value.shape[-3]
        if hk != hv:
            raise ValueError(f"key has {hk} heads and value {hv}; they must be the same")
        if not enable_gqa and hq != hk:
            raise ValueError(f"query has {hq} heads and key and value {hk}: pass "
                             "enable_gqa=True for grouped-query attention")
        if enable_gqa and (hk == 0 or hq % hk):
            raise ValueError(f"enable_gqa: query's {hq} heads must be a multiple of key and "
                             f"value's {hk}")

    def bhsd(x):
        lead = x.shape[:-3]
        batch = _math.prod(lead)
        heads = x.shape[-3] if x.dim() > 2 else 1
        return x.reshape(batch, heads, x.shape[-2], x.shape[-1])

    return bhsd(query), bhsd(key), bhsd(value)


def _mask_view(mask, full, batch_heads):
    """attn_mask broadcast to full (N, ..., Hq, L, S), as 4-d (batch, Hq, L, S); a mask of at
    most 4 axes is left to sdpa.attention, which reads it through stride-0 axes."""
    if not isinstance(mask, _torch.Tensor):
        mask = _torch.as_tensor(mask)
    if mask.dtype != _torch.bool and not mask.is_floating_point():
        raise TypeError(f"attn_mask: dtype {mask.dtype} is neither bool nor floating point")
    if mask.dim() > len(full):
        raise ValueError(f"attn_mask of shape {tuple(mask.shape)} has more axes than the "
                         f"scores {tuple(full)}")
    try:
        expanded = mask.expand(full)
    except RuntimeError:
        raise ValueError(f"attn_mask of shape {tuple(mask.shape)} does not broadcast to "
                         f"{tuple(full)}") from None
    if len(full) <= 4:
        return mask
    return expanded.reshape(tuple(batch_heads) + tuple(full[-2:]))


def _gradients(q, k, v, out, lse, mask, dout, causal, scale, mods=None, sinks=None):
    """(dq, dk, dv, dsinks) of bhsd attention, each of its input's dtype; mask and mods as the
    forward took them; dsinks of sinks' shape, or of shape (0,) without sinks."""
    types = (q.dtype, k.dtype, v.dtype)
    dsinks = _torch.zeros(0 if sinks is None else sinks.shape, dtype=_torch.float32)
    if out.numel() == 0:
        return tuple(_torch.zeros(x.shape, dtype=t) for x, t in zip((q, k, v), types)) + (
            dsinks if sinks is None else dsinks.to(sinks.dtype),)
    m = None if mask is None else _core.mask_arg(mask, q, k, "bhsd", True)[0]
    q, k, v, out, dout = (_dense_f32(t) for t in (q, k, v, out, dout))
    dq, dk, dv = (_torch.empty(x.shape, dtype=_torch.float32) for x in (q, k, v))
    _core.backward(q, k, v, out, lse, m, dout, dq, dk, dv, causal, scale, "bhsd", mods,
                   None if sinks is None else dsinks)
    return (dq.to(types[0]), dk.to(types[1]), dv.to(types[2]),
            dsinks if sinks is None else dsinks.to(sinks.dtype))


def _register_custom_op():
    """sdpa::attention and its backward as torch.library custom ops (torch >= 2.4), with fake
    (shape-only) implementations and autograd, so that torch.compile traces through them."""
    library = getattr(_torch, "library", None)
    if not hasattr(library, "custom_op") or not hasattr(library, "register_autograd"):
        return None
    from typing import List, Optional, Tuple

    Tensor = _torch.Tensor

    # the modifiers as sdpa.attention takes them, segments split into their two arrays
    @library.custom_op("sdpa::attention", mutates_args=(), device_types="cpu")
    def attention_op(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], causal: bool,
                     scale: Optional[float], window: Optional[List[int]] = None,
                     softcap: Optional[float] = None, sinks: Optional[Tensor] = None,
                     alibi_slopes: Optional[Tensor] = None, q_segment: Optional[Tensor] = None,
                     k_segment: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        mods = _mods_tuple(window, softcap, sinks, alibi_slopes, q_segment, k_segment)
        out, lse, _ = _core.forward(q, k, v, causal, mask, scale, "bhsd", True, mods)
        return out, lse

    @attention_op.register_fake
    def _(q, k, v, mask, causal, scale, *mods):
        return (q.new_empty(tuple(q.shape[:-1]) + (v.shape[-1],)),
                q.new_empty(tuple(q.shape[:-1]), dtype=_torch.float32))

    @library.custom_op("sdpa::attention_backward", mutates_args=(), device_types="cpu")
    def backward_op(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                    mask: Optional[Tensor], dout: Tensor, causal: bool, scale: Optional[float],
                    window: Optional[List[int]] = None, softcap: Optional[float] = None,
                    sinks: Optional[Tensor] = None, alibi_slopes: Optional[Tensor] = None,
                    q_segment: Optional[Tensor] = None, k_segment: Optional[Tensor] = None
                    ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        mods = _mods_tuple(window, softcap, sinks, alibi_slopes, q_segment, k_segment)
        return _gradients(q, k, v, out, lse, mask, dout, causal, scale, mods, sinks)

    @backward_op.register_fake
    def _(q, k, v, out, lse, mask, dout, causal, scale, window=None, softcap=None, sinks=None,
          *rest):
        return tuple(_torch.empty_like(x, memory_format=_torch.contiguous_format)
                     for x in (q, k, v)) + (
            q.new_empty((0,), dtype=_torch.float32) if sinks is None else _torch.empty_like(sinks),)

    def setup_context(ctx, inputs, output):
        q, k, v, mask, causal, scale, window, softcap, sinks, alibi, q_seg, k_seg = (
            tuple(inputs) + (None,) * 6)[:12]
        ctx.causal, ctx.scale, ctx.window, ctx.softcap = causal, scale, window, softcap
        ctx.save_for_backward(q, k, v, mask, sinks, alibi, q_seg, k_seg, *output)
        ctx.mark_non_differentiable(output[1])

    def backward(ctx, dout, _dlse):
        q, k, v, mask, sinks, alibi, q_seg, k_seg, out, lse = ctx.saved_tensors
        dq, dk, dv, dsinks = backward_op(q, k, v, out, lse, mask, dout, ctx.causal, ctx.scale,
                                         ctx.window, ctx.softcap, sinks, alibi, q_seg, k_seg)
        return (dq, dk, dv, None, None, None, None, None,
                dsinks if sinks is not None else None, None, None, None)

    attention_op.register_autograd(backward, setup_context=setup_context)
    return attention_op


_custom_op = _register_custom_op()
