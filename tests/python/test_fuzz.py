"""Property-based tests (hypothesis) of the Python API on the CPU backend (issue 31).

Random shapes and options (causal, window, softcap, ALiBi, GQA, varlen, KV cache, paged, splits,
append, rotary), some with one bad value, go through flashattn's calls. Each call must either

* return what the float64 oracle (reference.py) computes, within the suite's pass rule (and, for
  a KV cache, leave the cache as the oracle's appends do) -- which a call without a bad value
  must do (so that over-strict validation fails too) --, or
* raise ValueError / TypeError whose message starts with an argument name, with every array of
  the call left as it was;

and a bad value the library must refuse (marked so by its generator) must be refused.

The calls run in a worker process (fork), so that a crash fails the example instead of killing
pytest: the parent sees the worker die, reports the case and the signal, and starts a new one.
faulthandler prints the worker's stack on a fatal signal. The cases, the worker and the oracle
live in fuzz_cases.py (test_fuzz_gpu.py runs the same cases on CUDA tensors).

Runtime is bounded for CI (2 cores): FLASHATTN_FUZZ_EXAMPLES examples per test (default 1000),
derandomized (the same examples every run), no example database. For a longer local search:
FLASHATTN_FUZZ_EXAMPLES=5000 FLASHATTN_FUZZ_RANDOM=1 pytest test_fuzz.py --hypothesis-seed=7
"""
from __future__ import annotations

import os

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
pytest.importorskip("ml_dtypes")
from hypothesis import given  # noqa: E402

from fuzz_cases import (Worker, check_against_oracle, check_refused, dense_cases,  # noqa: E402
                        describe, fuzz_settings, kvcache_cases, make_case, varlen_cases)

FUZZ = fuzz_settings(int(os.environ.get("FLASHATTN_FUZZ_EXAMPLES", "1000")))


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


def check_case(worker, case):
    report = worker.run(case)
    what = describe(case)
    outcome = "refused" if report.get("error") else "ran"
    hypothesis.event(f"{case['bad'] or 'valid'}: {outcome}")
    assert "crash" not in report, f"crash: {report['crash']}\n{what}"
    if case["bad"] is None:
        assert report["error"] is None, f"a valid call was refused: {report['error']}\n{what}"
    if report["error"] is not None:
        check_refused(report, what)
        return
    assert not case["must_fail"], f"bad input accepted ({case['bad']})\n{what}"
    check_against_oracle(case, report, what)


# =================================================================================================
# Tests
# =================================================================================================

@FUZZ
@given(case=dense_cases())
def test_fuzz_dense(worker, case):
    check_case(worker, case)


@FUZZ
@given(case=varlen_cases())
def test_fuzz_varlen(worker, case):
    check_case(worker, case)


@FUZZ
@given(case=kvcache_cases())
def test_fuzz_kvcache(worker, case):
    check_case(worker, case)


def test_worker_reports_a_crash(worker):
    """The harness itself: a worker killed by a signal is reported, and the next call runs."""
    report = worker.run(make_case("_crash_for_test", {}, None))
    assert "crash" in report and "died" in report["crash"], report
    q = np.ones((1, 2, 1, 8), np.float16)
    again = worker.run(make_case("flash_attn_func", dict(q=q, k=q, v=q), "dense"))
    assert again["error"] is None and again["result"].shape == q.shape
