"""Python argument conversion and the reliability rules of issue 31, on NumPy (CPU).

Each bad argument raises ValueError or TypeError whose message starts with the argument's name
(never the extension's signature listing or NumPy's OverflowError), and no array of the call
is written. Legal inputs next to the refused ones (a huge window, a block_table padded with -1,
K/V caches interleaved in one buffer) keep working.
"""
import re

import numpy as np
import os

import pytest

import flashattn
import reference as ref
from conftest import assert_attention_close

F16 = np.float16


def randn(rng, shape, dtype=F16):
    return rng.standard_normal(shape).astype(dtype)


def raises_named(exc, name, call, *arrays):
    """call() raises exc with a message starting '<name>:' and leaves every array unchanged."""
    before = [a.copy() for a in arrays]
    with pytest.raises(exc) as info:
        call()
    message = str(info.value)
    assert message.startswith(name + ":"), message
    assert "incompatible function arguments" not in message
    for a, b in zip(arrays, before):
        assert a.tobytes() == b.tobytes(), f"an array was written ({name})"
    return message


@pytest.fixture
def dense(rng):
    return randn(rng, (2, 5, 4, 16)), randn(rng, (2, 7, 2, 16)), randn(rng, (2, 7, 2, 16))


@pytest.fixture
def cache(rng):
    """q (2, 1, 4, 16); caches (2, 8, 2, 16); one new token; cache_seqlens [3, 6]."""
    return dict(q=randn(rng, (2, 1, 4, 16)), k_cache=randn(rng, (2, 8, 2, 16)),
                v_cache=randn(rng, (2, 8, 2, 16)), k=randn(rng, (2, 1, 2, 16)),
                v=randn(rng, (2, 1, 2, 16)), cache_seqlens=np.array([3, 6], np.int32))


# ---- conversions --------------------------------------------------------------------------------

@pytest.mark.parametrize("missing", ["q", "k", "v"])
def test_missing_tensor_is_named(dense, missing):
    args = dict(zip("qkv", dense))
    args[missing] = None
    raises_named(TypeError, missing, lambda: flashattn.flash_attn_func(**args), *dense)


def test_rank3_k_is_reported_as_k(dense):
    q, k, v = dense
    raises_named(ValueError, "k", lambda: flashattn.flash_attn_func(q, k[:, :, 0], v), *dense)
    raises_named(ValueError, "k", lambda: flashattn.flash_attn_func(q, k[:, :, 0], v[:, :, 0]), *dense)


@pytest.mark.parametrize("window,name,exc", [((-2, 0), "window_size[0]", ValueError),
                                             ((0, -7), "window_size[1]", ValueError),
                                             ((1.5, 0), "window_size[0]", TypeError),
                                             ((0, None), "window_size[1]", TypeError),
                                             ((1, 2, 3), "window_size", ValueError)])
def test_bad_window_is_named(dense, window, name, exc):
    raises_named(exc, name, lambda: flashattn.flash_attn_func(*dense, window_size=window), *dense)


def test_window_beyond_int32_is_unbounded(dense):
    q, k, v = dense
    np.testing.assert_array_equal(flashattn.flash_attn_func(q, k, v, window_size=(2**40, 2**40)),
                                  flashattn.flash_attn_func(q, k, v))
    np.testing.assert_array_equal(flashattn.flash_attn_func(q, k, v, window_size=(2**40, 0)),
                                  flashattn.flash_attn_func(q, k, v, causal=True))


@pytest.mark.parametrize("kw,name,exc", [(dict(softcap="x"), "softcap", TypeError),
                                         (dict(softcap=-1.0), "softcap", ValueError),
                                         (dict(softmax_scale="big"), "softmax_scale", TypeError),
                                         (dict(softmax_scale=float("inf")), "softmax_scale", ValueError)])
def test_bad_float_is_named(dense, kw, name, exc):
    raises_named(exc, name, lambda: flashattn.flash_attn_func(*dense, **kw), *dense)


def test_bad_flag_and_dropout_are_named(dense):
    raises_named(TypeError, "causal", lambda: flashattn.flash_attn_func(
        *dense, causal=np.ones(3, bool)), *dense)
    raises_named(TypeError, "dropout_p", lambda: flashattn.flash_attn_func(
        *dense, dropout_p="none"), *dense)


