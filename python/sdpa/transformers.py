"""sdpa as a Hugging Face transformers attention implementation:

    import sdpa.transformers
    sdpa.transformers.register()          # once, before loading the model
    model = AutoModel.from_pretrained(..., attn_implementation="sdpa_cpu")

transformers treats every implementation whose name contains "sdpa" as its own torch SDPA path,
and a model that declares no support for that (Gemma 2, gpt-oss: torch's function has no softcap
or sinks) refuses such a name before any attention runs. register() therefore also registers the
same function as ``ALIAS`` ("cpu_attention"), the name to pass for those models.

Importing this module imports torch and transformers (5.x). The implementation calls
``sdpa.torch.scaled_dot_product_attention`` (autograd, GQA without repeat_kv, top-left is_causal
as transformers expects of torch's function), or ``sdpa.attention`` with score modifiers for
softcap, sliding_window and s_aux (attention sinks), and with segments for packed sequences
(cu_seq_lens_q/k). Its mask function is transformers' own for 'sdpa' (boolean masks, or none
where is_causal suffices), except that a causal sliding-window layer without padding gets no
mask either: the window then goes to sdpa as a modifier, which skips the keys outside it.

What libsdpa cannot compute raises NotImplementedError naming it, rather than computing
something else: dropout in training, position_bias (a learned mask, which would need a
gradient) and packed causal sequences whose query and key lengths differ. The backward runs
through softcap, the sliding window and the sinks, whose parameter gets its gradient.
"""

from transformers import AttentionInterface as _AttentionInterface
from transformers.masking_utils import AttentionMaskInterface as _AttentionMaskInterface
from transformers.masking_utils import sdpa_mask as _sdpa_mask

from . import attention as _attention
from . import torch as _sdpa_torch

__all__ = ["NAME", "ALIAS", "register", "attention_forward", "mask_function"]

NAME = "sdpa_cpu"
ALIAS = "cpu_attention"


def register(name=NAME):
    """Registers the attention function and its mask function under name (default "sdpa_cpu")
    and under ALIAS ("cpu_attention", for the models that refuse names containing "sdpa") in
    transformers' global AttentionInterface and AttentionMaskInterface; idempotent. Returns
    name, to pass as attn_implementation."""
    for n in {name, ALIAS}:
        _AttentionInterface.register(n, attention_forward)
        _AttentionMaskInterface.register(n, mask_function)
    return name


def mask_function(*args, **kwargs):
    """transformers' sdpa_mask, which returns None (no mask) where is_causal suffices; here also
    for a causal sliding-window layer (local_size is the config's sliding_window), whose window
    attention_forward then passes to sdpa as a modifier. Padding, chunked attention and
    bidirectional masks are built as sdpa_mask builds them."""
    local = kwargs.get("local_size")
    config = kwargs.get("config")
    if (local is not None and kwargs.get("allow_is_causal_skip", True)
            and not kwargs.get("allow_is_bidirectional_skip", False) and config is not None
            and getattr(config, "sliding_window", None) == local
            and not getattr(config, "attention_chunk_size", None)):
        # local_size only decides whether the mask may be skipped: the mask, when built,
        # holds the window through its mask_function either way
        kwargs["local_size"] = None
    return _sdpa_mask(*args, **kwargs)


def _unsupported(what, needs):
    raise NotImplementedError(f"sdpa_cpu: {what} is not supported yet; it needs {needs}. Use "
                              "attn_implementation='eager' for this model")


