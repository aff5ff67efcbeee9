"""python -m sdpa.bench: sdpa against torch's CPU attention, at 1 thread and at all threads.

Prints a Markdown table: per shape and thread count the median time of sdpa.attention and of
torch's attention (F.scaled_dot_product_attention, or F._scaled_dot_product_attention where
torch has only that, as 1.13 does) on the same float32 tensors, and the ratio, from one run;
"torch cores" is torch's CPU time over its wall time, the cores it kept busy.
Then the Python overhead of one sdpa.attention call at a tiny shape: its time minus that of the
C call it makes.
"""

import argparse
import ctypes
import os
import statistics
import time
import timeit

import numpy as np

import sdpa
from sdpa import _core, _lib

# name, batch, heads_q, heads_kv, len_q, len_kv, d, causal
SHAPES = [
    ("prefill 8 heads 1024x1024 d=128", 1, 8, 8, 1024, 1024, 128, False),
    ("causal prefill 8 heads 1024 d=128", 1, 8, 8, 1024, 1024, 128, True),
    ("prefill 8 heads 1024x1024 d=64", 1, 8, 8, 1024, 1024, 64, False),
    ("decode 8 heads 1x4096 d=128", 1, 8, 8, 1, 4096, 128, False),
    ("GQA decode 32/8 heads 1x4096 d=128", 1, 32, 8, 1, 4096, 128, False),
]


def median_seconds(fn, min_time, min_runs=5):
    """The median wall time of fn, and the median of its process CPU time over that time."""
    fn()  # warm-up: pools started, pages touched
    times, cores = [], []
    start = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - start < min_time:
        t, c = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - t)
        cores.append((time.process_time() - c) / max(times[-1], 1e-9))
    return statistics.median(times), statistics.median(cores)


def torch_threads(torch, n):
    """torch.set_num_threads(n), which sets OpenMP's threads, and the same count for the OpenBLAS
    that Debian's torch runs its matmuls in: its pthreads build keeps a pool of its own, of every
    core unless told."""
    torch.set_num_threads(n)
    for name in ("libopenblas.so.0", "libblas.so.3"):
        try:
            ctypes.CDLL(name).openblas_set_num_threads(n)
        except (OSError, AttributeError):
            pass


def torch_attention(torch):
    F = torch.nn.functional
    if hasattr(F, "scaled_dot_product_attention"):
        return "F.scaled_dot_product_attention", lambda q, k, v, causal: F.scaled_dot_product_attention(
            q, k, v, is_causal=causal)
    return "F._scaled_dot_product_attention", lambda q, k, v, causal: F._scaled_dot_product_attention(
        q, k, v, None, 0.0, False, causal)[0]


def flops(b, hq, lq, lkv, d, causal):
    pairs = lq * lkv
    if causal:  # visible pairs only (bottom-right aligned)
        pairs = sum(min(lkv, i + 1 + lkv - lq) for i in range(lq))
    return 4 * b * hq * pairs * d


def overhead(torch=None, repeats=7, number=20000):
    """Per-call seconds at a tiny shape: sdpa.attention on NumPy arrays, the C call it makes,
    and sdpa.attention on torch tensors (None without torch)."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 1, 16)).astype(np.float32)
    k = rng.standard_normal((1, 1, 4, 16)).astype(np.float32)
    out = sdpa.attention(q, k, k)
    d = _lib.MhaDesc()
    _core.api.mha_desc_dense(ctypes.addressof(d), 1, 1, 1, 1, 4, 16, 16, 0.0, 0)
    args = (ctypes.addressof(d), out.ctypes.data, q.ctypes.data, k.ctypes.data, k.ctypes.data)
    mha, nop = _core.api.mha, _core.api.num_threads

    def best(fn):
        return min(timeit.repeat(fn, repeat=repeats, number=number)) / number

    total = best(lambda: sdpa.attention(q, k, k))
    # the C call: a ctypes call of sdpa_mha with the descriptor ready, less what a ctypes call
    # of an almost empty function (sdpa_num_threads) costs
    c_call = best(lambda: mha(*args)) - best(nop)
    on_tensors = None
    if torch:
        tq, tk = torch.from_numpy(q), torch.from_numpy(k)
        on_tensors = best(lambda: sdpa.attention(tq, tk, tk))
    return total, max(c_call, 0.0), on_tensors


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m sdpa.bench", description=__doc__.splitlines()[0])
    p.add_argument("--min-time", type=float, default=1.0, help="seconds per measurement (1)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="the 'all threads' count (default: the CPUs this process may use)")
    p.add_argument("--shape", action="append", help="only shapes whose name contains this")
    p.add_argument("--calls", type=int, default=20000,
                   help="calls per timing of the overhead (20000; 7 timings, the best kept)")
    args = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        torch = None
    print(f"sdpa {sdpa.version()} ({sdpa.library_path()}), backend {sdpa.backend()}; "
          + (f"torch {torch.__version__}" if torch else "torch not installed"))
    total, c_call, on_tensors = overhead(torch, number=args.calls)
    print(f"Python overhead at q (1,1,1,16), k = v (1,1,4,16): sdpa.attention {total * 1e6:.2f} us a "
          f"call, the C call {c_call * 1e6:.2f} us, overhead {(total - c_call) * 1e6:.2f} us"
          + (f"; on torch tensors {on_tensors * 1e6:.2f} us a call, overhead "
             f"{(on_tensors - c_call) * 1e6:.2f} us" if on_tensors else ""))
    print()
    name = "torch"
    if torch:
        name, tfn = torch_attention(torch)
    print(f"| shape | threads | sdpa ms | sdpa GFLOP/s | {name} ms | torch cores | sdpa speed-up |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, b, hq, hkv, lq, lkv, d, causal in SHAPES:
        if args.shape and not any(s in label for s in args.shape):
            continue
        rng = np.random.default_rng(1)
        q = rng.standard_normal((b, hq, lq, d), dtype=np.float32)
        k = rng.standard_normal((b, hkv, lkv, d), dtype=np.float32)
        v = rng.standard_normal((b, hkv, lkv, d), dtype=np.float32)
        if torch:
            # torch has no grouped heads here: it gets K and V repeated, outside the timing
            tq = torch.from_numpy(q)
            tk = torch.from_numpy(np.repeat(k, hq // hkv, axis=1))
            tv = torch.from_numpy(np.repeat(v, hq // hkv, axis=1))
        for threads in sorted({1, args.threads}):
            sdpa.set_num_threads(threads)
            ts, _ = median_seconds(lambda: sdpa.attention(q, k, v, causal=causal), args.min_time)
            row = f"| {label} | {threads} | {ts * 1e3:.2f} | {flops(b, hq, lq, lkv, d, causal) / ts / 1e9:.1f} |"
            if torch:
                torch_threads(torch, threads)
                with torch.no_grad():
                    tt, cores = median_seconds(lambda: tfn(tq, tk, tv, causal), args.min_time)
                row += f" {tt * 1e3:.2f} | {cores:.2f} | {tt / ts:.2f}x |"
            else:
                row += " | | |"
            print(row, flush=True)
    sdpa.set_num_threads(0)


if __name__ == "__main__":
    main()
