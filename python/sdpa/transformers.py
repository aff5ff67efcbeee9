"""sdpa as a Hugging Face transformers attention implementation:

    import sdpa.transformers
    sdpa.transformers.register()          # once, before loading the model
    model = AutoModel.from_pretrained(..., attn_implementation="sdpa_cpu")

Importing this module imports torch and transformers (5.x). The implementation calls
``sdpa.torch.scaled_dot_product_attention`` (autograd, GQA without repeat_kv, top-left is_causal
as transformers expects of torch's function). Its mask function is transformers' own for 'sdpa':
boolean masks, or none where is_causal suffices.

What libsdpa cannot compute yet raises NotImplementedError naming it, rather than computing
something else: dropout in training, softcap and sliding_window (they wait for sdpa's score
modifiers), s_aux (attention sinks, the same), packed sequences given as cu_seq_lens_q/k (they
wait for sdpa's ragged call), position_bias (a learned mask, which would need a gradient).
"""

from transformers import AttentionInterface as _AttentionInterface
from transformers.masking_utils import AttentionMaskInterface as _AttentionMaskInterface
from transformers.masking_utils import sdpa_mask as _sdpa_mask

from . import torch as _sdpa_torch

__all__ = ["NAME", "register", "attention_forward"]

NAME = "sdpa_cpu"


def register(name=NAME):
    """Registers the attention function and its mask function under name (default "sdpa_cpu")
    in transformers' global AttentionInterface and AttentionMaskInterface; idempotent. Returns
    name, to pass as attn_implementation."""
    _AttentionInterface.register(name, attention_forward)
    _AttentionMaskInterface.register(name, _sdpa_mask)
    return name


def _unsupported(what, needs):
    raise NotImplementedError(f"sdpa_cpu: {what} is not supported yet; it needs {needs}. Use "
                              "attn_implementation='eager' for this model")


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      is_causal=None, **kwargs):
    """transformers' attention-function contract: query (batch, heads, len_q, d), key and value
    (batch, kv_heads, len_kv, d), attention_mask bool (True keeps) or float (added),
    broadcastable to (batch, heads, len_q, len_kv), or None. Returns (output (batch, len_q,
    heads, d_v), None): sdpa computes no attention weights."""
    if kwargs.get("softcap") is not None:
        _unsupported(f"softcap={kwargs['softcap']!r}", "sdpa's score modifiers (a tanh cap)")
    if kwargs.get("sliding_window") is not None:
        _unsupported(f"sliding_window={kwargs['sliding_window']!r}",
                     "sdpa's score modifiers (a window of keys)")
    if kwargs.get("s_aux") is not None:
        _unsupported("s_aux (attention sinks)", "sdpa's score modifiers (a sink logit per head)")
    if kwargs.get("cu_seq_lens_q") is not None or kwargs.get("cu_seq_lens_k") is not None:
        _unsupported("packed sequences (cu_seq_lens_q/k)", "sdpa's ragged (paged) call")
    if kwargs.get("position_bias") is not None:
        _unsupported("position_bias", "a mask with a gradient")
    if dropout:
        raise NotImplementedError(f"sdpa_cpu: dropout={dropout!r} (the module is in training "
                                  "mode with attention dropout): sdpa has no dropout; call "
                                  "model.eval() or set the config's attention dropout to 0")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    len_q = query.shape[2]
    # as transformers' 'sdpa': causal through the flag only when no mask is materialised and
    # more than one query (a single query sees the whole cache)
    is_causal = bool(is_causal) and attention_mask is None and len_q > 1
    if is_causal and key.shape[2] > len_q:
        # keys past len_q are masked for every query under top-left causality (a static
        # cache's empty tail at prefill): leave them out rather than build a mask
        key, value = key[:, :, :len_q], value[:, :, :len_q]
    out = _sdpa_torch.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, is_causal=is_causal, scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None
