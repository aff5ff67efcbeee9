"""Runs the torch tests (and those of the transformers integration) with the interpreter of the
virtual environment scripts/install-torch2 makes, where PyTorch 2.x and transformers live:

    python3 python/tests/torch2_run.py PYTEST_ARGS...

The environment is $SDPA_TORCH2_VENV, default /opt/sdpa-py. Exits 77 (skipped), saying why,
when it is missing or its torch is not 2.x or does not import."""

import os
import subprocess
import sys

venv = os.environ.get("SDPA_TORCH2_VENV", "/opt/sdpa-py")
python = os.path.join(venv, "bin", "python")
if not os.access(python, os.X_OK):
    print(f"skipped: no virtual environment at {venv} (scripts/install-torch2 makes it)")
    sys.exit(77)
probe = subprocess.run([python, "-c", "import torch, transformers; print(torch.__version__)"],
                       capture_output=True, text=True)
if probe.returncode != 0:
    last = (probe.stderr.strip().splitlines() or ["no message"])[-1]
    print(f"skipped: torch or transformers does not import in {venv}: {last}")
    sys.exit(77)
if not probe.stdout.startswith("2."):
    print(f"skipped: {venv} holds torch {probe.stdout.strip()}, not 2.x")
    sys.exit(77)
print(f"torch {probe.stdout.strip()} from {venv}", flush=True)
os.execv(python, [python, "-m", "pytest"] + sys.argv[1:])