def _segments(cu_q, cu_k, len_q, len_kv, causal):
    """(q_segment, k_segment) of packed sequences (batch 1): token t belongs to document s where
    cu[s] <= t < cu[s + 1]."""
    import torch

    cu_q, cu_k = (c.detach().to("cpu", torch.int64) for c in (cu_q, cu_k))
    if cu_q[-1].item() != len_q or cu_k[-1].item() != len_kv:
        raise ValueError(f"cu_seq_lens_q/k end at {cu_q[-1].item()} and {cu_k[-1].item()}, but "
                         f"the packed sequence has {len_q} queries and {len_kv} keys")
    if causal and not torch.equal(cu_q, cu_k):
        # causality is bottom-right over the whole packed row: within each document only when
        # every document has as many queries as keys
        _unsupported("packed causal sequences whose query and key lengths differ",
                     "sdpa's paged call, which has no backward")
    q_seg = torch.searchsorted(cu_q, torch.arange(len_q), right=True) - 1
    k_seg = torch.searchsorted(cu_k, torch.arange(len_kv), right=True) - 1
    return q_seg.to(torch.int32), k_seg.to(torch.int32)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      is_causal=None, **kwargs):
    """transformers' attention-function contract: query (batch, heads, len_q, d), key and value
    (batch, kv_heads, len_kv, d), attention_mask bool (True keeps) or float (added),
    broadcastable to (batch, heads, len_q, len_kv), or None. Returns (output (batch, len_q,
    heads, d_v), None): sdpa computes no attention weights.

    softcap and s_aux (sinks, one per query head) go to sdpa as modifiers. sliding_window W
    (key j seen from position p when p - W < j <= p) is the window (W - 1, unbounded) when no
    mask is given; a mask transformers built already holds the window. cu_seq_lens_q/k (packed
    documents in a batch of 1) become segments."""
    if kwargs.get("position_bias") is not None:
        _unsupported("position_bias", "a mask with a gradient")
    if dropout:
        raise NotImplementedError(f"sdpa_cpu: dropout={dropout!r} (the module is in training "
                                  "mode with attention dropout): sdpa has no dropout; call "
                                  "model.eval() or set the config's attention dropout to 0")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    module_causal = bool(is_causal)
    len_q = query.shape[2]
    # as transformers' 'sdpa': causal through the flag only when no mask is materialised and
    # more than one query (a single query sees the whole cache)
    is_causal = module_causal and attention_mask is None and len_q > 1
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    packed = cu_q is not None or cu_k is not None
    if is_causal and key.shape[2] > len_q and not packed:
        # keys past len_q are masked for every query under top-left causality (a static
        # cache's empty tail at prefill): leave them out rather than build a mask
        key, value = key[:, :, :len_q], value[:, :, :len_q]
    mods = {}
    if kwargs.get("softcap"):
        mods["softcap"] = float(kwargs["softcap"])
    if kwargs.get("s_aux") is not None:
        mods["sinks"] = kwargs["s_aux"]
    window = kwargs.get("sliding_window")
    if window is not None and attention_mask is None and module_causal:
        # no mask: the last query is the last key (transformers skips the mask only then), so
        # sdpa's bottom-right window is the model's
        mods["window"] = (int(window) - 1, -1)
    if packed:
        if cu_q is None or cu_k is None or query.shape[0] != 1:
            raise ValueError("packed sequences need both cu_seq_lens_q and cu_seq_lens_k and a "
                             f"batch of 1 (got batch {query.shape[0]})")
        mods["segments"] = _segments(cu_q, cu_k, len_q, key.shape[2],
                                     module_causal and attention_mask is None)
    if not mods:
        out = _sdpa_torch.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, is_causal=is_causal, scale=scaling,
            enable_gqa=query.shape[1] != key.shape[1])
        return out.transpose(1, 2).contiguous(), None
    mask = attention_mask
    if is_causal and key.shape[2] < len_q:
        if "window" in mods:
            _unsupported("a sliding window with fewer keys than queries and no mask",
                         "a window aligned top-left")
        # top-left causality, as torch's is_causal, where sdpa's flag (bottom-right) differs
        mask = _sdpa_torch._torch.ones(len_q, key.shape[2], dtype=_sdpa_torch._torch.bool).tril_()
        is_causal = False
    out = _attention(query, key, value, causal=is_causal, mask=mask, scale=scaling, **mods)
    return out.transpose(1, 2).contiguous(), None
