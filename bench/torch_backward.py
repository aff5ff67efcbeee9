#!/usr/bin/python3
"""Times the backward pass of attention in one process: sdpa_mha_backward_f32 (through ctypes,
from the built library) against PyTorch's CPU autograd of the same attention,
softmax(Q K^T / sqrt(d) [+ causal mask]) V, on the same tensors, alternating the two.

    /usr/bin/python3 bench/torch_backward.py [--lib build/libsdpa.so.1] [--threads 1]
        [--reps 7] [--shape b1h8q1024k1024d128] [--shape b1h8q1024k1024d128causal] ...

Needs Debian's python3-torch (1.13: no fused attention, so autograd differentiates the matmul,
softmax, matmul graph). GFLOP/s counts FlashAttention-2's 10 len_q len_kv d per head, the pairs
a row sees only under causality, for both. Each figure is the median of --reps timings of one
backward; PyTorch's graph (forward) is built once, untimed, and its backward runs with
retain_graph. The gradients of the two are compared before timing. Both run on --threads
threads, PyTorch's OpenBLAS included; "cores" is PyTorch's CPU time over its wall time, the cores
it kept busy (1.00 on one thread)."""
import argparse
import ctypes
import os
import re
import statistics
import sys
import time

SDPA_CAUSAL = 1
SizeT3 = ctypes.c_size_t * 3


