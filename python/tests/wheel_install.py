"""Installs the package as README says, with pip into a fresh virtual environment, offline
(--no-build-isolation --no-index), and uses it there: the wheel must hold the modules, the
helper and libsdpa.so.1 beside them, and load that library without SDPA_LIBRARY.

    python3 python/tests/wheel_install.py SOURCE_DIR

Exits 77 (skipped) when this Python has no venv or pip module."""

import importlib.util
import os
import subprocess
import sys
import tempfile

CHECK = """
import os, numpy as np, sdpa
here = os.path.dirname(sdpa.__file__)
assert sdpa.library_path() == os.path.join(here, "libsdpa.so.1"), sdpa.library_path()
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 4, 9, 32), dtype=np.float32) for _ in range(3))
out = sdpa.attention(q, k, v, causal=True)
s = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) / np.sqrt(32)
s = np.where(np.tril(np.ones((9, 9), bool)), s, -np.inf)
p = np.exp(s - s.max(-1, keepdims=True))
ref = (p / p.sum(-1, keepdims=True)) @ v
assert np.abs(out - ref).max() <= 1e-5 * np.abs(v).max(), np.abs(out - ref).max()
print("installed sdpa", sdpa.version(), "from", here, "backend", sdpa.backend())
"""


def main():
    src = os.path.abspath(sys.argv[1])
    for module in ("venv", "pip", "mesonpy"):
        if importlib.util.find_spec(module) is None:
            print(f"skipped: this Python has no {module} module")
            return 77
    env = {k: v for k, v in os.environ.items()
           if k not in ("SDPA_LIBRARY", "PYTHONPATH", "LD_LIBRARY_PATH")}
    with tempfile.TemporaryDirectory() as tmp:
        venv = os.path.join(tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True)
        py = os.path.join(venv, "bin", "python")
        subprocess.run([py, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-index",
                        src], check=True, env=env, cwd=tmp)
        subprocess.run([py, "-c", CHECK], check=True, env=env, cwd=tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
