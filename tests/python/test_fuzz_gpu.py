"""GPU fuzz (issue 31, marker gpu): the random calls of test_fuzz.py (fuzz_cases.py), in fp16 and
bf16, and FP8 (e4m3) ones, on torch CUDA tensors and on the CPU backend (NumPy), judged together
(fuzz_device.check_pair):

* a call the CPU backend runs, the GPU runs too: both within the suite's pass rule against the
  float64 oracle (conftest.py; the FP8 bound for e4m3 inputs), the same -inf LSE rows, the
  caches after an append equal (rotated keys: within one step of the storage type), no index
  fault reported by check_device_status();
* a call the CPU backend refuses, the GPU refuses with the same kind of error naming the same
  argument, writing nothing -- except a bad value in an index tensor, which only the kernels
  see on the GPU (docs/DECISIONS.md D-61): there the call may run, and check_device_status()
  names an index argument if it reports anything (test_index_faults_gpu.py holds the exact
  contract of each such value);
* no crash, no CUDA error (the calls run in a spawned worker process, restarted after either).

The inputs keep the CPU cases' memory layouts (padded and transposed strides, packed pairs,
aliases) on the device. Skipped cleanly without torch CUDA or a CUDA build of flashattn.

FLASHATTN_FUZZ_GPU_EXAMPLES examples per test (default 300; the four tests take 32 s with
FLASHATTN_FUZZ_DEVICE=cpu on 2 cores, the GPU run is yet to be timed), derandomized
(FLASHATTN_FUZZ_RANDOM=1 for fresh ones). FLASHATTN_FUZZ_DEVICE=cpu (torch CPU tensors) or numpy
(the CPU backend twice) runs the same harness without a GPU.
"""
from __future__ import annotations

import functools
import os

import pytest

hypothesis = pytest.importorskip("hypothesis")
pytest.importorskip("ml_dtypes")
from hypothesis import given  # noqa: E402

import flashattn  # noqa: E402
from fuzz_cases import (Worker, dense_cases, fp8_cases, fuzz_settings,  # noqa: E402
                        kvcache_cases, varlen_cases)
from fuzz_device import check_pair, run_pair  # noqa: E402

DEVICE = os.environ.get("FLASHATTN_FUZZ_DEVICE", "cuda")
DTYPES = ("float16", "bfloat16")
FUZZ = fuzz_settings(int(os.environ.get("FLASHATTN_FUZZ_GPU_EXAMPLES", "300")))

pytestmark = [pytest.mark.gpu]
if DEVICE != "numpy":
    torch = pytest.importorskip("torch")
    if DEVICE.startswith("cuda"):
        pytestmark += [
            pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.cuda is not available"),
            pytest.mark.skipif(not flashattn.cuda_available(), reason="flashattn built without CUDA"),
        ]


@pytest.fixture(scope="module")
def worker():
    # spawn: CUDA is initialised in the worker alone, and a worker whose context a CUDA error
    # broke is replaced by a fresh one
    w = Worker(functools.partial(run_pair, device=DEVICE), "fork" if DEVICE == "numpy" else "spawn")
    yield w
    w.close()


def check(worker, case):
    check_pair(case, worker.run(case), DEVICE, hypothesis.event)


@FUZZ
@given(case=dense_cases(dtypes=DTYPES))
def test_fuzz_gpu_dense(worker, case):
    check(worker, case)


@FUZZ
@given(case=varlen_cases(dtypes=DTYPES))
def test_fuzz_gpu_varlen(worker, case):
    check(worker, case)


@FUZZ
@given(case=kvcache_cases(dtypes=DTYPES))
def test_fuzz_gpu_kvcache(worker, case):
    check(worker, case)


@FUZZ
@given(case=fp8_cases())
def test_fuzz_gpu_fp8(worker, case):
    check(worker, case)