class Desc(ctypes.Structure):  # sdpa_mha_desc, v2 (include/sdpa.h)
    _fields_ = [("struct_size", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("batch", ctypes.c_size_t), ("heads_q", ctypes.c_size_t),
                ("heads_kv", ctypes.c_size_t), ("len_q", ctypes.c_size_t),
                ("len_kv", ctypes.c_size_t), ("d_k", ctypes.c_size_t), ("d_v", ctypes.c_size_t),
                ("scale", ctypes.c_float), ("q_stride", SizeT3), ("k_stride", SizeT3),
                ("v_stride", SizeT3), ("out_stride", SizeT3), ("mask", ctypes.c_void_p),
                ("mask_stride", SizeT3), ("q_type", ctypes.c_uint32),
                ("kv_type", ctypes.c_uint32), ("out_type", ctypes.c_uint32),
                ("reserved", ctypes.c_uint32), ("lse", ctypes.c_void_p),
                ("lse_stride", ctypes.c_size_t * 2)]


class Grads(ctypes.Structure):  # sdpa_mha_grads
    _fields_ = [("struct_size", ctypes.c_uint32), ("reserved", ctypes.c_uint32),
                ("dq", ctypes.c_void_p), ("dk", ctypes.c_void_p), ("dv", ctypes.c_void_p),
                ("dq_stride", SizeT3), ("dk_stride", SizeT3), ("dv_stride", SizeT3),
                ("dout", ctypes.c_void_p), ("dout_stride", SizeT3)]


def parse_shape(text):
    m = re.fullmatch(r"b(\d+)h(\d+)q(\d+)k(\d+)d(\d+)(causal)?", text)
    if not m:
        sys.exit("bad shape %r (b1h8q1024k1024d128[causal])" % text)
    b, h, lq, lk, d = map(int, m.groups()[:5])
    return b, h, lq, lk, d, m.group(6) is not None


def ptr(t):
    return ctypes.c_void_p(t.data_ptr())


def median_seconds(fns, reps):
    """The median time of each of fns, run in turn reps times (so that a change in the machine's
    load falls on both), and the median of its process CPU time over that time: the cores it
    kept busy."""
    times = [[] for _ in fns]
    cores = [[] for _ in fns]
    for _ in range(reps):
        for f, t, c in zip(fns, times, cores):
            start, cpu = time.perf_counter(), time.process_time()
            f()
            t.append(time.perf_counter() - start)
            c.append((time.process_time() - cpu) / t[-1])
    return [statistics.median(t) for t in times], [statistics.median(c) for c in cores]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default="build/libsdpa.so.1")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--shape", action="append")
    a = ap.parse_args()
    # torch.set_num_threads sets OpenMP's threads, not those of the pthreads OpenBLAS that
    # Debian's torch calls for its matmuls, which takes its count from the environment as it
    # loads (unset: every core): set before the import
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[var] = str(a.threads)
    import torch  # pylint: disable=import-outside-toplevel
    shapes = a.shape or ["b1h8q1024k1024d128", "b1h8q1024k1024d64", "b1h8q1024k1024d128causal"]
    lib = ctypes.CDLL(a.lib)
    lib.sdpa_backend.restype = ctypes.c_char_p
    lib.sdpa_version.restype = ctypes.c_char_p
    lib.sdpa_set_num_threads(ctypes.c_size_t(a.threads))
    torch.set_num_threads(a.threads)
    print("sdpa %s (%s), torch %s, %d thread(s); median of %d backward passes each"
          % (lib.sdpa_version().decode(), lib.sdpa_backend().decode(), torch.__version__,
             a.threads, a.reps))
    print("%-28s %10s %8s %10s %8s %6s %10s" % ("shape", "sdpa ms", "GFLOP/s", "torch ms",
                                                "GFLOP/s", "cores", "sdpa/torch"))
    torch.manual_seed(0)
    for text in shapes:
        b, h, lq, lk, d, causal = parse_shape(text)
        q, k, v, g = (torch.randn(b, h, n, d) for n in (lq, lk, lk, lq))
        scale = d ** -0.5
        out = torch.empty(b, h, lq, d)
        lse = torch.empty(b, h, lq)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        desc = Desc()
        lib.sdpa_mha_desc_dense(ctypes.byref(desc), *(ctypes.c_size_t(x) for x in
                                                      (b, h, h, lq, lk, d, d)),
                                ctypes.c_float(0.0), ctypes.c_uint32(SDPA_CAUSAL if causal else 0))
        desc.struct_size = ctypes.sizeof(Desc)
        desc.lse = ptr(lse).value
        desc.lse_stride[0], desc.lse_stride[1] = h * lq, lq
        grads = Grads(ctypes.sizeof(Grads), 0, ptr(dq).value, ptr(dk).value, ptr(dv).value,
                      desc.q_stride, desc.k_stride, desc.v_stride, ptr(g).value, desc.out_stride)
        if lib.sdpa_mha_f32(ctypes.byref(desc), ptr(out), ptr(q), ptr(k), ptr(v)) != 0:
            sys.exit("sdpa_mha_f32 failed")

        def sdpa():
            if lib.sdpa_mha_backward_f32(ctypes.byref(desc), ctypes.byref(grads), ptr(q), ptr(k),
                                         ptr(v), ptr(out)) != 0:
                sys.exit("sdpa_mha_backward_f32 failed")

        tq, tk, tv = (x.clone().requires_grad_() for x in (q, k, v))
        s = torch.matmul(tq, tk.transpose(-1, -2)) * scale
        if causal:  # bottom-right aligned, as sdpa's SDPA_CAUSAL
            keep = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
            s = s.masked_fill(~keep, float("-inf"))
        tout = torch.matmul(torch.softmax(s, dim=-1), tv)

        def torch_backward():
            tq.grad = tk.grad = tv.grad = None
            tout.backward(g, retain_graph=True)

        sdpa()
        torch_backward()
        for name, mine, theirs in (("dq", dq, tq.grad), ("dk", dk, tk.grad), ("dv", dv, tv.grad)):
            err = (mine - theirs).abs().max().item() / max(theirs.abs().max().item(), 1e-30)
            if err > 1e-4:
                sys.exit("%s %s: sdpa and torch differ by %.3g of the largest" % (text, name, err))
        pairs = lq * (lq + 1) / 2 if causal and lq == lk else lq * lk
        flops = 10.0 * b * h * pairs * d
        (ts, tt), (_, cores) = median_seconds([sdpa, torch_backward], a.reps)
        print("%-28s %10.2f %8.1f %10.2f %8.1f %6.2f %9.2fx" % (text, ts * 1e3, flops / ts * 1e-9,
                                                             tt * 1e3, flops / tt * 1e-9, cores,
                                                             tt / ts))


if __name__ == "__main__":
    main()
