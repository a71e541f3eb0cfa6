"""CPU tests of the flashattn Python package on NumPy arrays, against reference.py (float64)."""
import numpy as np
import pytest

import flashattn
import reference as ref
from conftest import assert_attention_close, assert_lse_close

DTYPES = [np.float16, np.float32]


def randn(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def make_qkv(rng, b, sq, sk, h, hk, d, dtype):
    return (randn(rng, (b, sq, h, d), dtype), randn(rng, (b, sk, hk, d), dtype),
            randn(rng, (b, sk, hk, d), dtype))


def check_dense(q, k, v, out, lse, dtype, **kw):
    r, rl = ref.dense(q, k, v, **kw)
    naive, _ = ref.dense(q, k, v, lowp=dtype, **kw)
    assert_attention_close(out, r, naive, dtype)
    if lse is not None:
        assert_lse_close(lse, rl, dtype)


# ---- dense --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b,sq,sk", [(1, 1, 1), (2, 3, 17), (1, 113, 339), (2, 339, 113),
                                     (1, 17, 0)])
@pytest.mark.parametrize("h,hk", [(4, 4), (4, 2), (7, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_dense_shapes(rng, dtype, b, sq, sk, h, hk, causal):
    d = 64
    q, k, v = make_qkv(rng, b, sq, sk, h, hk, d, dtype)
    out, lse, probs = flashattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert probs is None
    assert out.dtype == q.dtype and lse.dtype == np.float32
    check_dense(q, k, v, out, lse, dtype, causal=causal)


@pytest.mark.parametrize("d", [32, 40, 80, 128])
def test_dense_head_dims(rng, d):
    q, k, v = make_qkv(rng, 2, 33, 47, 4, 2, d, np.float16)
    out = flashattn.flash_attn_func(q, k, v)
    check_dense(q, k, v, out, None, np.float16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window,causal", [((8, 0), False), ((5, 3), False), ((0, 0), False),
                                           ((16, -1), True), ((-1, 4), False)])
def test_dense_window(rng, dtype, window, causal):
    q, k, v = make_qkv(rng, 2, 57, 113, 4, 2, 64, dtype)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                            return_attn_probs=True)
    check_dense(q, k, v, out, lse, dtype, causal=causal, window=window)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("alibi_shape", ["h", "bh"])
@pytest.mark.parametrize("causal", [False, True])
def test_dense_alibi_softcap_scale(rng, dtype, alibi_shape, causal):
    b, h = 2, 4
    q, k, v = make_qkv(rng, b, 31, 77, h, 2, 64, dtype)
    alibi = rng.uniform(0.01, 0.5, (h,) if alibi_shape == "h" else (b, h)).astype(np.float32)
    kw = dict(softmax_scale=0.3, causal=causal, softcap=5.0)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, alibi_slopes=alibi, return_attn_probs=True,
                                            **kw)
    check_dense(q, k, v, out, lse, dtype, scale=0.3, causal=causal, softcap=5.0, alibi=alibi)


def test_dense_noncontiguous_and_out(rng):
    """Strided views (b, h, s, d) transposed; out= written in place and returned as is."""
    b, s, h, d = 2, 29, 4, 64
    base = randn(rng, (3, b, h, s, d), np.float16)
    q, k, v = (base[i].transpose(0, 2, 1, 3) for i in range(3))
    assert not q.flags.c_contiguous
    out = np.full((b, s, h, d), np.nan, np.float16)
    res = flashattn.flash_attn_func(q, k, v, causal=True, out=out)
    assert res is out
    check_dense(q, k, v, out, None, np.float16, causal=True)