def test_varlen_ints_are_named(rng):
    q, k = randn(rng, (5, 4, 16)), randn(rng, (9, 2, 16))
    cu_q, cu_k = np.array([0, 2, 5], np.int32), np.array([0, 4, 9], np.int32)
    for bad, name in [(dict(max_seqlen_q=2**40), "max_seqlen_q"),
                      (dict(max_seqlen_k=-1), "max_seqlen_k"),
                      (dict(max_seqlen_q=None), "max_seqlen_q")]:
        args = dict(q=q, k=k, v=k, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=3,
                    max_seqlen_k=5)
        args.update(bad)
        exc = TypeError if None in bad.values() else ValueError
        raises_named(exc, name, lambda: flashattn.flash_attn_varlen_func(**args), q, k, cu_q, cu_k)
    raises_named(TypeError, "cu_seqlens_k", lambda: flashattn.flash_attn_varlen_func(
        q, k, k, cu_q, None, 3, 5), q, k, cu_q)


@pytest.mark.parametrize("kw,name", [(dict(num_splits=2**40), "num_splits"),
                                     (dict(num_splits=-1), "num_splits"),
                                     (dict(num_splits=flashattn._C.MAX_SPLITS + 1), "num_splits"),
                                     (dict(cache_seqlens=2**40), "cache_seqlens"),
                                     (dict(cache_seqlens=-3), "cache_seqlens")])
def test_kvcache_ints_are_named(cache, kw, name):
    args = dict(cache, **kw)
    arrays = [a for a in cache.values() if isinstance(a, np.ndarray)]
    raises_named(ValueError, name, lambda: flashattn.flash_attn_with_kvcache(**args), *arrays)
    raises_named(ValueError, name, lambda: flashattn.plan_kvcache(**args), *arrays)


def test_allocate_workspace_size_is_named(dense):
    with pytest.raises(ValueError, match="^plan:"):
        flashattn.allocate_workspace(2**70, like=dense[0])
    with pytest.raises(ValueError, match="^plan:"):
        flashattn.allocate_workspace(-1, like=dense[0])
    with pytest.raises(TypeError, match="^plan:"):
        flashattn.allocate_workspace("big", like=dense[0])


def test_set_num_threads_is_named():
    with pytest.raises(ValueError, match="^num_threads:"):
        flashattn.set_num_threads(2**40)
    with pytest.raises(TypeError, match="^num_threads:"):
        flashattn.set_num_threads("two")
    assert flashattn.get_num_threads() == 0


# ---- rules of the library, seen from Python -------------------------------------------------------

def test_out_sharing_memory_with_an_input_is_refused(dense):
    q, k, v = dense
    raises_named(ValueError, "out", lambda: flashattn.flash_attn_func(q, k, v, out=q), *dense)
    k_like_q = randn(np.random.default_rng(0), q.shape)
    raises_named(ValueError, "out", lambda: flashattn.flash_attn_func(
        q, k_like_q, k_like_q, out=k_like_q), q, k_like_q)


def test_out_interleaved_with_q_in_one_buffer_is_accepted(rng):
    buf = randn(rng, (2, 5, 2, 4, 16))
    q, out = buf[:, :, 0], buf[:, :, 1]
    k, v = randn(rng, (2, 7, 4, 16)), randn(rng, (2, 7, 4, 16))
    q_before = q.copy()
    flashattn.flash_attn_func(q, k, v, out=out)
    np.testing.assert_array_equal(q, q_before)
    np.testing.assert_array_equal(out, flashattn.flash_attn_func(q_before, k, v))


def test_kvcache_append_overflow_is_refused(cache):
    arrays = [a for a in cache.values() if isinstance(a, np.ndarray)]
    for seqlens in ([2**31 - 1, 2], [-1, 2], [8, 2]):
        args = dict(cache, cache_seqlens=np.array(seqlens, np.int32))
        raises_named(ValueError, "cache_seqlens", lambda: flashattn.flash_attn_with_kvcache(**args),
                     *arrays)


def test_kvcache_v_cache_is_k_cache(cache):
    args = dict(cache, v_cache=cache["k_cache"])
    raises_named(ValueError, "k_cache", lambda: flashattn.flash_attn_with_kvcache(**args),
                 cache["k_cache"], cache["q"])
    # without appending nothing is written: one buffer for K and V is fine
    args.pop("k"), args.pop("v")
    out = flashattn.flash_attn_with_kvcache(**args)
    r, _, _, _ = ref.kvcache(cache["q"], cache["k_cache"], cache["k_cache"],
                             cache_seqlens=cache["cache_seqlens"])
    naive, _, _, _ = ref.kvcache(cache["q"], cache["k_cache"], cache["k_cache"],
                                 cache_seqlens=cache["cache_seqlens"], lowp=F16)
    assert_attention_close(out, r, naive, F16)


def test_kvcache_duplicate_batch_idx_with_append(cache):
    args = dict(cache, cache_batch_idx=np.array([1, 1], np.int32))
    arrays = [a for a in args.values() if isinstance(a, np.ndarray)]
    raises_named(ValueError, "cache_batch_idx", lambda: flashattn.flash_attn_with_kvcache(**args),
                 *arrays)


