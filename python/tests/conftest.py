"""Shared by the NumPy and torch tests: a float64 reference of attention, written from the
textbook formula independently of the package, and the summary line meson's test log keeps."""

import zlib

import numpy as np
import pytest


def pytest_addoption(parser):
    parser.addoption("--sdpa-synthesis", action="store_true",
                     help="end with the Criterion-style summary line scripts/count_tests.py reads")


_counts = {"passed": 0, "failed": 0, "skipped": []}


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        if report.skipped:
            _counts["skipped"].append(f"{report.nodeid}: {report.longrepr[2]}")
        elif report.failed:
            _counts["failed"] += 1
        elif report.when == "call":
            _counts["passed"] += 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if config.getoption("--sdpa-synthesis"):
        for s in _counts["skipped"]:
            terminalreporter.write_line(f"[SKIP] {s}")
        p, f = _counts["passed"], _counts["failed"]
        terminalreporter.write_line(
            f"Synthesis: Tested: {p + f} | Passing: {p} | Failing: {f} | Crashing: 0")


def reference(q, k, v, causal=False, mask=None, scale=None, layout="bhsd"):
    """(out, lse) in float64 for 4-d or 2-d inputs; out in q's layout, lse (batch, heads, len_q).
    mask: bool (True keeps) or float (added), broadcast to (batch, heads, len_q, len_kv)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    two_d = q.ndim == 2
    if two_d:
        q, k, v = q[None, None], k[None, None], v[None, None]
    elif layout == "bshd":
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1])
    s = scale * (q @ k.swapaxes(-1, -2))
    lq, lkv = s.shape[-2:]
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype == bool:
            s = np.where(mask, s, -np.inf)
        else:
            s = s + mask.astype(np.float64)
    if causal:
        i = np.arange(lq)[:, None]
        j = np.arange(lkv)[None, :]
        s = np.where(j <= i + (lkv - lq), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    seen = np.isfinite(m)
    m = np.where(seen, m, 0.0)
    e = np.exp(s - m)
    z = e.sum(axis=-1, keepdims=True)
    p = np.where(seen, e / np.where(seen, z, 1.0), 0.0)
    out = p @ v
    lse = np.where(seen, np.log(np.where(seen, z, 1.0)) + m, -np.inf)[..., 0]
    if two_d:
        return out[0, 0], lse[0, 0]
    if layout == "bshd":
        out = out.transpose(0, 2, 1, 3)
    return out, lse


@pytest.fixture
def rng(request):
    # one seed per test, stable across runs
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
