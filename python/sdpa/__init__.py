"""sdpa: scaled dot-product attention on the CPU, softmax(scale * Q K^T + mask) V.

A thin binding of libsdpa.so.1: NumPy arrays in, NumPy arrays out; torch tensors in, torch
tensors out (``sdpa.torch.attention`` adds autograd). Arrays are handed to the library as they
are, strides included; the only copies are those the docstrings name.

The library is loaded once, at import, through its ``sdpa_get_api`` table: from
``$SDPA_LIBRARY`` if set, else the ``libsdpa.so.1`` beside this module, else the one the dynamic
loader finds. Backend, thread count and exp mode are process-wide settings of that library.
"""

import contextlib

import numpy as np

from . import _core, _ext, _lib
from .paged import attention_paged

__all__ = [
    "attention", "softmax", "backends", "backend", "set_backend", "use_backend", "version",
    "set_num_threads", "num_threads", "library_path", "attention_paged",
]

_api = _core.api
MAX_THREADS = 1024  # sdpa_set_num_threads's limit (sdpa.h)
__version__ = _api.version().decode()


def attention(q, k, v, causal=False, mask=None, scale=None, layout="bhsd", return_lse=False,
              window=None, softcap=None, sinks=None, alibi_slopes=None, segments=None):
    """Scaled dot-product attention, out = softmax(scale * q k^T + mask) v, with optional score
    modifiers (sliding window, softcap, ALiBi, sinks, segments).

    q, k, v: 4-d arrays (batch, heads, len, d) for layout "bhsd", or (batch, len, heads, d)
        for "bshd"; or 2-d (len, d) for one head. q has heads_q heads and k and v heads_kv,
        which must divide heads_q: query head h reads key/value head h // (heads_q // heads_kv)
        (GQA; heads_kv == 1 is MQA). All NumPy arrays (float32 or float16) or all CPU torch
        tensors (float32, float16 or bfloat16); k and v share one dtype, q may differ.
    causal: bottom-right aligned (the KV-cache convention): query i sees keys
        j <= i + len_kv - len_q. A row that sees no key is zeros.
    mask: broadcastable to (batch, heads_q, len_q, len_kv) ((len_q, len_kv) for 2-d inputs).
        bool: True keeps the key, False removes it. Floating point: added to the scaled scores
        (-inf removes the key).
    scale: None for 1/sqrt(d_k); any other finite value that is not 0 in float32 is used as
        is, rounded to float32 (ValueError for 0, non-finite values, and values that round to 0
        or overflow in float32, such as 1e-50 or 1e39).
    layout: "bhsd" or "bshd" (ignored for 2-d inputs).
    return_lse: also return lse, float32 of shape (batch, heads_q, len_q) ((len_q,) for 2-d):
        the natural log of the softmax denominator of each query row (the sink included), -inf
        for a row that sees no key and no sink.

    Score modifiers (sdpa.h's sdpa_score_mods), each off by default. Query row i sits at key
    position p_i = i + len_kv - len_q (bottom-right, as causal). In this order: s = scale q.k;
    s = softcap * tanh(s / softcap); s += slope[h] * (j - p_i); s += mask; the pairs outside
    causality, the window or the segment get weight exactly 0; the softmax over the row, with
    e^sinks[h] in its denominator and no value.
    window: (left, right): row i sees key j only if p_i - left <= j <= p_i + right; a side of
        None or -1 is unbounded. Mistral's or transformers' sliding_window W is (W - 1, 0) with
        causal=True.
    softcap: a finite float > 0 (Gemma 2's attn_logit_softcapping); None or 0: none.
    alibi_slopes, sinks: one float per query head (heads_q,), arrays or tensors (copied to
        float32). A sink of -inf adds nothing.
    segments: (q_segment, k_segment), integers of shape (batch, len_q) and (batch, len_kv), or
        (len_q,) and (len_kv,) for every batch entry: row i sees key j only if their segments
        are equal (documents packed in one sequence).

    Returns out, shaped like q with d_v as its last axis, of q's dtype and kind, dense in q's
    layout; or (out, lse).

    Zero copy: q, k, v and a float32 mask are read where they are, through their strides
    (transposed, sliced and broadcast views; a batch or head stride of 0 included). An array is
    copied only when its last axis is not contiguous, when its rows (the len axis) lie closer
    than a row apart, as in a broadcast along len (stride 0), which the library does not take
    for q, k or v, or, for NumPy, when a stride is negative, or a stride or the address is not
    a whole number of elements, as in a field of a structured array. The mask is read through
    any strides, 0 included. A bool mask, or a float mask of another dtype, is converted to a
    float32 mask of its own shape first. out and lse are new arrays.

    For torch tensors that require grad (with grad mode on), this calls
    ``sdpa.torch.attention``, so gradients flow, through the score modifiers too (a sinks
    tensor that requires grad gets its gradient).

    Raises TypeError for a dtype sdpa does not take, mixed kinds of arrays or a sparse tensor,
    ValueError for shapes that do not match (naming the sizes), a bad layout or scale, or any
    status the library returns (with its status string and the library's detail, which names
    the argument); all before any work. Under torch.jit.trace it raises NotImplementedError:
    the tracer cannot record the library's call.
    """
    mods = (window, softcap, sinks, alibi_slopes, segments)
    if all(x is None for x in mods):
        mods = None
    if _core.is_tensor(q):
        torch = _core.torch_module()
        compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
        # under torch.compile, sdpa.torch's custom op keeps the graph whole
        if compiling() or torch.is_grad_enabled() and any(
                getattr(x, "requires_grad", False) for x in (q, k, v, sinks)):
            from . import torch as sdpa_torch

            return sdpa_torch.attention(q, k, v, causal=causal, mask=mask, scale=scale,
                                        layout=layout, return_lse=return_lse, window=window,
                                        softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes,
                                        segments=segments)
    out, lse, _ = _core.forward(q, k, v, causal, mask, scale, layout, return_lse, mods)
    return (out, lse) if return_lse else out