def test_kvcache_pages_shared_by_appends(rng, cache):
    kc, vc = randn(rng, (6, 4, 2, 16)), randn(rng, (6, 4, 2, 16))
    table = np.array([[0, 1], [2, 1]], np.int32)  # positions 3 (seq 0) and 6 (seq 1): page 0 / 1
    args = dict(cache, k_cache=kc, v_cache=vc, block_table=table,
                cache_seqlens=np.array([4, 6], np.int32))  # both append into page 1
    raises_named(ValueError, "block_table", lambda: flashattn.flash_attn_with_kvcache(**args),
                 kc, vc, table)


def test_block_table_padded_with_minus_one(rng, cache):
    kc, vc = randn(rng, (6, 4, 2, 16)), randn(rng, (6, 4, 2, 16))
    padded = np.array([[3, -1, -1], [0, 5, -1]], np.int32)  # 4 and 7 keys after the append
    filled = np.array([[3, 2, 4], [0, 5, 1]], np.int32)
    outs = []
    for table in (padded, filled):
        k_cache, v_cache = kc.copy(), vc.copy()
        outs.append(flashattn.flash_attn_with_kvcache(
            cache["q"], k_cache, v_cache, cache["k"], cache["v"], block_table=table,
            cache_seqlens=cache["cache_seqlens"]))
    np.testing.assert_array_equal(outs[0], outs[1])
    bad = np.array([[-1, -1, -1], [0, 5, -1]], np.int32)  # sequence 0's page in use is -1
    raises_named(ValueError, "block_table", lambda: flashattn.flash_attn_with_kvcache(
        cache["q"], kc, vc, cache["k"], cache["v"], block_table=bad,
        cache_seqlens=cache["cache_seqlens"]), kc, vc)


def test_rotary_positions_past_the_table(rng, cache):
    cos, sin = randn(rng, (8, 4)), randn(rng, (8, 4))
    q = randn(rng, (2, 3, 4, 16))  # causal: q positions cache_seqlens + i, up to 6 + 2 = 8
    args = dict(cache, q=q, rotary_cos=cos, rotary_sin=sin, causal=True,
                cache_seqlens=np.array([3, 6], np.int32))
    message = raises_named(ValueError, "rotary_cos",
                           lambda: flashattn.flash_attn_with_kvcache(**args),
                           q, cos, sin, cache["k_cache"], cache["v_cache"])
    assert re.search(r"position 8 of sequence 1", message), message


def test_varlen_cu_seqlens_overflow_and_short_total(rng):
    q, k = randn(rng, (5, 4, 16)), randn(rng, (9, 2, 16))
    cu_q = np.array([0, 2, 5], np.int32)
    bad_k = np.array([0, 2**31 - 1, -2**31], np.int32)
    raises_named(ValueError, "max_seqlen_k", lambda: flashattn.flash_attn_varlen_func(
        q, k, k, cu_q, bad_k, 3, 2**31 - 1), q, k, bad_k)
    wraps = np.array([0, 4, -2**31], np.int32)  # -2^31 - 4 is a decrease, not +2^31 - 4
    raises_named(ValueError, "cu_seqlens_k", lambda: flashattn.flash_attn_varlen_func(
        q, k, k, cu_q, wraps, 3, 5), q, k, wraps)
    short = np.array([0, 2, 4], np.int32)  # q row 4 would belong to no sequence
    raises_named(ValueError, "cu_seqlens_q", lambda: flashattn.flash_attn_varlen_func(
        q, k, k, short, np.array([0, 4, 9], np.int32), 3, 5), q, k, short)


def test_thread_start_failure_is_a_runtime_error():
    """In a child process allowed 2 MiB more address space than it uses, no helper thread's stack
    (8 MiB by default) fits: the call raises RuntimeError instead of aborting. The CPU backend
    never runs more threads than the machine has, so set_num_threads(4000) alone cannot fail.
    Two query rows: one row would take the decode walk, whose work items are sequences (D-72)."""
    import subprocess
    import sys
    import textwrap

    if (os.cpu_count() or 1) < 2:
        pytest.skip("one hardware thread: no helper thread to start")
    code = textwrap.dedent("""
        import os, resource, numpy as np, flashattn
        flashattn.set_num_threads(4000)
        q = np.ones((1, 2, 64, 16), np.float16)
        in_use = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGESIZE")
        resource.setrlimit(resource.RLIMIT_AS, (in_use + (2 << 20), in_use + (2 << 20)))
        try:
            flashattn.flash_attn_func(q, q, q)
        except RuntimeError as e:
            print("RuntimeError:", e)
        """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "could not start worker thread" in run.stdout.lower(), run.stdout
