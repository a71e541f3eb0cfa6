"""Random calls of the Python API and how to judge them, shared by the fuzz tests (issue 31):
test_fuzz.py (the CPU backend against the float64 oracle) and test_fuzz_gpu.py (CUDA tensors
against the CPU backend and the oracle).

A case is a dict: the function, its keyword arguments (NumPy arrays), the oracle to use, the bad
value it holds (None: a valid call), whether the library must refuse it, and how its arrays are
laid out in memory (aliases, restrided layouts, pairs packed into one buffer). run_call makes
the call on NumPy arrays, or through a backend object on another framework's tensors (CUDA), and
reports its result, its error and which arrays it changed; Worker runs calls in another process,
so that a crash fails the example instead of killing pytest.
"""
from __future__ import annotations

import faulthandler
import math
import multiprocessing
import os
import re
import signal

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import reference as ref
from conftest import assert_attention_close, assert_fp8_close, assert_lse_close

CALL_TIMEOUT_S = 120
INT32_MAX = 2**31 - 1
# "name: rule ..." where name is an argument (window_size[0], cu_seqlens_q, k_cache, ...)
ERROR_MESSAGE = re.compile(r"^[a-z_]+(\[\d\])?: \S")
NUMPY_DTYPES = {"float16": np.dtype(np.float16), "float32": np.dtype(np.float32),
                "bfloat16": np.dtype(ml_dtypes.bfloat16)}
CPU_DTYPES = ("float16", "float32")
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)