def softmax(x, scale=1.0, axis=-1):
    """softmax(scale * x) along axis, numerically stable (sdpa_softmax_f32 of sdpa.h).

    x: a float32 NumPy array or CPU torch tensor; the result is a new one of the same kind and
    shape. A row whose entries are all -inf gives zeros; NaN in a row makes the row NaN.
    scale: finite and non-zero, else ValueError with the library's status string.

    The library takes one contiguous row a call: x is copied when its rows along axis are not
    dense in memory (axis not the last, or a strided view). No autograd: a tensor result does
    not require grad.
    """
    if _core.is_tensor(x):
        torch = _core.torch_module()
        _core.check_strided(x, "softmax: x")
        if x.dtype != torch.float32:
            raise TypeError(f"softmax: dtype {x.dtype} is not float32")
        if x.device.type != "cpu":
            raise ValueError(f"softmax: tensor on {x.device}; sdpa runs on the CPU")
        if x.dim() == 0:
            raise ValueError("softmax: x must have at least one axis")
        xm = x.detach().movedim(axis, -1).contiguous()
        y = torch.empty(xm.shape, dtype=torch.float32)
        _ext.softmax((y.data_ptr(), y.shape, y.stride(), _lib.F32),
                     (xm.data_ptr(), xm.shape, xm.stride(), _lib.F32), float(scale))
        return y.movedim(-1, axis)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"softmax: x must be a NumPy array or a torch tensor, not {type(x).__name__}")
    if x.dtype != np.float32:
        raise TypeError(f"softmax: dtype {x.dtype} is not float32")
    if x.ndim == 0:
        raise ValueError("softmax: x must have at least one axis")
    xm = np.ascontiguousarray(np.moveaxis(x, axis, -1))
    y = np.empty(xm.shape, dtype=np.float32)
    _ext.softmax(y, xm, float(scale))
    return np.moveaxis(y, -1, axis)


def backends():
    """The backends this library has and this CPU can run, best first (e.g. ["avx512",
    "avx2", "sse", "scalar"])."""
    names = []
    i = 0
    while True:
        name = _api.backend_name(i)
        if name is None:
            return names
        if _api.backend_supported(name):
            names.append(name.decode())
        i += 1


def backend():
    """The name of the active backend."""
    return _api.backend().decode()


def set_backend(name):
    """Makes name the active backend of the process ("auto" for the best one); ValueError,
    with the library's status string, for a name this library or CPU cannot run."""
    if not isinstance(name, str):
        raise TypeError(f"backend name must be a str, not {type(name).__name__}")
    _lib.check(_api, _api.set_backend(name.encode()), f"sdpa_set_backend({name!r})")


@contextlib.contextmanager
def use_backend(name):
    """Context manager: name is the active backend inside the block, and the previous one is
    restored on exit (also on an exception). The setting is process-wide: other threads see
    it too."""
    previous = backend()
    set_backend(name)
    try:
        yield name
    finally:
        set_backend(previous)


def version():
    """The version of the loaded libsdpa, "MAJOR.MINOR.PATCH"."""
    return _api.version().decode()


def set_num_threads(n):
    """Threads one attention call may use: 0 for the default (the CPUs of the process's
    affinity mask, or $SDPA_NUM_THREADS), 1 for the caller's thread only, at most 1024.
    Process-wide. Results are bitwise the same at every count."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"set_num_threads: n must be an int, not {type(n).__name__}")
    if n < 0 or n > MAX_THREADS:
        # checked here: ctypes would pass n modulo 2**64 to the library
        raise ValueError(f"set_num_threads: n must be between 0 and {MAX_THREADS}, not {n}")
    _lib.check(_api, _api.set_num_threads(n), f"sdpa_set_num_threads({n})")


def num_threads():
    """The threads a call that starts now may use (the default resolved)."""
    return _api.num_threads()


def library_path():
    """The path of the loaded libsdpa.so.1 (or the name the dynamic loader resolved)."""
    return _api.path

