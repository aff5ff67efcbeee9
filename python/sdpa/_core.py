"""Arrays and tensors as the C helper (_ext) takes them, and the forward and backward calls.

Nothing here imports torch: a tensor is recognised by its type's module, and torch is reached
through sys.modules once a tensor has arrived.
"""

import ctypes
import math
import numbers
import sys

import numpy as np

from . import _ext, _lib

api = _lib.Api()
api.require("mha")
_ext.init(ctypes.addressof(api._table))

_torch_types = None  # torch dtype -> sdpa_dtype, filled when the first tensor arrives


def is_tensor(x):
    return type(x).__module__.startswith("torch")


def torch_module():
    global _torch_types
    torch = sys.modules["torch"]
    if _torch_types is None:
        _torch_types = {torch.float32: _lib.F32, torch.float16: _lib.F16, torch.bfloat16: _lib.BF16}
    return torch


def _row_axis(ndim, layout):
    """The len axis of a 2-d or 4-d q, k or v (None for other ranks, which _ext rejects)."""
    return 0 if ndim == 2 else (1 if layout == "bshd" else 2) if ndim == 4 else None


def _rows_overlap(shape, strides, layout, itemsize):
    """The rows (along len) of a view lie closer than a row apart, as in a broadcast along len:
    sdpa.h takes a q, k or v row stride of at least the row only."""
    axis = _row_axis(len(shape), layout)
    return (axis is not None and shape[axis] > 1 and shape[-1] > 0
            and strides[axis] < shape[-1] * itemsize)


def np_arg(x, name, layout):
    """x itself when the library can read it through its strides, else a contiguous copy (the
    last axis not contiguous, rows closer than a row apart, a negative stride, or a stride or
    address that is not a whole number of elements, which numpy's aligned flag reports)."""
    if not isinstance(x, np.ndarray):
        want = "a NumPy array or a torch tensor" if name == "q" else "a NumPy array, as q is"
        raise TypeError(f"{name}: expected {want}, got {type(x).__name__}")
    st = x.strides
    if st and ((st[-1] != x.itemsize and x.shape[-1] > 1) or min(st) < 0 or not x.flags.aligned
               or _rows_overlap(x.shape, st, layout, x.itemsize)):
        return np.ascontiguousarray(x)
    return x


def check_strided(x, name):
    """TypeError for a tensor without strides (sparse, mkldnn), which has no data pointer."""
    torch = sys.modules["torch"]
    if x.layout != torch.strided:
        raise TypeError(f"{name}: a {x.layout} tensor; sdpa takes dense (strided) tensors "
                        "(x.to_dense())")


def torch_arg(x, name, layout):
    """(tensor, the tuple _ext reads): the tensor itself, or a contiguous copy when its last axis
    is not contiguous or its rows lie closer than a row apart."""
    if not is_tensor(x):
        raise TypeError(f"{name}: expected a torch tensor, as q is, got {type(x).__name__}")
    check_strided(x, name)
    t = _torch_types.get(x.dtype)
    if t is None:
        raise TypeError(f"{name}: dtype {x.dtype} is not float32, float16 or bfloat16")
    if not x.is_cpu:
        raise ValueError(f"{name}: tensor on {x.device}; sdpa runs on the CPU")
    st = x.stride()
    if st and ((st[-1] != 1 and x.shape[-1] > 1) or _rows_overlap(x.shape, st, layout, 1)):
        x = x.contiguous()
        st = x.stride()
    return x, (x.data_ptr(), x.shape, st, t)


def rows_shape(q, layout):
    """(batch, heads_q, len_q) of q in the layout, or (len_q,) for 2-d q."""
    s = q.shape
    if len(s) == 2:
        return (s[0],)
    if len(s) != 4:
        raise ValueError(f"q must be 4-d (batch, heads, len, d) or 2-d (len, d); got {len(s)}-d")
    if layout == "bhsd":
        return (s[0], s[1], s[2])
    if layout == "bshd":
        return (s[0], s[2], s[1])
    raise ValueError(f'layout must be "bhsd" or "bshd", not {layout!r}')


def check_layout(layout):
    if layout != "bhsd" and layout != "bshd":
        raise ValueError(f'layout must be "bhsd" or "bshd", not {layout!r}')


def scale_arg(scale):
    """The scale as the library takes it, a float32: None gives 0, the library's default. A
    value that is 0 in float32 would be taken for the default, and one that overflows is not
    finite, which the library rejects: both are ValueError here, naming the value."""
    if scale is None:
        return _lib.DEFAULT_SCALE
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, not {type(scale).__name__}")
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, not {scale!r} (None gives 1/sqrt(d_k))")
    with np.errstate(over="ignore"):
        f = float(np.float32(scale))
    if f == 0.0:
        raise ValueError(f"scale {scale!r} is 0 in float32, which would mean the default "
                         "1/sqrt(d_k); pass None for that, or a scale of at least about 1.4e-45")
    if not math.isfinite(f):
        raise ValueError(f"scale {scale!r} overflows float32 (at most about 3.4e38)")
    return scale