def fuzz_settings(examples):
    """examples per test, derandomized (the same examples every run) unless FLASHATTN_FUZZ_RANDOM
    is set (then with pytest --hypothesis-seed=N to repeat one); no example database."""
    return settings(max_examples=examples, deadline=None,
                    derandomize=not os.environ.get("FLASHATTN_FUZZ_RANDOM"), database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# =================================================================================================
# The worker: runs one call, reports its result, its error, and which arrays it changed
# =================================================================================================

def _apply_aliases(kwargs, aliases):
    """Arguments that share memory, made in the process that calls (pickling breaks views):
    ("same", dst, src) passes src as dst; ("view", dst, src) passes a view of src's memory with
    dst's shape."""
    for how, dst, src in aliases:
        if how == "same":
            kwargs[dst] = kwargs[src]
        else:
            shape = kwargs[dst].shape
            kwargs[dst] = kwargs[src].reshape(-1)[:math.prod(shape)].reshape(shape)


def _restride(a, layout):
    """The same values in another memory layout (made in the calling process, as aliases are):
    "pad": rows padded (row stride > head dim); "transpose": the two dims before the last stored
    swapped; "reverse": dim 0 stored backwards (a negative stride)."""
    if layout == "pad":
        buf = np.full(a.shape[:-1] + (a.shape[-1] + 8,), np.nan, a.dtype)
        buf[..., :a.shape[-1]] = a
        return buf[..., :a.shape[-1]]
    if layout == "transpose":
        return np.ascontiguousarray(a.swapaxes(-3, -2)).swapaxes(-3, -2)
    if layout == "reverse":
        return a[::-1].copy()[::-1]
    return a


def _pack(kwargs, first, second):
    """first and second as the two interleaved halves of one buffer (..., 2, heads, d), as a
    packed K/V cache or an output slot next to q: legal, since no element is shared."""
    a, b = kwargs[first], kwargs[second]
    buf = np.empty(a.shape[:-2] + (2,) + a.shape[-2:], a.dtype)
    buf[..., 0, :, :], buf[..., 1, :, :] = a, b
    kwargs[first], kwargs[second] = buf[..., 0, :, :], buf[..., 1, :, :]


def _arrays(kwargs):
    return {name: a for name, a in kwargs.items() if isinstance(a, np.ndarray)}


def prepare_kwargs(case):
    """The call's keyword arguments as fresh NumPy arrays, laid out as the case says (layouts,
    packs, aliases), so that a call may write them without changing the case."""
    kwargs = {name: (a.copy() if isinstance(a, np.ndarray) else a)
              for name, a in case["kwargs"].items()}
    for name, layout in case["layouts"].items():
        kwargs[name] = _restride(kwargs[name], layout)
    for first, second in case["packs"]:
        _pack(kwargs, first, second)
    _apply_aliases(kwargs, case["aliases"])
    return kwargs


def run_call(case, backend=None):
    """Makes the call and reports {"result", "error": (kind, message) or None, "changed": the
    arguments whose bytes changed, "caches": k_cache / v_cache after the call}, all as NumPy.

    backend None: on the NumPy arrays (the CPU backend). Otherwise an object that moves the
    arrays to its tensors (put: keyword arguments -> keyword arguments, memory shared where the
    arrays share it), reads a tensor back (get: tensor -> NumPy array) and ends the call
    (finish: -> {"status": check_device_status()'s error or None, "fatal": a backend failure
    that leaves the process unusable, or None}); the report then holds those two as well."""
    import flashattn

    if case["fn"] == "_crash_for_test":
        os.kill(os.getpid(), signal.SIGSEGV)
    flashattn.set_num_threads(case["threads"])
    kwargs = prepare_kwargs(case)
    names = list(_arrays(kwargs))
    values = (lambda a: a.copy()) if backend is None else backend.get
    if backend is not None:
        kwargs = backend.put(kwargs)
    before = {name: values(kwargs[name]) for name in names}
    result, error = None, None
    try:
        result = getattr(flashattn, case["fn"])(**kwargs)
    except Exception as e:  # noqa: BLE001 - every kind is reported to the parent
        error = (type(e).__name__, str(e))
    report = {"error": error}
    if backend is not None:
        report.update(backend.finish())
        if report["fatal"]:
            return report
        if isinstance(result, tuple):
            result = tuple(None if x is None else backend.get(x) for x in result)
        elif result is not None:
            result = backend.get(result)
    after = {name: values(kwargs[name]) for name in names}
    report.update(result=result, caches={name: after[name] for name in ("k_cache", "v_cache")
                                         if name in after},
                  changed=sorted(name for name in names
                                 if after[name].tobytes() != before[name].tobytes()))
    return report


def _serve(conn, run):
    faulthandler.enable()
    while True:
        report = run(conn.recv())
        conn.send(report)
        if report.get("fatal"):  # e.g. a CUDA error: this process's context is gone
            os._exit(3)


class Worker:
    """One process that runs calls (run: case -> report, run_call by default); restarted after
    a crash, a hang or a fatal report. context: "fork", or "spawn" where the parent must not
    have initialised CUDA in the child (the GPU fuzz)."""

    def __init__(self, run=run_call, context="fork"):
        self._ctx = multiprocessing.get_context(context)
        self._run = run
        self._start()

    def _start(self):
        self.conn, child = self._ctx.Pipe()
        self.proc = self._ctx.Process(target=_serve, args=(child, self._run), daemon=True)
        self.proc.start()
        child.close()

    def _restart(self):
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        exitcode = self.proc.exitcode
        self._start()
        return exitcode

    def run(self, case):
        """The worker's report, or {"crash": text} when it died or hung."""
        try:
            self.conn.send(case)
            if self.conn.poll(CALL_TIMEOUT_S):
                report = self.conn.recv()
                if report.get("fatal"):
                    self._restart()
                return report
            what = f"no answer within {CALL_TIMEOUT_S} s"
            self.proc.kill()
        except (EOFError, OSError):
            what = "the worker process died"
        return {"crash": what + f" (exit code {self._restart()})"}

    def close(self):
        self.proc.kill()
        self.proc.join()


# =================================================================================================
# Cases
# =================================================================================================

def _randn(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


@st.composite
def _common(draw, batch, heads, head_dim):
    """Options shared by every call (flash_attn keyword names). softmax_scale stays within 2x of
    1/sqrt(d): far sharper softmaxes would need a looser fp32 pass rule than the suite's."""
    causal = draw(st.booleans())
    side = st.one_of(st.just(-1), st.integers(0, 40), st.sampled_from([INT32_MAX, 2**40]))
    window = (draw(side), draw(side)) if draw(st.booleans()) else (-1, -1)
    alibi = draw(st.sampled_from([None, "h", "bh"]))
    factor = draw(st.sampled_from([None, None, 0.5, 2.0]))
    return dict(causal=causal, window_size=window,
                softcap=draw(st.sampled_from([0.0, 0.0, 0.7, 30.0])),
                softmax_scale=(None if factor is None else factor / math.sqrt(head_dim)),
                alibi=alibi)


def _alibi(rng, kind, batch, heads):
    if kind is None:
        return None
    return rng.uniform(0.0, 1.0, (heads,) if kind == "h" else (batch, heads)).astype(np.float32)


def _sizes(draw, dtypes):
    hk = draw(st.sampled_from([1, 2, 3]))
    return dict(hk=hk, h=hk * draw(st.sampled_from([1, 2, 4])),
                d=draw(st.sampled_from([8, 16, 20, 32, 64, 72, 128])),
                dtype=draw(st.sampled_from(list(dtypes))))


LAYOUTS = ["contiguous"] * 3 + ["pad", "transpose", "reverse"]


PACKABLE = [("k", "v"), ("q", "out"), ("k_cache", "v_cache")]


def make_case(fn, kwargs, oracle, bad=None, must_fail=False, aliases=(), threads=0, layouts=None,
          packs=()):
    """A call and how to judge it. out is NaN-poisoned, so that an unwritten row shows.
    layouts: {argument: layout} (_restride); packs: pairs stored interleaved in one buffer
    (_pack); neither where arguments alias."""
    q = kwargs.get("q")
    if "out" not in kwargs and isinstance(q, np.ndarray):
        kwargs["out"] = np.full_like(q, np.nan)
    arrays = _arrays(kwargs)
    packs = [(a, b) for a, b in packs if not aliases and a in arrays and b in arrays
             and arrays[a].ndim >= 3 and arrays[a].shape == arrays[b].shape
             and arrays[a].dtype == arrays[b].dtype]
    packed = {name for pair in packs for name in pair}
    layouts = {name: layout for name, layout in (layouts or {}).items()
               if layout != "contiguous" and name in arrays and name not in packed
               and arrays[name].ndim >= 3 and not aliases}
    return dict(fn=fn, kwargs=kwargs, oracle=oracle, bad=bad, must_fail=must_fail,
                aliases=list(aliases), threads=threads, layouts=layouts, packs=packs)


def _layouts(draw, names):
    return {name: draw(st.sampled_from(LAYOUTS)) for name in names}


def _packs(draw):
    return [pair for pair in PACKABLE if draw(st.integers(0, 2)) == 0]


# ---- dense ------------------------------------------------------------------------------------

DENSE_BAD = ["k_rank3", "heads_not_multiple", "dtype_differs", "out_is_q", "out_in_k",
             "window_below", "softcap_negative", "scale_nan", "alibi_shape", "k_none",
             "alibi_int"]


@st.composite
def dense_cases(draw, dtypes=CPU_DTYPES, bad_values=True):
    s = _sizes(draw, dtypes)
    b, sq, sk = draw(st.integers(0, 3)), draw(st.integers(0, 40)), draw(st.integers(0, 80))
    o = draw(_common(b, s["h"], s["d"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dt = s["dtype"]
    kw = dict(q=_randn(rng, (b, sq, s["h"], s["d"]), dt), k=_randn(rng, (b, sk, s["hk"], s["d"]), dt),
              v=_randn(rng, (b, sk, s["hk"], s["d"]), dt), causal=o["causal"],
              window_size=o["window_size"], softcap=o["softcap"], softmax_scale=o["softmax_scale"],
              alibi_slopes=_alibi(rng, o["alibi"], b, s["h"]), return_attn_probs=True)
    threads = draw(st.sampled_from([0, 1, 3]))
    bad = draw(st.sampled_from([None] * 3 + (DENSE_BAD if bad_values else [])))
    aliases, must_fail = [], bad is not None
    q = kw["q"]
    if bad == "k_rank3":
        kw["k"] = kw["k"][:, :, 0]
    elif bad == "heads_not_multiple":
        kw["k"] = kw["v"] = _randn(rng, (b, sk, s["h"] + 1, s["d"]), dt)
    elif bad == "dtype_differs":
        kw["v"] = kw["v"].astype("float32" if dt == "float16" else "float16")
    elif bad == "out_is_q":
        kw["out"] = q
        aliases = [("same", "out", "q")]
        must_fail = q.size > 0
    elif bad == "out_in_k" and q.size > 0:  # out a view of k's memory (k as large as q)
        group = s["h"] // s["hk"]
        kw["k"] = kw["v"] = _randn(rng, (b, sq * group, s["hk"], s["d"]), dt)
        kw["out"] = np.empty_like(q)
        aliases = [("view", "out", "k")]
    elif bad == "out_in_k":
        bad, must_fail = None, False
    elif bad == "window_below":
        kw["window_size"] = (-2, o["window_size"][1])
    elif bad == "softcap_negative":
        kw["softcap"] = -1.0
    elif bad == "scale_nan":
        kw["softmax_scale"] = float("nan")
    elif bad == "alibi_shape":
        kw["alibi_slopes"] = np.ones((s["h"] + 1,), np.float32)
    elif bad == "k_none":
        kw["k"] = None
    elif bad == "alibi_int":
        kw["alibi_slopes"] = np.ones((s["h"],), np.int32)
    return make_case("flash_attn_func", kw, "dense", bad, must_fail, aliases, threads,
                     _layouts(draw, ["q", "k", "v", "out"]), _packs(draw))


# ---- varlen -----------------------------------------------------------------------------------

VARLEN_BAD = ["cu_q_short_of_total", "cu_k_decrease", "cu_k_wraps", "max_seqlen_q_small",
              "max_seqlen_huge", "seqused_beyond", "leftpad_beyond", "page_in_use_invalid",
              "cu_float", "out_is_q"]


@st.composite
def varlen_cases(draw, dtypes=CPU_DTYPES, bad_values=True):
    s = _sizes(draw, dtypes)
    dt = s["dtype"]
    b = draw(st.integers(0, 3))
    lens_q = [draw(st.integers(0, 30)) for _ in range(b)]
    lens_k = [draw(st.integers(0, 60)) for _ in range(b)]
    paged = draw(st.booleans())
    use_seqused = b > 0 and draw(st.booleans())
    use_leftpad = b > 0 and draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ends = [int(rng.integers(0, n + 1)) if use_seqused else n for n in lens_k]
    starts = [int(rng.integers(0, e + 1)) if use_leftpad else 0 for e in ends]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    o = draw(_common(b, s["h"], s["d"]))
    kw = dict(q=_randn(rng, (int(cu_q[-1]), s["h"], s["d"]), dt), cu_seqlens_q=cu_q,
              cu_seqlens_k=cu_k,
              max_seqlen_q=max(lens_q, default=0) + draw(st.integers(0, 2)),
              max_seqlen_k=max([e - st_ for e, st_ in zip(ends, starts)], default=0)
              + draw(st.integers(0, 2)),
              causal=o["causal"], window_size=o["window_size"], softcap=o["softcap"],
              softmax_scale=o["softmax_scale"], alibi_slopes=_alibi(rng, o["alibi"], b, s["h"]),
              return_attn_probs=True)
    if paged:
        page = draw(st.sampled_from([1, 4, 16]))
        pages = [-(-n // page) for n in lens_k]
        columns = max(pages, default=0) + draw(st.integers(0, 2))
        num_pages = sum(pages) + draw(st.integers(0, 3))
        order = rng.permutation(num_pages)
        pad = -1 if draw(st.booleans()) else 0  # padding past the pages in use: -1 or page 0
        table = np.full((b, columns), pad, np.int32)
        used = 0
        for i, n in enumerate(pages):
            table[i, :n] = order[used:used + n]
            used += n
        if num_pages == 0:
            table[:] = pad
        kw["k"] = _randn(rng, (max(num_pages, 1), page, s["hk"], s["d"]), dt)
        kw["v"] = _randn(rng, kw["k"].shape, dt)
        kw["block_table"] = table
    else:
        kw["k"] = _randn(rng, (int(cu_k[-1]), s["hk"], s["d"]), dt)
        kw["v"] = _randn(rng, kw["k"].shape, dt)
    if use_seqused:
        kw["seqused_k"] = np.array(ends, np.int32)
    if use_leftpad:
        kw["leftpad_k"] = np.array(starts, np.int32)
    bad = draw(st.sampled_from([None] * 3 + (VARLEN_BAD if bad_values else [])))
    aliases, must_fail = [], True
    if bad == "cu_q_short_of_total" and kw["q"].shape[0] > 0:
        kw["cu_seqlens_q"] = cu_q.copy()
        kw["cu_seqlens_q"][-1] -= 1
    elif bad == "cu_k_decrease" and b >= 1:
        kw["cu_seqlens_k"] = cu_k.copy()
        kw["cu_seqlens_k"][1] = -5
    elif bad == "cu_k_wraps" and b >= 2:
        kw["cu_seqlens_k"] = cu_k.copy()
        kw["cu_seqlens_k"][2] = -2**31  # cu_k[2] - cu_k[1] wraps to a positive int32
    elif bad == "max_seqlen_q_small" and max(lens_q, default=0) > 0:
        kw["max_seqlen_q"] = max(lens_q) - 1
    elif bad == "max_seqlen_huge":
        kw["max_seqlen_q"] = 2**40
    elif bad == "seqused_beyond" and use_seqused:
        kw["seqused_k"] = kw["seqused_k"].copy()
        kw["seqused_k"][0] = lens_k[0] + 1
    elif bad == "leftpad_beyond" and use_leftpad:
        kw["leftpad_k"] = kw["leftpad_k"].copy()
        kw["leftpad_k"][0] = ends[0] + 1
    elif bad == "page_in_use_invalid" and paged and ends and ends[0] > starts[0]:
        kw["block_table"] = kw["block_table"].copy()
        kw["block_table"][0, (ends[0] - 1) // page] = draw(st.sampled_from([-1, kw["k"].shape[0]]))
    elif bad == "cu_float":
        kw["cu_seqlens_q"] = cu_q.astype(np.float32)
    elif bad == "out_is_q":
        kw["out"] = kw["q"]
        aliases = [("same", "out", "q")]
        must_fail = kw["q"].size > 0
    else:
        bad, must_fail = None, False
    return make_case("flash_attn_varlen_func", kw, "varlen", bad, must_fail, aliases,
                     draw(st.sampled_from([0, 1, 3])), _layouts(draw, ["q", "k", "v", "out"]),
                     _packs(draw))


# ---- kv cache -----------------------------------------------------------------------------------

KV_BAD = ["seqlens_int32_max", "seqlens_negative", "seqlens_past_capacity", "seqlens_int_huge",
          "splits_huge", "splits_129", "dup_batch_idx", "pages_shared_by_appends",
          "v_cache_is_k_cache", "rotary_short", "rotary_q_past_table", "page_in_use_invalid",
          "k_new_dtype", "leftpad_beyond", "batch_idx_out_of_range", "out_is_q"]


@st.composite
def kvcache_cases(draw, dtypes=CPU_DTYPES, bad_values=True):
    s = _sizes(draw, dtypes)
    dt, hk, d = s["dtype"], s["hk"], s["d"]
    # The bad value first: the few that need a particular call (two sequences appending, ...)
    # get one, so that every kind of bad value is drawn in a run of a few hundred examples.
    bad = draw(st.sampled_from([None] * 4 + (KV_BAD if bad_values else [])))
    two_appending = bad in ("dup_batch_idx", "pages_shared_by_appends")
    q_past_table = bad == "rotary_q_past_table"
    b = draw(st.integers(2 if two_appending else (1 if q_past_table else 0), 3))
    s_new = draw(st.sampled_from([1, 2, 4] if two_appending else [0, 0, 1, 2, 4]))
    sq = draw(st.integers(s_new + 1, 16) if q_past_table else st.sampled_from([0, 1, 1, 2, 3, 7, 16]))
    paged = {"dup_batch_idx": False, "pages_shared_by_appends": True}.get(bad, draw(st.booleans()))
    page = draw(st.sampled_from([1, 3, 8, 16])) if paged else 0
    capacity = draw(st.integers(max(s_new, 1), 48))
    if paged:
        capacity = -(-capacity // page) * page
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    seqlens = rng.integers(0, capacity - s_new + 1, b).astype(np.int32)
    if q_past_table:
        seqlens[0] = capacity - s_new  # causal q rows at capacity - s_new + i, i < sq
    o = draw(_common(b, s["h"], s["d"]))
    if q_past_table:
        o["causal"] = True
    kw = dict(q=_randn(rng, (b, sq, s["h"], d), dt), causal=o["causal"],
              window_size=o["window_size"], softcap=o["softcap"],
              softmax_scale=o["softmax_scale"], alibi_slopes=_alibi(rng, o["alibi"], b, s["h"]),
              num_splits=draw(st.sampled_from([0, 0, 1, 2, 3, 5])), return_softmax_lse=True)
    same_lengths = b > 0 and not q_past_table and draw(st.integers(0, 4)) == 0  # an int
    if same_lengths:
        seqlens[:] = seqlens[0]
    kw["cache_seqlens"] = int(seqlens[0]) if same_lengths else seqlens
    if paged:
        columns = capacity // page
        in_use = [-(-(int(n) + s_new) // page) for n in seqlens]
        num_pages = b * columns + draw(st.integers(0, 2))
        order = rng.permutation(num_pages)
        pad = -1 if draw(st.booleans()) else 0
        table = np.full((b, columns), pad, np.int32)
        for i in range(b):
            table[i, :in_use[i]] = order[i * columns:i * columns + in_use[i]]
        kw["k_cache"] = _randn(rng, (max(num_pages, 1), page, hk, d), dt)
        kw["block_table"] = table
    else:
        rows = b + draw(st.integers(0, 2))
        kw["k_cache"] = _randn(rng, (rows, capacity, hk, d), dt)
        if rows > b or draw(st.booleans()):
            kw["cache_batch_idx"] = rng.permutation(rows)[:b].astype(np.int32)
    kw["v_cache"] = _randn(rng, kw["k_cache"].shape, dt)
    if s_new or draw(st.booleans()):
        kw["k"] = _randn(rng, (b, s_new, hk, d), dt)
        kw["v"] = _randn(rng, (b, s_new, hk, d), dt)
    if b > 0 and draw(st.booleans()):
        kw["cache_leftpad"] = np.array([rng.integers(0, n + 1) for n in seqlens], np.int32)
    rotary = q_past_table or draw(st.booleans())
    if rotary:
        half = draw(st.integers(1, d // 2))
        kw["rotary_cos"] = _randn(rng, (capacity + sq, half), dt)
        kw["rotary_sin"] = _randn(rng, (capacity + sq, half), dt)
        kw["rotary_interleaved"] = draw(st.booleans())
    aliases, must_fail = [], True
    per_row = o["causal"] or o["window_size"] != (-1, -1)
    if bad == "seqlens_int32_max" and b > 0 and not same_lengths:
        kw["cache_seqlens"] = seqlens.copy()
        kw["cache_seqlens"][0] = INT32_MAX
    elif bad == "seqlens_negative" and b > 0 and not same_lengths:
        kw["cache_seqlens"] = seqlens.copy()
        kw["cache_seqlens"][-1] = -1
    elif bad == "seqlens_past_capacity" and b > 0 and not same_lengths:
        kw["cache_seqlens"] = seqlens.copy()
        kw["cache_seqlens"][0] = capacity - s_new + 1
    elif bad == "seqlens_int_huge":
        kw["cache_seqlens"] = 2**40
    elif bad == "splits_huge":
        kw["num_splits"] = 2**40
    elif bad == "splits_129":
        kw["num_splits"] = 129
    elif bad == "dup_batch_idx" and not paged and s_new > 0 and b >= 2:
        kw["cache_batch_idx"] = np.zeros(b, np.int32)
    elif bad == "pages_shared_by_appends" and paged and s_new > 0 and b >= 2:
        table = kw["block_table"].copy()
        first = [int(n) // page for n in seqlens]
        table[1, first[1]] = table[0, first[0]]
        kw["block_table"] = table
    elif bad == "v_cache_is_k_cache" and kw["k_cache"].size > 0:
        aliases = [("same", "v_cache", "k_cache")]
        kw["v_cache"] = kw["k_cache"]
        must_fail = s_new > 0 and b > 0
    elif bad == "rotary_short" and rotary:
        kw["rotary_cos"] = kw["rotary_cos"][:capacity - 1]
        kw["rotary_sin"] = kw["rotary_sin"][:capacity - 1]
    elif bad == "rotary_q_past_table" and rotary and sq > 0 and b > 0 and not same_lengths:
        kw["rotary_cos"] = kw["rotary_cos"][:capacity]
        kw["rotary_sin"] = kw["rotary_sin"][:capacity]
        last = max(int(n) + (sq - 1 if per_row else 0) for n in seqlens)
        must_fail = last >= capacity
    elif bad == "page_in_use_invalid" and paged and b > 0:
        end = int(seqlens[0]) + s_new
        start = int(kw["cache_leftpad"][0]) if "cache_leftpad" in kw else 0
        if end > start:
            kw["block_table"] = kw["block_table"].copy()
            kw["block_table"][0, (end - 1) // page] = -1
        else:
            bad, must_fail = None, False
    elif bad == "k_new_dtype" and "k" in kw:
        kw["k"] = kw["k"].astype("float32" if dt == "float16" else "float16")
    elif bad == "leftpad_beyond" and "cache_leftpad" in kw:
        kw["cache_leftpad"] = kw["cache_leftpad"].copy()
        kw["cache_leftpad"][0] = seqlens[0] + 1
    elif bad == "batch_idx_out_of_range" and "cache_batch_idx" in kw and b > 0:
        kw["cache_batch_idx"] = kw["cache_batch_idx"].copy()
        kw["cache_batch_idx"][0] = kw["k_cache"].shape[0]
    elif bad == "out_is_q":
        kw["out"] = kw["q"]
        aliases = [("same", "out", "q")]
        must_fail = kw["q"].size > 0
    else:
        bad, must_fail = None, False
    return make_case("flash_attn_with_kvcache", kw, "kvcache", bad, must_fail, aliases,
                     draw(st.sampled_from([0, 1, 3])),
                     _layouts(draw, ["q", "k_cache", "v_cache", "k", "v", "out"]), _packs(draw))


# ---- FP8 (e4m3) --------------------------------------------------------------------------------

BF16 = np.dtype(ml_dtypes.bfloat16)


@st.composite
def fp8_cases(draw):
    """A valid 16-bit call of the three kinds made FP8 as FlashAttention-3 takes it (D-64): dense
    and varlen with e4m3 q, k, v (out bf16); a KV cache in e4m3 under a bf16 / fp16 q, or an
    e4m3 q too (out bf16; rotary then is not supported), new rows in out's dtype. Descales: none,
    a scalar (shape () or (1)), or (batch, KV heads) (varlen: not per sequence). e4m3(x) of
    N(0, 1) values, descales in [0.25, 2]."""
    call = draw(st.sampled_from(["dense", "varlen", "kvcache"]))
    dtypes = ("bfloat16", "float16") if call == "kvcache" else ("bfloat16",)
    base = draw({"dense": dense_cases, "varlen": varlen_cases, "kvcache": kvcache_cases}[call](
        dtypes=dtypes, bad_values=False))
    kw = dict(base["kwargs"])
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["none", "scalar", "scalar1"] + (["bhk"] if call != "varlen" else [])))

    def descale(hk):
        if kind == "none":
            return None
        if kind == "bhk":
            return rng.uniform(0.25, 2.0, (kw["q"].shape[0], hk)).astype(np.float32)
        return np.full((1,) if kind == "scalar1" else (), rng.uniform(0.25, 2.0), np.float32)

    def e4m3(x):
        return x.astype(np.float32).astype(E4M3)

    hk = kw["k_cache" if call == "kvcache" else "k"].shape[-2]
    quantized = ["k_cache", "v_cache"] if call == "kvcache" else ["q", "k", "v"]
    if call == "kvcache" and kw["q"].dtype == BF16 and draw(st.booleans()):
        quantized.append("q")
    for name in quantized:
        kw[name] = e4m3(kw[name])
        kw[name.replace("_cache", "") + "_descale"] = descale(hk)
    kw["out"] = np.full(kw["q"].shape, np.nan, BF16 if kw["q"].dtype == E4M3 else kw["q"].dtype)
    return make_case(base["fn"], kw, base["oracle"], threads=base["threads"],
                     layouts=base["layouts"], packs=base["packs"])


# =================================================================================================
# The oracle and the property
# =================================================================================================

def _oracle_options(kw, lowp):
    return dict(scale=kw.get("softmax_scale"), causal=bool(kw.get("causal")),
                window=tuple(kw.get("window_size", (-1, -1))), softcap=kw.get("softcap", 0.0),
                lowp=lowp)


# Mantissa bits and smallest normal exponent of the storage types, for cache rows that rounding
# may move by one step (rotary keys): float16, bfloat16, float32, e4m3.
_STEP = {np.dtype(np.float16): (10, -14), np.dtype(ml_dtypes.bfloat16): (7, -126),
         np.dtype(np.float32): (23, -126), E4M3: (3, ref.E4M3_MIN_NORMAL_EXP)}


def is_fp8(case):
    kw = case["kwargs"]
    return any(isinstance(kw.get(n), np.ndarray) and kw[n].dtype == E4M3
               for n in ("q", "k", "k_cache"))


def oracle(case, lowp):
    """reference.py on the case's inputs (e4m3 ones dequantized): out, lse, and for a KV cache
    the caches after the appends (else None, None); lowp: the naive same-dtype variant."""
    kw = dict(case["kwargs"])
    _apply_aliases(kw, case["aliases"])
    opts = _oracle_options(kw, lowp)
    q = kw["q"]
    if case["oracle"] in ("dense", "kvcache") and q.shape[0] == 0:  # reference.py stacks batches
        empty = (np.zeros(q.shape), np.zeros((0, q.shape[2], q.shape[1])))
        if case["oracle"] == "dense":
            return empty + (None, None)
        return empty + (kw["k_cache"].astype(np.float64), kw["v_cache"].astype(np.float64))
    if case["oracle"] in ("dense", "varlen"):
        q, k, v = (ref.dequantize(kw[n], kw.get(f"{n}_descale")) for n in ("q", "k", "v"))
    if case["oracle"] == "dense":
        return ref.dense(q, k, v, alibi=kw.get("alibi_slopes"), **opts) + (None, None)
    if case["oracle"] == "varlen":
        return ref.varlen(q, k, v, kw["cu_seqlens_q"], kw["cu_seqlens_k"],
                          block_table=kw.get("block_table"), seqused_k=kw.get("seqused_k"),
                          leftpad_k=kw.get("leftpad_k"), alibi=kw.get("alibi_slopes"),
                          **opts) + (None, None)
    seqlens = kw.get("cache_seqlens")
    if isinstance(seqlens, int):
        seqlens = np.full(kw["q"].shape[0], seqlens, np.int32)
    causal, window = opts.pop("causal"), opts.pop("window")
    return ref.kvcache(kw["q"], kw["k_cache"], kw["v_cache"], k_new=kw.get("k"),
                       v_new=kw.get("v"), cos=kw.get("rotary_cos"), sin=kw.get("rotary_sin"),
                       cache_seqlens=seqlens, cache_batch_idx=kw.get("cache_batch_idx"),
                       cache_leftpad=kw.get("cache_leftpad"), block_table=kw.get("block_table"),
                       causal=causal, window=window,
                       rotary_interleaved=kw.get("rotary_interleaved", True),
                       alibi=kw.get("alibi_slopes"), dtype=np.dtype(kw["out"].dtype),
                       cache_e4m3=kw["k_cache"].dtype == E4M3, q_descale=kw.get("q_descale"),
                       k_descale=kw.get("k_descale"), v_descale=kw.get("v_descale"), **opts)


def describe(case):
    kw = case["kwargs"]
    parts = [case["fn"], f"bad={case['bad']}", f"threads={case['threads']}",
             f"layouts={case['layouts']}", f"packs={case['packs']}"]
    for name, x in kw.items():
        if isinstance(x, np.ndarray):
            parts.append(f"{name}={x.dtype}{x.shape}" + (f"={x.tolist()}" if x.dtype == np.int32 and x.size <= 12 else ""))
        else:
            parts.append(f"{name}={x!r}")
    return ", ".join(parts)


def check_refused(report, what, kinds=("ValueError", "TypeError")):
    """A clear refusal: an error of one of kinds whose message starts with the argument's name,
    and no argument written."""
    kind, message = report["error"]
    assert kind in kinds, f"{kind}: {message}\n{what}"
    assert ERROR_MESSAGE.match(message), f"unclear error {kind}: {message!r}\n{what}"
    assert not report["changed"], f"{report['changed']} written by a refused call\n{what}"


def steps(x, dtype, count):
    """count steps of dtype's rounding at the magnitudes x (float64)."""
    mantissa, min_exp = _STEP[np.dtype(dtype)]
    binade = np.maximum(np.frexp(np.abs(x))[1] - 1, min_exp)
    return count * np.ldexp(1.0, binade - mantissa)


def check_against_oracle(case, report, what):
    """A call that ran: out and LSE within the suite's pass rule (the FP8 bound for e4m3
    inputs), only out (and the caches of a KV-cache call) written, the caches as the oracle's
    appends leave them (within a step of the storage type where rotary or rounding may differ)."""
    dtype = np.dtype(case["kwargs"]["q"].dtype)
    out, lse = report["result"][:2]
    r_out, r_lse, r_kc, r_vc = oracle(case, None)
    if is_fp8(case):
        assert_fp8_close(out, r_out, what=f"out\n{what}")
        assert_lse_close(lse, r_lse, np.float16)  # e4m3 values are exact in 16 bits
    else:
        naive = oracle(case, dtype)[0]
        assert_attention_close(out, r_out, naive, dtype, what=f"out\n{what}")
        assert_lse_close(lse, r_lse, dtype)
    allowed = {"out"} | ({"k_cache", "v_cache"} if r_kc is not None else set())
    assert set(report["changed"]) <= allowed, f"{report['changed']} written\n{what}"
    if r_kc is None:
        return
    cache_dtype = case["kwargs"]["k_cache"].dtype
    for name, r in (("k_cache", r_kc), ("v_cache", r_vc)):
        got = report["caches"][name].astype(np.float64)
        if cache_dtype == E4M3:  # quantized exactly as the oracle does; rotated keys: one step
            rotated = name == "k_cache" and "rotary_cos" in case["kwargs"]
            ok = np.abs(got - r) <= steps(r, E4M3, 1 if rotated else 0)
        else:
            tol = {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 1e-6}.get(cache_dtype, 1.6e-2)
            ok = np.isclose(got, r, rtol=tol, atol=tol)
        assert ok.all(), f"{name} differs from the oracle's appends\n{what}"