def test_dense_last_dim_not_contiguous(rng):
    """Inputs whose last dimension is strided are copied (as flash_attn does); an out whose last
    dimension is strided is refused, untouched, with a message that names the fix."""
    b, s, h, d = 2, 21, 4, 40
    base = randn(rng, (3, b, s, h, d, 2), np.float16)
    q, k, v = base[0, ..., 0], base[1, ..., 1], base[2, ..., 0]  # last-dim stride 2 elements
    assert q.strides[-1] == 2 * q.itemsize
    out = flashattn.flash_attn_func(q, k, v, causal=True)
    check_dense(q, k, v, out, None, np.float16, causal=True)
    qt = np.ascontiguousarray(q.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)  # last-dim stride h
    assert qt.strides[-1] != qt.itemsize
    np.testing.assert_array_equal(flashattn.flash_attn_func(qt, k, v, causal=True), out)
    strided_out = np.full((b, s, h, d, 2), np.nan, np.float16)[..., 0]
    with pytest.raises(ValueError, match=r"out: must have a contiguous last dimension.*contiguous"):
        flashattn.flash_attn_func(q, k, v, out=strided_out)
    assert np.isnan(strided_out).all()


# Issue 28: every head dim from 1 to 256 (on CUDA the ones that are not multiples of 8 run on
# zero-padded copies; test_gpu.py has the same list).
ANY_HEAD_DIMS = [1, 8, 59, 80, 111, 200, 256]


@pytest.mark.parametrize("d", ANY_HEAD_DIMS)
def test_any_head_dim(rng, d):
    dtype = np.float16
    q, k, v = make_qkv(rng, 2, 17, 45, 4, 2, d, dtype)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    check_dense(q, k, v, out, lse, dtype, causal=True)
    lq, lk = [3, 17, 0], [20, 17, 5]
    qv, kv, vv = (randn(rng, (sum(n), hh, d), dtype) for n, hh in ((lq, 4), (lk, 2), (lk, 2)))
    out, lse, _ = flashattn.flash_attn_varlen_func(qv, kv, vv, cu(lq), cu(lk), max(lq), max(lk),
                                                   return_attn_probs=True)
    r, rl = ref.varlen(qv, kv, vv, cu(lq), cu(lk))
    naive, _ = ref.varlen(qv, kv, vv, cu(lq), cu(lk), lowp=dtype)
    assert_attention_close(out, r, naive, dtype)
    assert_lse_close(lse, rl, dtype)
    rotary_dim = d // 2 * 2 if d >= 2 else 0
    case = kvcache_case(rng, dtype, sq=2, s_new=2, d=d, page_size=16, rotary_dim=rotary_dim)
    check_kvcache(case, dtype, num_splits=3, workspace=True, causal=True, interleaved=False,
                  cache_rtol=2e-3)  # one fp16 ulp
    case = kvcache_case(rng, dtype, sq=1, s_new=1, d=d, batch_idx=True, leftpad=True)
    check_kvcache(case, dtype, causal=True)


def test_dense_fully_masked_rows(rng):
    """sq > sk with causal: the first sq - sk rows see no key: out 0, lse -inf."""
    q, k, v = make_qkv(rng, 1, 9, 4, 2, 2, 64, np.float32)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert np.all(out[0, :5] == 0)
    assert np.all(np.isneginf(lse[0, :, :5]))
    check_dense(q, k, v, out, lse, np.float32, causal=True)


def test_nan_query_row_propagates(rng):
    # A NaN in one query row makes that row's output and LSE NaN (not the 0 / -inf of a row
    # without visible keys); every other row stays finite.
    q, k, v = make_qkv(rng, 2, 7, 90, 4, 2, 64, np.float32)
    q[1, 3, 2, 5] = np.nan
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    nan_row = np.zeros(out.shape[:3], dtype=bool)
    nan_row[1, 3, 2] = True
    assert np.isnan(out[nan_row]).all()
    assert np.isfinite(out[~nan_row]).all()
    assert np.isnan(lse[1, 2, 3])
    lse_nan = np.zeros(lse.shape, dtype=bool)
    lse_nan[1, 2, 3] = True
    assert np.isfinite(lse[~lse_nan]).all()


