"""Shared pytest setup for the flashattn Python tests.

Run from the repo root with the package importable, e.g.
    PYTHONPATH=build-python/site python -m pytest tests/python        (cmake build of python/)
    pip install . && python -m pytest tests/python              (installed)
GPU tests carry the marker `gpu` (deselect with -m "not gpu") and skip themselves when torch
with CUDA, or a CUDA build of flashattn, is missing.
"""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # `import reference`


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA device, torch with CUDA, and flashattn built with CUDA")


# Absolute floor of the pass rule max|impl - f64| <= 2 max|naive - f64| + floor, per dtype:
# a few units in the last place of outputs of magnitude ~1 (bfloat16: ml_dtypes NumPy arrays,
# as test_fuzz_gpu.py passes them; the LSE is fp32 whatever the inputs).
FLOOR = {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 1e-5}
LSE_FLOOR = {np.dtype(np.float16): 1e-3, np.dtype(np.float32): 1e-5}
try:
    import ml_dtypes

    FLOOR[np.dtype(ml_dtypes.bfloat16)] = 1.6e-2
    LSE_FLOOR[np.dtype(ml_dtypes.bfloat16)] = 1e-3
except ImportError:
    pass


def assert_attention_close(out, ref, naive, dtype, what="out"):
    """FlashAttention's pass rule against the float64 oracle."""
    out = np.asarray(out, np.float64)
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != {ref.shape}"
    assert np.isfinite(out).all(), f"{what}: non-finite values (unwritten or NaN)"
    err = np.abs(out - ref).max(initial=0.0)
    naive_err = np.abs(naive - ref).max(initial=0.0)
    bound = 2 * naive_err + FLOOR[np.dtype(dtype)]
    assert err <= bound, f"{what}: max error {err:.3g} > bound {bound:.3g} (naive {naive_err:.3g})"


def assert_lse_close(lse, ref, dtype):
    lse = np.asarray(lse, np.float64)
    assert lse.shape == ref.shape, f"lse: shape {lse.shape} != {ref.shape}"
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref)), "lse: -inf rows differ"
    fin = np.isfinite(ref)
    assert np.isfinite(lse[fin]).all()
    err = np.abs(lse[fin] - ref[fin]).max(initial=0.0)
    assert err <= LSE_FLOOR[np.dtype(dtype)] * max(1.0, np.abs(ref[fin]).max(initial=1.0)), \
        f"lse: max error {err:.3g}"


# The FP8 bound: e4m3 inputs go to the oracle dequantized (the same values the library reads),
# so what remains is the bf16/fp16 compute and output rounding:
# max|impl - f64| <= FP8_RTOL * max|f64|.
FP8_RTOL = 2e-2


def assert_fp8_close(out, ref, what="out"):
    """The FP8 bound, on the finite entries of ref; the non-finite ones (LSE -inf) must match."""
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != {ref.shape}"
    fin = np.isfinite(ref)
    assert np.array_equal(out[~fin], ref[~fin]), f"{what}: non-finite entries differ"
    assert np.isfinite(out[fin]).all(), f"{what}: non-finite values (unwritten or NaN)"
    err = np.abs(out[fin] - ref[fin]).max(initial=0.0)
    bound = FP8_RTOL * np.abs(ref[fin]).max(initial=0.0)
    assert err <= bound, f"{what}: max error {err:.3g} > FP8 bound {bound:.3g}"


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
