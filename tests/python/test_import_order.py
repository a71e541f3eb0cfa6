"""flashattn in one process with torch, CuPy and JAX, imported in either order (issue 28).

Each order runs in a fresh interpreter (import_order.py), since the crash this guards against
happens at import or at the first call. Frameworks that are not installed are skipped.
"""
import importlib.util
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("framework", ["torch", "cupy", "jax"])
@pytest.mark.parametrize("first", ["flashattn", "framework"])
def test_import_order(framework, first):
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed")
    order = ["flashattn", framework] if first == "flashattn" else [framework, "flashattn"]
    run = subprocess.run([sys.executable, os.path.join(HERE, "import_order.py"), ",".join(order)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (
        f"{' -> '.join(order)}: exit {run.returncode}\n{run.stdout}\n{run.stderr}")