def test_packed_match_unpacked(rng):
    b, s, h, d = 2, 37, 4, 64
    qkv = randn(rng, (b, s, 3, h, d), np.float16)
    out = flashattn.flash_attn_qkvpacked_func(qkv, causal=True)
    expect = flashattn.flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
    np.testing.assert_array_equal(out, expect)
    kv = randn(rng, (b, 53, 2, 2, d), np.float16)
    q = randn(rng, (b, s, h, d), np.float16)
    out, lse, p = flashattn.flash_attn_kvpacked_func(q, kv, return_attn_probs=True)
    expect = flashattn.flash_attn_func(q, kv[:, :, 0], kv[:, :, 1])
    np.testing.assert_array_equal(out, expect)
    assert lse.shape == (b, h, s) and p is None


def test_num_threads(rng):
    q, k, v = make_qkv(rng, 2, 65, 65, 4, 4, 64, np.float32)
    a = flashattn.flash_attn_func(q, k, v)
    flashattn.set_num_threads(1)
    try:
        assert flashattn.get_num_threads() == 1
        b = flashattn.flash_attn_func(q, k, v)
    finally:
        flashattn.set_num_threads(0)
    # The split heuristic counts threads: with many cores the call may split the keys, which
    # changes the order of the sums (and the last bit), never more.
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)



@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork")
def test_calls_in_a_forked_child(rng):
    """The helper threads are kept between calls (D-73); a child forked after calls has none of
    them: its call must neither wait for them (a hang, failed here after 60 s) nor differ."""
    import os
    import signal
    import time

    q, k, v = make_qkv(rng, 2, 130, 130, 4, 4, 64, np.float32)
    expected = flashattn.flash_attn_func(q, k, v, causal=True)
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status only
        code = 1
        try:
            got = flashattn.flash_attn_func(q, k, v, causal=True)
            code = 0 if np.array_equal(got, expected) else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's call did not return in 60 s")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0

# ---- varlen -------------------------------------------------------------------------------------

def cu(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (7, 2))])
def test_varlen(rng, dtype, causal, window):
    lq, lk = [3, 0, 17, 113, 1], [17, 5, 17, 64, 0]
    h, hk, d = 4, 2, 64
    q = randn(rng, (sum(lq), h, d), dtype)
    k = randn(rng, (sum(lk), hk, d), dtype)
    v = randn(rng, (sum(lk), hk, d), dtype)
    kw = dict(causal=causal, window=window)
    out, lse, p = flashattn.flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), max(lq), max(lk),
                                                   causal=causal, window_size=window,
                                                   return_attn_probs=True)
    assert p is None and lse.shape == (h, sum(lq))
    r, rl = ref.varlen(q, k, v, cu(lq), cu(lk), **kw)
    naive, _ = ref.varlen(q, k, v, cu(lq), cu(lk), lowp=dtype, **kw)
    assert_attention_close(out, r, naive, dtype)
    assert_lse_close(lse, rl, dtype)


def test_varlen_packed(rng):
    lens = [5, 31, 1]
    qkv = randn(rng, (sum(lens), 3, 4, 64), np.float16)
    out = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu(lens), max(lens), causal=True)
    expect = flashattn.flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu(lens),
                                              cu(lens), max(lens), max(lens), causal=True)
    np.testing.assert_array_equal(out, expect)
    kv = qkv[:, 1:]
    out = flashattn.flash_attn_varlen_kvpacked_func(qkv[:, 0], kv, cu(lens), cu(lens), max(lens),
                                                    max(lens))
    expect = flashattn.flash_attn_varlen_func(qkv[:, 0], kv[:, 0], kv[:, 1], cu(lens), cu(lens),
                                              max(lens), max(lens))
    np.testing.assert_array_equal(out, expect)