def mask_arg(mask, q, k, layout, tensor):
    """The mask as float32 (bool: True keeps, False gives -inf), broadcast to (batch, heads_q,
    len_q, len_kv): (array, what _ext reads)."""
    rows = rows_shape(q, layout)
    len_kv = k.shape[0] if len(k.shape) == 2 else k.shape[1 if layout == "bshd" else 2]
    full = (1, 1) + rows + (len_kv,) if len(rows) == 1 else rows + (len_kv,)
    want = full[2:] if len(rows) == 1 else full
    if tensor:
        torch = torch_module()
        if not is_tensor(mask):
            mask = torch.as_tensor(mask)
        check_strided(mask, "mask")
        if mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=torch.float32).masked_fill_(~mask, -math.inf)
        elif mask.is_floating_point():
            mask = mask.to(torch.float32)
        else:
            raise TypeError(f"mask: dtype {mask.dtype} is neither bool nor floating point")
        if mask.device.type != "cpu":
            raise ValueError(f"mask: tensor on {mask.device}; sdpa runs on the CPU")
        m = None
        if mask.dim() <= len(want):
            try:
                m = mask.expand(full)
            except RuntimeError:
                pass
        if m is None:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to {want}")
        if full[3] > 1 and m.stride(3) != 1:
            m = m.contiguous()
        return m, (m.data_ptr(), m.shape, m.stride(), _lib.F32)
    mask = np.asarray(mask)
    if mask.dtype == np.bool_:
        mask = np.where(mask, np.float32(0), np.float32(-np.inf))
    elif mask.dtype.kind == "f":
        mask = mask.astype(np.float32, copy=False)
    else:
        raise TypeError(f"mask: dtype {mask.dtype} is neither bool nor floating point")
    if mask.ndim > len(want):
        raise ValueError(f"mask of shape {mask.shape} does not broadcast to {want}")
    try:
        m = np.broadcast_to(mask, full)
    except ValueError:
        raise ValueError(f"mask of shape {mask.shape} does not broadcast to {want}") from None
    st = m.strides
    if (full[3] > 1 and st[3] != 4) or min(st) < 0:
        m = np.ascontiguousarray(m)
    return m, m


def _window_side(x, name):
    """One side of a window as the library takes it: -1 (None) for unbounded, else an int >= 0."""
    if x is None:
        return -1
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"window: {name} must be an int or None, not {type(x).__name__}")
    if x < -1 or x > 2**63 - 1:
        raise ValueError(f"window: {name} ({x}) must be -1 or None (unbounded) or at least 0")
    return int(x)


def _per_head(x, name, heads_q):
    """A [heads_q] float vector (sinks, ALiBi slopes) as a contiguous float32 NumPy array."""
    if is_tensor(x):
        x = x.detach().to(device="cpu", dtype=sys.modules["torch"].float32).numpy()
    a = np.ascontiguousarray(x, dtype=np.float32)
    if a.shape != (heads_q,):
        raise ValueError(f"{name} must have one value per query head, shape ({heads_q},); got "
                         f"shape {a.shape}")
    return a


def _segment(x, name, batch, length, two_d):
    """A segment array as contiguous int32 and its batch stride in elements: shape (length,),
    shared by every batch entry (stride 0), or (batch, length)."""
    if is_tensor(x):
        x = x.detach().cpu().numpy()
    given = np.asarray(x)
    if given.dtype.kind not in "iu":
        raise TypeError(f"segments: {name} must hold integers, not {given.dtype}")
    a = np.ascontiguousarray(given, dtype=np.int32)
    if not np.array_equal(a, given):
        raise ValueError(f"segments: {name} has values that do not fit in int32")
    if a.shape == (length,):
        return a, 0
    if not two_d and a.shape == (batch, length):
        return a, length
    want = f"({length},)" if two_d else f"({length},) or ({batch}, {length})"
    raise ValueError(f"segments: {name} must have shape {want}; got {a.shape}")


def mods_arg(mods, q, k, layout):
    """The score modifiers (window, softcap, sinks, alibi_slopes, segments) of sdpa.attention as
    an sdpa_score_mods (None when none is set) and the arrays it points into, which must live
    through the call. Sizes are checked here: the library cannot see an array's length."""
    rows = rows_shape(q, layout)
    two_d = len(rows) == 1
    batch, heads_q, len_q = (1, 1, rows[0]) if two_d else rows
    len_kv = k.shape[0] if two_d else k.shape[1 if layout == "bshd" else 2]
    return score_mods(mods, heads_q, (batch, len_q, len_kv, two_d))