def page_table(rng, lengths, page_size):
    """A shuffled block_table (b, max_pages) over num_pages pages (a few unused)."""
    max_pages = max(1, max(-(-n // page_size) for n in lengths))
    num_pages = len(lengths) * max_pages + 3
    perm = rng.permutation(num_pages).astype(np.int32)
    return perm[:len(lengths) * max_pages].reshape(len(lengths), max_pages), num_pages


def scatter_pages(rng, seqs, table, num_pages, page_size, dtype):
    """Rows (n_b, hk, d) of each sequence written into a paged cache; other rows garbage."""
    hk, d = seqs[0].shape[1:]
    cache = randn(rng, (num_pages, page_size, hk, d), dtype)
    for b, s in enumerate(seqs):
        for p in range(len(s)):
            cache[table[b, p // page_size], p % page_size] = s[p]
    return cache


@pytest.mark.parametrize("page_size", [1, 5, 16])
def test_varlen_paged_seqused_leftpad(rng, page_size):
    dtype, h, hk, d = np.float16, 4, 2, 64
    lq, lk = [1, 7, 3], [40, 17, 1]
    q = randn(rng, (sum(lq), h, d), dtype)
    kseqs = [randn(rng, (n, hk, d), dtype) for n in lk]
    vseqs = [randn(rng, (n, hk, d), dtype) for n in lk]
    table, num_pages = page_table(rng, lk, page_size)
    kc = scatter_pages(rng, kseqs, table, num_pages, page_size, dtype)
    vc = scatter_pages(rng, vseqs, table, num_pages, page_size, dtype)
    seqused = np.array([33, 17, 1], np.int32)
    leftpad = np.array([2, 0, 0], np.int32)
    out, lse, _ = flashattn.flash_attn_varlen_func(
        q, kc, vc, cu(lq), cu(lk), max(lq), max(lk), causal=True, block_table=table,
        seqused_k=seqused, leftpad_k=leftpad, return_attn_probs=True)
    kw = dict(block_table=table, seqused_k=seqused, leftpad_k=leftpad, causal=True)
    r, rl = ref.varlen(q, kc, vc, cu(lq), cu(lk), **kw)
    naive, _ = ref.varlen(q, kc, vc, cu(lq), cu(lk), lowp=dtype, **kw)
    assert_attention_close(out, r, naive, dtype)
    assert_lse_close(lse, rl, dtype)


# ---- kv cache -----------------------------------------------------------------------------------

def kvcache_case(rng, dtype, *, b=3, sq=1, s_new=1, h=4, hk=2, d=64, max_sk=96, page_size=None,
                 rotary_dim=0, batch_idx=False, leftpad=False):
    b_cache = b + 2 if batch_idx else b
    case = {"q": randn(rng, (b, sq, h, d), dtype)}
    seqlens = rng.integers(0, max_sk - s_new + 1, b).astype(np.int32)
    seqlens[0] = max_sk - s_new  # one full row
    case["cache_seqlens"] = seqlens
    if page_size is None:
        case["k_cache"] = randn(rng, (b_cache, max_sk, hk, d), dtype)
        case["v_cache"] = randn(rng, (b_cache, max_sk, hk, d), dtype)
    else:
        max_pages = -(-max_sk // page_size)
        num_pages = b * max_pages + 2
        case["k_cache"] = randn(rng, (num_pages, page_size, hk, d), dtype)
        case["v_cache"] = randn(rng, (num_pages, page_size, hk, d), dtype)
        case["block_table"] = rng.permutation(num_pages)[:b * max_pages].reshape(
            b, max_pages).astype(np.int32)
    if s_new:
        case["k"] = randn(rng, (b, s_new, hk, d), dtype)
        case["v"] = randn(rng, (b, s_new, hk, d), dtype)
    if rotary_dim:
        angles = rng.uniform(0, 2 * np.pi, (max_sk, rotary_dim // 2))
        case["rotary_cos"] = np.cos(angles).astype(dtype)
        case["rotary_sin"] = np.sin(angles).astype(dtype)
    if batch_idx:
        case["cache_batch_idx"] = rng.permutation(b_cache)[:b].astype(np.int32)
    if leftpad:
        case["cache_leftpad"] = np.minimum(rng.integers(0, 5, b), seqlens).astype(np.int32)
    return case


def run_kvcache_ref(case, dtype, causal=False, window=(-1, -1), interleaved=True, alibi=None,
                    lowp=None):
    c = case
    return ref.kvcache(c["q"], c["k_cache"], c["v_cache"], k_new=c.get("k"), v_new=c.get("v"),
                       cos=c.get("rotary_cos"), sin=c.get("rotary_sin"),
                       cache_seqlens=c["cache_seqlens"], cache_batch_idx=c.get("cache_batch_idx"),
                       cache_leftpad=c.get("cache_leftpad"), block_table=c.get("block_table"),
                       causal=causal, window=window, rotary_interleaved=interleaved,
                       alibi=alibi, dtype=dtype, lowp=lowp)


def check_kvcache(case, dtype, num_splits=0, workspace=False, cache_rtol=0.0, **kw):
    """cache_rtol: the appended rows may differ from the float64 oracle's by a rounding of the
    rotation (computed in fp32, rounded once); 0 = bit-exact."""
    inputs = {name: (x.copy() if name in ("k_cache", "v_cache") else x)
              for name, x in case.items()}
    call_kw = dict(causal=kw.get("causal", False), window_size=kw.get("window", (-1, -1)),
                   rotary_interleaved=kw.get("interleaved", True),
                   alibi_slopes=kw.get("alibi"), num_splits=num_splits)
    extra = {}
    if workspace:
        plan = flashattn.plan_kvcache(**inputs, **call_kw)
        assert isinstance(plan, flashattn.KVCachePlan) and plan.num_splits >= 1
        extra["workspace"] = flashattn.allocate_workspace(plan, like=case["q"])
        assert extra["workspace"].nbytes == plan.workspace_bytes
    out, lse = flashattn.flash_attn_with_kvcache(**inputs, **call_kw, return_softmax_lse=True,
                                                 **extra)
    r, rl, kc, vc = run_kvcache_ref(case, dtype, **kw)
    naive, _, _, _ = run_kvcache_ref(case, dtype, lowp=dtype, **kw)
    assert_attention_close(out, r, naive, dtype)
    assert_lse_close(lse, rl, dtype)
    np.testing.assert_allclose(inputs["k_cache"].astype(np.float64), kc, rtol=cache_rtol, atol=0)
    np.testing.assert_array_equal(inputs["v_cache"].astype(np.float64), vc)
    return out, lse


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [None, 1, 16, 256])
@pytest.mark.parametrize("s_new,sq,causal", [(0, 1, False), (1, 1, True), (3, 3, True),
                                             (2, 5, False)])
def test_kvcache(rng, dtype, page_size, s_new, sq, causal):
    case = kvcache_case(rng, dtype, sq=sq, s_new=s_new, page_size=page_size)
    check_kvcache(case, dtype, causal=causal)


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (-1, -1)), (False, (9, 0))])
@pytest.mark.parametrize("page_size", [None, 16])
def test_kvcache_rotary(rng, interleaved, causal, window, page_size):
    case = kvcache_case(rng, np.float16, sq=2, s_new=2, rotary_dim=32, page_size=page_size)
    check_kvcache(case, np.float16, causal=causal, window=window, interleaved=interleaved)


def test_kvcache_batch_idx_leftpad_alibi(rng):
    case = kvcache_case(rng, np.float32, sq=2, s_new=1, batch_idx=True, leftpad=True, h=6, hk=3)
    alibi = rng.uniform(0.01, 0.3, (3, 6)).astype(np.float32)
    check_kvcache(case, np.float32, causal=True, alibi=alibi)


@pytest.mark.parametrize("page_size", [None, 7])
def test_kvcache_splits_agree_and_workspace(rng, page_size):
    case = kvcache_case(rng, np.float32, b=2, sq=1, s_new=1, max_sk=700, page_size=page_size)
    one, lse1 = check_kvcache(case, np.float32, num_splits=1, workspace=True, causal=True)
    many, lse8 = check_kvcache(case, np.float32, num_splits=8, workspace=True, causal=True)
    auto, _ = check_kvcache(case, np.float32, num_splits=0, causal=True)
    np.testing.assert_allclose(one, many, atol=1e-5)
    np.testing.assert_allclose(lse1, lse8, atol=1e-5)
    np.testing.assert_allclose(one, auto, atol=1e-5)


def test_kvcache_int_seqlens_and_return(rng):
    case = kvcache_case(rng, np.float16, s_new=0)
    del case["cache_seqlens"]
    out = flashattn.flash_attn_with_kvcache(case["q"], case["k_cache"], case["v_cache"],
                                            cache_seqlens=50)
    assert isinstance(out, np.ndarray) and out.shape == case["q"].shape
    case["cache_seqlens"] = np.full(3, 50, np.int32)
    r, _, _, _ = run_kvcache_ref(case, np.float16)
    naive, _, _, _ = run_kvcache_ref(case, np.float16, lowp=np.float16)
    assert_attention_close(out, r, naive, np.float16)


def test_plan_and_workspace_alignment(rng):
    case = kvcache_case(rng, np.float16, b=2, max_sk=512)
    plan = flashattn.plan_kvcache(**case, num_splits=4)
    assert plan.num_splits >= 1 and plan.workspace_bytes >= 0
    assert plan.kernel == "cpu"  # the kernel that runs the call, by name
    for n in (0, 1, 1000):
        ws = flashattn.allocate_workspace(n, like=case["q"])
        assert ws.nbytes == n and ws.dtype == np.uint8
        if n:
            assert ws.ctypes.data % 256 == 0


# ---- errors -------------------------------------------------------------------------------------

def poisoned(shape, dtype=np.float16):
    return np.full(shape, np.nan, dtype)


def assert_untouched(out):
    assert np.isnan(out).all(), "out was written by a failed call"


def test_error_dropout(rng):
    q, k, v = make_qkv(rng, 1, 4, 4, 2, 2, 64, np.float16)
    out = poisoned(q.shape)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flashattn.flash_attn_func(q, k, v, dropout_p=0.1, out=out)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flashattn.flash_attn_varlen_func(q[0], k[0], v[0], cu([4]), cu([4]), 4, 4, dropout_p=0.5)
    assert_untouched(out)


def test_error_shapes_and_dtypes(rng):
    q, k, v = make_qkv(rng, 2, 4, 6, 4, 2, 64, np.float16)
    out = poisoned(q.shape)
    with pytest.raises(ValueError, match="k"):  # batch mismatch
        flashattn.flash_attn_func(q, k[:1], v[:1], out=out)
    with pytest.raises(ValueError):  # h % hk != 0
        flashattn.flash_attn_func(q[:, :, :3], k, v, out=out[:, :, :3])
    with pytest.raises(TypeError, match="k"):  # dtype mismatch
        flashattn.flash_attn_func(q, k.astype(np.float32), v, out=out)
    with pytest.raises(TypeError, match="q"):  # int64 is no attention dtype
        flashattn.flash_attn_func(q.astype(np.int64), k, v)
    with pytest.raises(ValueError, match="q"):
        flashattn.flash_attn_func(q[0], k, v)
    with pytest.raises(ValueError, match="window_size"):
        flashattn.flash_attn_func(q, k, v, window_size=3)
    with pytest.raises(TypeError, match="k"):
        flashattn.flash_attn_func(q, [[1.0]], v, out=out)
    with pytest.raises(ValueError, match="out"):  # wrong out shape
        flashattn.flash_attn_func(q, k, v, out=poisoned((2, 4, 4, 32)))
    assert_untouched(out)


def test_error_readonly_out(rng):
    q, k, v = make_qkv(rng, 1, 4, 4, 2, 2, 64, np.float16)
    out = poisoned(q.shape)
    out.flags.writeable = False
    with pytest.raises(TypeError, match="out"):
        flashattn.flash_attn_func(q, k, v, out=out)
    # read-only inputs are fine
    q.flags.writeable = False
    flashattn.flash_attn_func(q, k, v)


def test_error_kvcache(rng):
    case = kvcache_case(rng, np.float16, s_new=1, page_size=16)
    out = poisoned(case["q"].shape)
    bad = dict(case, cache_seqlens=case["cache_seqlens"].astype(np.int64))
    with pytest.raises(TypeError, match="cache_seqlens"):
        flashattn.flash_attn_with_kvcache(**bad, out=out)
    bad = dict(case, block_table=case["block_table"][:1])
    with pytest.raises(ValueError, match="block_table"):
        flashattn.flash_attn_with_kvcache(**bad, out=out)
    with pytest.raises(TypeError, match="cache_seqlens"):
        flashattn.flash_attn_with_kvcache(**dict(case, cache_seqlens=1.5), out=out)
    plan = flashattn.plan_kvcache(**case, num_splits=4)
    assert plan.workspace_bytes > 1
    too_small = flashattn.allocate_workspace(1, like=case["q"])
    with pytest.raises(ValueError, match="workspace"):
        flashattn.flash_attn_with_kvcache(**case, out=out, num_splits=4, workspace=too_small)
    misaligned = flashattn.allocate_workspace(plan.workspace_bytes + 8, like=case["q"])[8:]
    with pytest.raises(ValueError, match="workspace"):
        flashattn.flash_attn_with_kvcache(**case, out=out, num_splits=4, workspace=misaligned)
    assert_untouched(out)


def test_build_info():
    info = flashattn.build_info()
    assert isinstance(info, str) and info
    assert isinstance(flashattn.cuda_available(), bool)


def test_check_device_status_without_cuda():
    """Only CUDA kernels record index faults: without a device the status is always clear."""
    if flashattn.cuda_available():
        pytest.skip("a CUDA device is visible (test_gpu.py covers check_device_status)")
    assert flashattn.check_device_status() is None
    assert flashattn.check_device_status(0) is None


# ---- optional frameworks on the CPU ------------------------------------------------------------

def test_bfloat16_ml_dtypes(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = ml_dtypes.bfloat16
    q, k, v = (x.astype(bf16) for x in make_qkv(rng, 2, 9, 21, 4, 2, 64, np.float32))
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.dtype == bf16
    r, rl = ref.dense(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                      causal=True)
    np.testing.assert_allclose(out.astype(np.float64), r, atol=2e-2)
    np.testing.assert_allclose(lse, rl, atol=1e-3)


def test_torch_cpu(rng):
    torch = pytest.importorskip("torch")
    q, k, v = make_qkv(rng, 2, 17, 33, 4, 2, 64, np.float32)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    out, lse, _ = flashattn.flash_attn_func(tq, tk, tv, causal=True, return_attn_probs=True)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    check_dense(q, k, v, out.numpy(), lse.numpy(), np.float32, causal=True)
    out16 = flashattn.flash_attn_func(tq.bfloat16(), tk.bfloat16(), tv.bfloat16())
    assert out16.dtype == torch.bfloat16
    r, _ = ref.dense(tq.bfloat16().double().numpy(), tk.bfloat16().double().numpy(),
                     tv.bfloat16().double().numpy())
    np.testing.assert_allclose(out16.double().numpy(), r, atol=2e-2)
    leaf = tq.clone().requires_grad_(True)
    with pytest.raises(NotImplementedError, match="backward"):
        flashattn.flash_attn_func(leaf, tk, tv)
    with torch.no_grad():
        flashattn.flash_attn_func(leaf, tk, tv)


def test_jax_cpu(rng):
    jax = pytest.importorskip("jax")
    cpu = jax.devices("cpu")[0]
    q, k, v = make_qkv(rng, 2, 17, 33, 4, 2, 64, np.float32)
    jq, jk, jv = (jax.device_put(x, cpu) for x in (q, k, v))
    out, lse, _ = flashattn.flash_attn_func(jq, jk, jv, causal=True, return_attn_probs=True)
    assert isinstance(out, jax.Array)
    check_dense(q, k, v, np.array(out), np.array(lse), np.float32, causal=True)