def score_mods(mods, heads_q, segment_shape=None):
    """(sdpa_score_mods, the arrays it points into) of the tuple (window, softcap, sinks,
    alibi_slopes, segments); segment_shape (batch, len_q, len_kv, two_d) sizes the segments."""
    window, softcap, sinks, alibi_slopes, segments = mods
    m = _lib.ScoreMods(struct_size=ctypes.sizeof(_lib.ScoreMods), window_left=-1,
                       window_right=-1)
    keep = []
    if window is not None:
        try:
            left, right = window
        except (TypeError, ValueError):
            raise TypeError("window must be a pair (left, right) of ints or None") from None
        m.window_left = _window_side(left, "left")
        m.window_right = _window_side(right, "right")
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
            raise TypeError(f"softcap must be a real number or None, not {type(softcap).__name__}")
        with np.errstate(over="ignore"):
            cap = float(np.float32(softcap))
        if not math.isfinite(cap) or cap < 0:
            raise ValueError(f"softcap ({softcap!r}) must be finite in float32 and not negative "
                             "(0 or None: no cap)")
        m.softcap = cap
    for field, x in (("sinks", sinks), ("alibi_slopes", alibi_slopes)):
        if x is not None:
            a = _per_head(x, field, heads_q)
            keep.append(a)
            setattr(m, field, a.ctypes.data)
    if segments is not None:
        try:
            q_seg, k_seg = segments
        except (TypeError, ValueError):
            raise TypeError("segments must be a pair (q_segment, k_segment) of integer arrays") \
                from None
        batch, len_q, len_kv, two_d = segment_shape
        qs, m.q_segment_stride = _segment(q_seg, "q_segment", batch, len_q, two_d)
        ks, m.k_segment_stride = _segment(k_seg, "k_segment", batch, len_kv, two_d)
        keep += [qs, ks]
        m.q_segment, m.k_segment = qs.ctypes.data, ks.ctypes.data
    return m, keep


def forward(q, k, v, causal, mask, scale, layout, want_lse, mods=None):

    """Checks, allocates and runs the forward call: (out, lse or None, the arrays the call read:
    q, k, v and the float32 mask or None). mods: None, or the tuple (window, softcap, sinks,
    alibi_slopes, segments) mods_arg takes."""
    flags = _lib.CAUSAL if causal else 0
    scale = scale_arg(scale)
    check_layout(layout)
    if is_tensor(q):
        torch = torch_module()
        if torch.jit.is_tracing():
            raise NotImplementedError(
                "sdpa.attention does not support torch.jit.trace: the library's call is not a "
                "torch operation, so the tracer cannot record it; call sdpa outside the traced "
                "function")
        q, qa = torch_arg(q, "q", layout)
        k, ka = torch_arg(k, "k", layout)
        v, va = torch_arg(v, "v", layout)
        if q.dim() != k.dim() or q.dim() != v.dim():
            raise ValueError(_ndim_message(q, k, v))
        m, ma = (None, None) if mask is None else mask_arg(mask, q, k, layout, True)
        sm, keep = (None, None) if mods is None else mods_arg(mods, q, k, layout)
        # new_empty and plain tuples: torch.empty and torch.Size slicing cost microseconds
        out = q.new_empty(tuple(q.shape)[:-1] + (v.shape[-1],))
        lse = q.new_empty(rows_shape(q, layout), dtype=torch.float32) if want_lse else None
        _ext.mha(qa, ka, va, (out.data_ptr(), out.shape, out.stride(), _torch_types[q.dtype]),
                 None if lse is None else (lse.data_ptr(), lse.shape, lse.stride(), _lib.F32),
                 ma, flags, scale, layout == "bshd", None,
                 None if sm is None else ctypes.addressof(sm))
        return out, lse, (q, k, v, m)
    q = np_arg(q, "q", layout)
    k = np_arg(k, "k", layout)
    v = np_arg(v, "v", layout)
    if q.ndim != k.ndim or q.ndim != v.ndim:
        raise ValueError(_ndim_message(q, k, v))
    m = None if mask is None else mask_arg(mask, q, k, layout, False)[0]
    sm, keep = (None, None) if mods is None else mods_arg(mods, q, k, layout)
    out = np.empty(q.shape[:-1] + v.shape[-1:], dtype=q.dtype)
    lse = np.empty(rows_shape(q, layout), dtype=np.float32) if want_lse else None
    _ext.mha(q, k, v, out, lse, m, flags, scale, layout == "bshd", None,
             None if sm is None else ctypes.addressof(sm))
    return out, lse, (q, k, v, m)


def _ndim_message(q, k, v):
    return ("q, k and v must all be 4-d (batch, heads, len, d) in the layout named, or all 2-d "
            f"(len, d); got {len(q.shape)}-d, {len(k.shape)}-d and {len(v.shape)}-d")


def backward(q, k, v, out, lse, mask, dout, dq, dk, dv, causal, scale, layout, mods=None,
             dsinks=None):
    """sdpa_mha_backward_f32 on float32 CPU tensors: writes dq, dk, dv, and dsinks (a float32
    [heads_q] tensor, or None) when mods, the forward's tuple, has sinks."""
    api.require("mha_backward_f32")

    def spec(t):
        return (t.data_ptr(), t.shape, t.stride(), _lib.F32)

    sm, keep = (None, None) if mods is None else mods_arg(mods, q, k, layout)
    _ext.mha(spec(q), spec(k), spec(v), spec(out), spec(lse),
             None if mask is None else spec(mask), _lib.CAUSAL if causal else 0,
             scale_arg(scale), layout == "bshd",
             (spec(dout), spec(dq), spec(dk), spec(dv), None if dsinks is None else spec(dsinks)),
             None if sm is None else ctypes.addressof(sm))
