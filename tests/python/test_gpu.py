"""GPU tests (marker `gpu`): PyTorch CUDA tensors against torch float64 math, a paged-cache
decode step captured in a CUDA graph and replayed, and CuPy / JAX when installed.

Skipped cleanly when torch with CUDA is missing or flashattn was built without CUDA.
"""
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import flashattn

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.cuda is not available"),
    pytest.mark.skipif(not flashattn.cuda_available(), reason="flashattn built without CUDA"),
]

DTYPES = [torch.float16, torch.bfloat16]
# Absolute floor of the pass rule (a few ulps of outputs of magnitude ~1).
FLOOR = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
LSE_ATOL = 2e-3


def compiled_instances():
    """{'bf16': {64, 128}, ...} from build_info's "kernels: bf16: 64 128; fp16: 64"."""
    m = re.search(r"kernels: ([^)]*)", flashattn.build_info())
    found = {}
    for part in (m.group(1).split(";") if m else []):
        name, _, dims = part.partition(":")
        found[name.strip()] = {int(x) for x in dims.split()}
    return found


def require_instance(dtype, d):
    """Skip a case whose (dtype, head dim) kernels this build did not compile
    (FLASHATTN_DTYPES / FLASHATTN_HEAD_DIMS subsets)."""
    name = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    if d not in compiled_instances().get(name, set()):
        pytest.skip(f"no CUDA kernels compiled for {name} head dim {d}")


def require_serving_instance(dtype, d):
    """Skip a head dim that no compiled instance serves: the smallest compiled head dim at
    least d rounded up to a multiple of 8 (staged copies, src/api/staging.h)."""
    name = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    padded = -(-d // 8) * 8
    if not any(c >= padded for c in compiled_instances().get(name, set())):
        pytest.skip(f"no CUDA kernels compiled for {name} that serve head dim {d}")


# Issue 28: every head dim from 1 to 256 (test_cpu.py has the same list).
ANY_HEAD_DIMS = [1, 8, 59, 80, 111, 200, 256]


# ---- torch float64 reference ----------------------------------------------------------------

def attend(q, k, v, *, scale=None, causal=False, window=(-1, -1), softcap=0.0, slopes=None,
           lowp=None):
    """One sequence: q (sq, h, d), k/v (sk, hk, d) -> out (sq, h, d), lse (h, sq), float64."""
    q, k, v = q.double(), k.double(), v.double()
    sq, h, d = q.shape
    sk, hk, _ = k.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    left, right = window
    if causal:
        right = 0
    k = k.repeat_interleave(h // hk, dim=1)
    v = v.repeat_interleave(h // hk, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k)
    s = softcap * torch.tanh(s * scale / softcap) if softcap > 0 else s * scale
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    diag = i + sk - sq
    if slopes is not None:
        s = s - slopes.double()[:, None, None] * (diag - j).abs()
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if left >= 0:
        visible &= j >= diag - left
    if right >= 0:
        visible &= j <= diag + right
    s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, dim=-1)  # -inf for rows without keys
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    if lowp is not None:
        p = p.to(lowp).double()
    out = torch.einsum("hqk,khd->qhd", p, v)
    if lowp is not None:
        out = out.to(lowp).double()
    return out, lse


def dense_ref(q, k, v, **kw):
    res = [attend(q[b], k[b], v[b], **kw) for b in range(q.shape[0])]
    return torch.stack([r[0] for r in res]), torch.stack([r[1] for r in res])


def assert_close(out, ref, naive, dtype, what="out"):
    out = out.double()
    assert torch.isfinite(out).all(), f"{what}: non-finite values"
    err = (out - ref).abs().max().item() if out.numel() else 0.0
    naive_err = (naive - ref).abs().max().item() if out.numel() else 0.0
    bound = 2 * naive_err + FLOOR[dtype]
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g} (naive {naive_err:.3g})"


def assert_lse(lse, ref):
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref))
    fin = torch.isfinite(ref)
    if fin.any():
        assert (lse.double()[fin] - ref[fin]).abs().max().item() <= LSE_ATOL


def randn(*shape, dtype):
    return torch.randn(*shape, device="cuda", dtype=dtype)


# ---- dense and varlen -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("b,sq,sk", [(1, 1, 1), (2, 113, 339), (2, 339, 113), (1, 799, 799)])
@pytest.mark.parametrize("h,hk", [(8, 8), (8, 2), (7, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_dense(dtype, d, b, sq, sk, h, hk, causal):
    require_instance(dtype, d)
    torch.manual_seed(0)
    q, k, v = randn(b, sq, h, d, dtype=dtype), randn(b, sk, hk, d, dtype=dtype), \
        randn(b, sk, hk, d, dtype=dtype)
    out, lse, p = flashattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert p is None and out.dtype == dtype and out.device == q.device
    ref, ref_lse = dense_ref(q, k, v, causal=causal)
    naive, _ = dense_ref(q, k, v, causal=causal, lowp=dtype)
    assert_close(out, ref, naive, dtype)
    assert_lse(lse, ref_lse)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_options(dtype):
    require_instance(dtype, 128)
    torch.manual_seed(1)
    b, h = 2, 8
    q, k, v = randn(b, 77, h, 128, dtype=dtype), randn(b, 131, 4, 128, dtype=dtype), \
        randn(b, 131, 4, 128, dtype=dtype)
    alibi = torch.rand(h, device="cuda") * 0.3
    kw = dict(softmax_scale=0.2, window_size=(32, 8), softcap=10.0)
    out = flashattn.flash_attn_func(q, k, v, alibi_slopes=alibi, **kw)
    rkw = dict(scale=0.2, window=(32, 8), softcap=10.0, slopes=alibi)
    ref, _ = dense_ref(q, k, v, **rkw)
    naive, _ = dense_ref(q, k, v, lowp=dtype, **rkw)
    assert_close(out, ref, naive, dtype)


def test_side_stream_and_out():
    """Runs on torch's current stream; out= is written in place and returned."""
    require_instance(torch.bfloat16, 128)
    torch.manual_seed(2)
    q, k, v = (randn(2, 257, 8, 128, dtype=torch.bfloat16) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        res = flashattn.flash_attn_func(q, k, v, causal=True, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    assert res is out
    ref, _ = dense_ref(q, k, v, causal=True)
    naive, _ = dense_ref(q, k, v, causal=True, lowp=torch.bfloat16)
    assert_close(out, ref, naive, torch.bfloat16)


def check_causal_varlen(lq, lk, h, hk, d, dtype):
    """A causal flash_attn_varlen_func call over sequences of lq queries and lk keys, each
    sequence's out and LSE against the float64 reference."""
    cu = lambda n: torch.tensor([0] + list(np.cumsum(n)), dtype=torch.int32, device="cuda")
    q = randn(sum(lq), h, d, dtype=dtype)
    k, v = randn(sum(lk), hk, d, dtype=dtype), randn(sum(lk), hk, d, dtype=dtype)
    out, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), max(lq), max(lk),
                                                   causal=True, return_attn_probs=True)
    oq, ok = np.cumsum([0] + lq), np.cumsum([0] + lk)
    for b in range(len(lq)):
        qs, ks = slice(oq[b], oq[b + 1]), slice(ok[b], ok[b + 1])
        ref, ref_lse = attend(q[qs], k[ks], v[ks], causal=True)
        naive, _ = attend(q[qs], k[ks], v[ks], causal=True, lowp=dtype)
        assert_close(out[qs], ref, naive, dtype, f"varlen out of sequence {b}")
        assert_lse(lse[:, qs], ref_lse)


@pytest.mark.parametrize("dtype", DTYPES)
def test_varlen(dtype):
    require_instance(dtype, 128)
    torch.manual_seed(3)
    check_causal_varlen([1, 113, 0, 339, 17], [17, 339, 5, 113, 17], 8, 2, 128, dtype)


# ---- kv cache: paged decode, CUDA graph ---------------------------------------------------------

def paged_cache(b, max_sk, page_size, hk, d, dtype):
    max_pages = -(-max_sk // page_size)
    num_pages = b * max_pages + 3
    k_cache = randn(num_pages, page_size, hk, d, dtype=dtype)
    v_cache = randn(num_pages, page_size, hk, d, dtype=dtype)
    table = torch.randperm(num_pages, device="cuda")[:b * max_pages].reshape(b, max_pages)
    return k_cache, v_cache, table.to(torch.int32)


def gather(cache, table, b, n):
    pos = torch.arange(n, device=cache.device)
    page_size = cache.shape[1]
    return cache[table[b, pos // page_size].long(), pos % page_size]


def kvcache_ref(q, k_cache, v_cache, table, seqlens, lowp=None, **kw):
    outs, lses = [], []
    for b in range(q.shape[0]):
        n = int(seqlens[b])
        o, l = attend(q[b], gather(k_cache, table, b, n), gather(v_cache, table, b, n),
                      lowp=lowp, **kw)
        outs.append(o)
        lses.append(l)
    return torch.stack(outs), torch.stack(lses)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 16, 256])
@pytest.mark.parametrize("num_splits", [1, 0, 4])
def test_kvcache_paged(dtype, page_size, num_splits):
    require_instance(dtype, 128)
    torch.manual_seed(4)
    b, h, hk, d, max_sk = 3, 8, 2, 128, 1000
    k_cache, v_cache, table = paged_cache(b, max_sk, page_size, hk, d, dtype)
    seqlens = torch.tensor([999, 1, 517], dtype=torch.int32, device="cuda")
    q = randn(b, 1, h, d, dtype=dtype)
    k_new, v_new = randn(b, 1, hk, d, dtype=dtype), randn(b, 1, hk, d, dtype=dtype)
    out, lse = flashattn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, block_table=table,
        causal=True, num_splits=num_splits, return_softmax_lse=True)
    for bb in range(b):  # the new key/value were written at row seqlens[b]
        n = int(seqlens[bb])
        torch.testing.assert_close(gather(k_cache, table, bb, n + 1)[n], k_new[bb, 0], rtol=0,
                                   atol=0)
    ref, ref_lse = kvcache_ref(q, k_cache, v_cache, table, seqlens + 1, causal=True)
    naive, _ = kvcache_ref(q, k_cache, v_cache, table, seqlens + 1, causal=True, lowp=dtype)
    assert_close(out, ref, naive, dtype)
    assert_lse(lse, ref_lse)


@pytest.mark.parametrize("d", [128, 59])
def test_decode_cuda_graph(d):
    """A decode step (append + attend over a paged cache, split-KV) captured once and replayed
    for several steps; with d = 128 the captured call allocates nothing (workspace from
    plan_kvcache); with d = 59 its staged copies are allocated in the graph (memory nodes)."""
    torch.manual_seed(5)
    dtype, b, h, hk, page_size, max_sk = torch.bfloat16, 4, 16, 4, 16, 2048
    require_serving_instance(dtype, d)
    k_cache, v_cache, table = paged_cache(b, max_sk, page_size, hk, d, dtype)
    seqlens = torch.tensor([1000, 3, 1500, 64], dtype=torch.int32, device="cuda")
    q = randn(b, 1, h, d, dtype=dtype)
    k_new, v_new = randn(b, 1, hk, d, dtype=dtype), randn(b, 1, hk, d, dtype=dtype)
    out = torch.empty_like(q)
    lse_shape = (b, h, 1)
    args = dict(cache_seqlens=seqlens, block_table=table, causal=True, num_splits=0)
    plan = flashattn.plan_kvcache(q, k_cache, v_cache, k_new, v_new, **args)
    workspace = flashattn.allocate_workspace(plan, like=q)
    assert workspace.is_cuda and workspace.numel() == plan.workspace_bytes
    assert plan.kernel in ("splitkeys", "deep", "dims", "persistent", "heads")  # a decode kernel

    def step():
        return flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, **args,
                                                 out=out, workspace=workspace,
                                                 return_softmax_lse=True)

    # Warm up on a side stream (as torch.cuda.graphs recommends), then undo its append.
    k_saved, v_saved = k_cache.clone(), v_cache.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    k_cache.copy_(k_saved)
    v_cache.copy_(v_saved)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = step()
    assert lse.shape == lse_shape

    for it in range(3):
        q.copy_(randn(b, 1, h, d, dtype=dtype))
        k_new.copy_(randn(b, 1, hk, d, dtype=dtype))
        v_new.copy_(randn(b, 1, hk, d, dtype=dtype))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref, ref_lse = kvcache_ref(q, k_cache, v_cache, table, seqlens + 1, causal=True)
        naive, _ = kvcache_ref(q, k_cache, v_cache, table, seqlens + 1, causal=True, lowp=dtype)
        assert_close(out, ref, naive, dtype, f"replay {it}")
        assert_lse(lse, ref_lse)
        for bb in range(b):
            n = int(seqlens[bb])
            assert torch.equal(gather(k_cache, table, bb, n + 1)[n], k_new[bb, 0])
        seqlens.add_(1)  # the next decode step appends one row further


# ---- any head dim (issue 28): staged, zero-padded copies where d % 8 != 0 ---------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", ANY_HEAD_DIMS)
def test_any_head_dim_dense_varlen(dtype, d):
    require_serving_instance(dtype, d)
    torch.manual_seed(7)
    q, k, v = randn(2, 77, 4, d, dtype=dtype), randn(2, 131, 2, d, dtype=dtype), \
        randn(2, 131, 2, d, dtype=dtype)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    ref, ref_lse = dense_ref(q, k, v, causal=True)
    naive, _ = dense_ref(q, k, v, causal=True, lowp=dtype)
    assert_close(out, ref, naive, dtype)
    assert_lse(lse, ref_lse)
    # q, k, v slices of one packed buffer: strides 3 * h * d (not multiples of 8 for odd d)
    qkv = randn(2, 65, 3, 4, d, dtype=dtype)
    out = flashattn.flash_attn_qkvpacked_func(qkv, window_size=(16, 0))
    q, k, v = qkv.unbind(2)
    ref, _ = dense_ref(q, k, v, window=(16, 0))
    naive, _ = dense_ref(q, k, v, window=(16, 0), lowp=dtype)
    assert_close(out, ref, naive, dtype, "packed out")
    # varlen
    check_causal_varlen([1, 113, 0, 17], [17, 339, 5, 17], 4, 2, d, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", ANY_HEAD_DIMS)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_any_head_dim_kvcache_paged(dtype, d, num_splits):
    require_serving_instance(dtype, d)
    torch.manual_seed(8)
    b, h, hk, max_sk, page_size = 3, 8, 2, 300, 16
    k_cache, v_cache, table = paged_cache(b, max_sk, page_size, hk, d, dtype)
    seqlens = torch.tensor([299, 0, 117], dtype=torch.int32, device="cuda")
    q = randn(b, 1, h, d, dtype=dtype)
    k_new, v_new = randn(b, 1, hk, d, dtype=dtype), randn(b, 1, hk, d, dtype=dtype)
    out, lse = flashattn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, block_table=table,
        causal=True, num_splits=num_splits, return_softmax_lse=True)
    for bb in range(b):  # the new key/value were written into the caller's cache
        n = int(seqlens[bb])
        assert torch.equal(gather(k_cache, table, bb, n + 1)[n], k_new[bb, 0])
        assert torch.equal(gather(v_cache, table, bb, n + 1)[n], v_new[bb, 0])
    ref, ref_lse = kvcache_ref(q, k_cache, v_cache, table, seqlens + 1, causal=True)
    naive, _ = kvcache_ref(q, k_cache, v_cache, table, seqlens + 1, causal=True, lowp=dtype)
    assert_close(out, ref, naive, dtype)
    assert_lse(lse, ref_lse)


@pytest.mark.parametrize("d", ANY_HEAD_DIMS)
@pytest.mark.parametrize("paged", [False, True])
def test_any_head_dim_kvcache_rotary_matches_cpu(d, paged):
    """Append with GPT-NeoX rotary (rotary_dim <= d), cache_leftpad, cache_batch_idx (contiguous)
    or a block table (paged): the CUDA call against the CPU backend on copies of the inputs (the
    CPU backend is checked against the float64 oracle by test_cpu.py)."""
    dtype = torch.bfloat16
    require_serving_instance(dtype, d)
    torch.manual_seed(9)
    b, sq, h, hk, max_sk = 3, 2, 6, 3, 200
    if paged:
        k_cache, v_cache, table = paged_cache(b, max_sk, 16, hk, d, dtype)
        extra = dict(block_table=table)
    else:
        k_cache, v_cache = randn(b + 2, max_sk, hk, d, dtype=dtype), randn(b + 2, max_sk, hk, d, dtype=dtype)
        extra = dict(cache_batch_idx=torch.tensor([4, 0, 2], dtype=torch.int32, device="cuda"))
    extra["cache_leftpad"] = torch.tensor([3, 0, 1], dtype=torch.int32, device="cuda")
    seqlens = torch.tensor([198, 5, 77], dtype=torch.int32, device="cuda")
    rotary_dim = d // 2 * 2
    if rotary_dim:
        positions = 256  # >= every cache position (paged: 13 pages of 16)
        angles = torch.rand(positions, rotary_dim // 2, device="cuda", dtype=torch.float64) * 6.3
        extra.update(rotary_cos=angles.cos().to(dtype), rotary_sin=angles.sin().to(dtype),
                     rotary_interleaved=False)
    q = randn(b, sq, h, d, dtype=dtype)
    k_new, v_new = randn(b, sq, hk, d, dtype=dtype), randn(b, sq, hk, d, dtype=dtype)
    kc_cpu, vc_cpu = k_cache.cpu(), v_cache.cpu()
    cpu_extra = {name: (x.cpu() if torch.is_tensor(x) else x) for name, x in extra.items()}
    out, lse = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                                 cache_seqlens=seqlens, causal=True,
                                                 return_softmax_lse=True, **extra)
    out_cpu, lse_cpu = flashattn.flash_attn_with_kvcache(
        q.cpu(), kc_cpu, vc_cpu, k_new.cpu(), v_new.cpu(), cache_seqlens=seqlens.cpu(),
        causal=True, return_softmax_lse=True, **cpu_extra)
    torch.testing.assert_close(v_cache.cpu(), vc_cpu, rtol=0, atol=0)
    torch.testing.assert_close(k_cache.cpu(), kc_cpu, rtol=2 ** -7, atol=0)  # a bf16 ulp
    assert (out.cpu().double() - out_cpu.double()).abs().max().item() <= 2 * FLOOR[dtype]
    assert torch.equal(torch.isneginf(lse.cpu()), torch.isneginf(lse_cpu))
    fin = torch.isfinite(lse_cpu)
    assert (lse.cpu()[fin] - lse_cpu[fin]).abs().max().item() <= LSE_ATOL


@pytest.mark.parametrize("paged", [False, True])
def test_bad_cache_seqlens_is_reported_by_check_device_status(paged):
    """A cache_seqlens entry past the cache (issue 31): the call reads nothing outside the cache,
    that sequence gets output 0 and LSE -inf, the others match the CPU backend, and
    flashattn.check_device_status() raises ValueError naming the argument, the sequence and the
    value, once."""
    dtype = torch.bfloat16
    require_instance(dtype, 128)
    torch.manual_seed(11)
    b, h, hk, d, max_sk = 3, 8, 2, 128, 96
    if paged:
        k_cache, v_cache, table = paged_cache(b, max_sk, 16, hk, d, dtype)
        extra = dict(block_table=table)
    else:
        k_cache, v_cache = randn(b, max_sk, hk, d, dtype=dtype), randn(b, max_sk, hk, d, dtype=dtype)
        extra = {}
    flashattn.check_device_status()  # clear anything an earlier test left
    good = torch.tensor([40, 70, 25], dtype=torch.int32)
    bad = good.clone()
    bad[1] = 5000
    q = randn(b, 1, h, d, dtype=dtype)
    cpu_extra = {name: x.cpu() for name, x in extra.items()}
    out_cpu, lse_cpu = flashattn.flash_attn_with_kvcache(
        q.cpu(), k_cache.cpu(), v_cache.cpu(), cache_seqlens=good, return_softmax_lse=True, **cpu_extra)
    out, lse = flashattn.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=bad.cuda(), return_softmax_lse=True, **extra)
    with pytest.raises(ValueError, match=r"^cache_seqlens: .*sequence 1 .*5000"):
        flashattn.check_device_status(torch.cuda.current_stream())
    flashattn.check_device_status()  # cleared by the read
    out, lse = out.cpu(), lse.cpu()
    assert torch.all(out[1] == 0) and torch.all(torch.isneginf(lse[1]))
    for bb in (0, 2):
        assert (out[bb].double() - out_cpu[bb].double()).abs().max().item() <= 2 * FLOOR[dtype]
        assert (lse[bb] - lse_cpu[bb]).abs().max().item() <= LSE_ATOL


def test_bad_block_table_entry_is_reported():
    """A block_table entry past the pages: no access outside the cache, the fault reported."""
    dtype = torch.bfloat16
    require_instance(dtype, 128)
    b, h, hk, d, max_sk = 2, 8, 2, 128, 64
    k_cache, v_cache, table = paged_cache(b, max_sk, 16, hk, d, dtype)
    table[1, 0] = k_cache.shape[0] + 7
    flashattn.check_device_status()
    out = flashattn.flash_attn_with_kvcache(
        randn(b, 1, h, d, dtype=dtype), k_cache, v_cache, block_table=table,
        cache_seqlens=torch.tensor([60, 60], dtype=torch.int32, device="cuda"))
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match=r"^block_table: .*sequence 1 "):
        flashattn.check_device_status()
    flashattn.check_device_status()


def test_last_dim_not_contiguous():
    """torch inputs whose last dimension is strided are copied (as flash_attn does)."""
    require_instance(torch.float16, 64)
    torch.manual_seed(10)
    base = randn(3, 2, 33, 4, 64, 2, dtype=torch.float16)
    q, k, v = base[0, ..., 0], base[1, ..., 1], base[2, ..., 0]
    assert q.stride(-1) == 2
    out = flashattn.flash_attn_func(q, k, v, causal=True)
    expect = flashattn.flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    assert torch.equal(out, expect)


# ---- other CUDA frameworks ---------------------------------------------------------------------

def test_cupy():
    cupy = pytest.importorskip("cupy")
    require_instance(torch.float16, 128)
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 65, 8, 128)).astype(np.float16) for _ in range(3))
    out, lse, _ = flashattn.flash_attn_func(cupy.asarray(q), cupy.asarray(k), cupy.asarray(v),
                                            causal=True, return_attn_probs=True)
    assert isinstance(out, cupy.ndarray) and out.dtype == np.float16
    tq, tk, tv = (torch.from_numpy(x).cuda() for x in (q, k, v))
    ref, ref_lse = dense_ref(tq, tk, tv, causal=True)
    naive, _ = dense_ref(tq, tk, tv, causal=True, lowp=torch.float16)
    assert_close(torch.from_numpy(cupy.asnumpy(out)).cuda(), ref, naive, torch.float16)
    assert_lse(torch.from_numpy(cupy.asnumpy(lse)).cuda(), ref_lse)


@pytest.mark.parametrize("dtype", DTYPES)
def test_jax(dtype):
    # JAX preallocates 75% of the GPU by default, and its backend start can abort the process
    # (next to torch/CuPy): probe it in a child process first.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    probe = "import jax; assert any(d.platform == 'gpu' for d in jax.devices())"
    if subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode != 0:
        pytest.skip("JAX is not installed or has no usable GPU")
    import jax

    gpus = [dev for dev in jax.devices() if dev.platform == "gpu"]
    require_instance(dtype, 128)
    torch.manual_seed(7)
    tq, tk, tv = (randn(2, 65, 8, 128, dtype=dtype) for _ in range(3))
    # JAX arrays on the GPU holding the same numbers (through float32 NumPy: exact)
    jdtype = {torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype]
    jq, jk, jv = (jax.device_put(x.float().cpu().numpy(), gpus[0]).astype(jdtype)
                  for x in (tq, tk, tv))
    out, lse = flashattn.flash_attn_with_kvcache(jq, jk, jv, causal=True,
                                                 return_softmax_lse=True)
    assert isinstance(out, jax.Array) and str(out.dtype) == jdtype
    out = torch.from_numpy(np.array(out.astype("float32"))).cuda()
    ref, ref_lse = dense_ref(tq, tk, tv, causal=True)
    naive, _ = dense_ref(tq, tk, tv, causal=True, lowp=dtype)
    assert_close(out, ref, naive, dtype)
    assert_lse(torch.from_numpy(np.array(lse)).cuda(), ref_lse)


# ---- FP8 (e4m3, issue 29): against the float64 oracle on the dequantized inputs ----------------

def fp8_cuda(x8, descale):
    """An e4m3 tensor and its descale (made on the host by fp8_cases.quantize) on the GPU."""
    return x8.cuda(), None if descale is None else descale.cuda()


@pytest.mark.parametrize("descale", ["scalar", "bhk"])
@pytest.mark.parametrize("b,sq,sk", [(1, 1, 1), (2, 113, 339), (2, 339, 113)])
@pytest.mark.parametrize("h,hk", [(8, 8), (8, 2), (7, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_dense(descale, b, sq, sk, h, hk, causal):
    require_instance(torch.bfloat16, 128)  # an e4m3 q computes in bf16
    from fp8_cases import dq, quantize, randn as host_randn
    import reference as npref
    from conftest import assert_fp8_close

    gen = torch.Generator().manual_seed(12)
    d = 128
    q8, qd = quantize(host_randn(gen, b, sq, h, d), hk, descale)
    k8, kd = quantize(host_randn(gen, b, sk, hk, d) * 3, hk, descale)
    v8, vd = quantize(host_randn(gen, b, sk, hk, d), hk, descale)
    (cq, cqd), (ck, ckd), (cv, cvd) = fp8_cuda(q8, qd), fp8_cuda(k8, kd), fp8_cuda(v8, vd)
    out, lse, _ = flashattn.flash_attn_func(cq, ck, cv, causal=causal, return_attn_probs=True,
                                            q_descale=cqd, k_descale=ckd, v_descale=cvd)
    assert out.dtype == torch.bfloat16 and out.device == cq.device
    ref, ref_lse = npref.dense(dq(q8, qd), dq(k8, kd), dq(v8, vd), causal=causal)
    assert_fp8_close(out.double().cpu().numpy(), ref)
    assert_fp8_close(lse.double().cpu().numpy(), ref_lse, "lse")


def test_fp8_varlen():
    require_instance(torch.bfloat16, 128)
    from fp8_cases import cu, dq, quantize, randn as host_randn
    import reference as npref
    from conftest import assert_fp8_close

    gen = torch.Generator().manual_seed(13)
    lq, lk, h, hk, d = [1, 113, 0, 339, 17], [17, 339, 5, 113, 17], 8, 2, 128
    rows_q, rows_k = np.repeat(np.arange(len(lq)), lq), np.repeat(np.arange(len(lk)), lk)
    q8, qd = quantize(host_randn(gen, sum(lq), h, d), hk, "bhk", rows_q, len(lq))
    k8, kd = quantize(host_randn(gen, sum(lk), hk, d), hk, "bhk", rows_k, len(lk))
    v8, vd = quantize(host_randn(gen, sum(lk), hk, d), hk, "bhk", rows_k, len(lk))
    (cq, cqd), (ck, ckd), (cv, cvd) = fp8_cuda(q8, qd), fp8_cuda(k8, kd), fp8_cuda(v8, vd)
    out, lse, _ = flashattn.flash_attn_varlen_func(
        cq, ck, cv, cu(lq).cuda(), cu(lk).cuda(), max(lq), max(lk), causal=True,
        return_attn_probs=True, q_descale=cqd, k_descale=ckd, v_descale=cvd)
    assert out.dtype == torch.bfloat16
    ref, ref_lse = npref.varlen(dq(q8, qd, rows_q), dq(k8, kd, rows_k), dq(v8, vd, rows_k),
                                cu(lq).numpy(), cu(lk).numpy(), causal=True)
    assert_fp8_close(out.double().cpu().numpy(), ref)
    assert_fp8_close(lse.double().cpu().numpy(), ref_lse, "lse")


@pytest.mark.parametrize("q_dtype", ["bf16", "fp16", "e4m3"])
@pytest.mark.parametrize("page_size", [None, 1, 16, 256])
@pytest.mark.parametrize("num_splits", [1, 0, 4])
def test_fp8_kvcache(q_dtype, page_size, num_splits):
    """An e4m3 cache (contiguous or paged) under a bf16 / fp16 / e4m3 q: one new row appended
    (quantized into the cache, some saturating), decode over up to 1000 keys."""
    pytest.importorskip("ml_dtypes")  # the oracle rounds to bf16 through it
    from fp8_cases import E4M3, check_fp8_kvcache, kvcache_case

    q_torch = {"bf16": torch.bfloat16, "fp16": torch.float16, "e4m3": E4M3}[q_dtype]
    require_instance(torch.float16 if q_dtype == "fp16" else torch.bfloat16, 128)
    gen = torch.Generator().manual_seed(14)
    case, out_dtype = kvcache_case(gen, q_torch, "bhk", sq=1, s_new=1, h=8, hk=2, d=128,
                                   max_sk=1000, page_size=page_size)
    case = {name: t.cuda() for name, t in case.items()}
    check_fp8_kvcache(case, out_dtype, num_splits=num_splits)


@pytest.mark.parametrize("page_size", [None, 16])
def test_fp8_kvcache_head_dim_slice(page_size):
    """Head dim 120 as the first 120 columns of a d = 128 e4m3 cache, whose rows stay 16-byte
    aligned: the fp8 decode pipeline reads 8 bytes of each row's last 16-byte piece and zero-fills
    the rest (components/fp8_warp_kv.h)."""
    pytest.importorskip("ml_dtypes")
    from conftest import assert_fp8_close
    from fp8_cases import check_lse, f64, kvcache_case, kvcache_reference

    require_instance(torch.bfloat16, 128)
    gen = torch.Generator().manual_seed(16)
    case, out_dtype = kvcache_case(gen, torch.bfloat16, "bhk", sq=1, s_new=0, h=8, hk=2, d=128,
                                   max_sk=1000, page_size=page_size)
    sliced = {name: t.cuda()[..., :120] if name in ("q", "k_cache", "v_cache") else t.cuda()
              for name, t in case.items()}
    out, lse = flashattn.flash_attn_with_kvcache(**sliced, causal=True, return_softmax_lse=True)
    r, rl, _, _ = kvcache_reference(sliced, out_dtype)
    assert_fp8_close(f64(out), r)
    check_lse(lse, rl)


@pytest.mark.parametrize("q_scale", [3e5, 1e-6])
def test_fp8_kvcache_q_range(q_scale):
    """A bf16 q far outside fp16's range (|q| up to ~1e6) or deep in its subnormals (~1e-6): the
    fp8 decode pipeline converts it into fp16 times a power of two (rescale_q_into_fp16)."""
    pytest.importorskip("ml_dtypes")
    from fp8_cases import check_fp8_kvcache, kvcache_case

    require_instance(torch.bfloat16, 128)
    gen = torch.Generator().manual_seed(17)
    case, out_dtype = kvcache_case(gen, torch.bfloat16, "bhk", sq=1, s_new=0, h=8, hk=2, d=128,
                                   max_sk=700, page_size=None)
    case["q"] = (case["q"].float() * q_scale).to(torch.bfloat16)
    case = {name: t.cuda() for name, t in case.items()}
    check_fp8_kvcache(case, out_dtype, softmax_scale=1.0 / (q_scale * 11.3))


@pytest.mark.parametrize("page_size", [None, 16])
def test_fp8_kvcache_append_rotary(page_size):
    """bf16 q over an e4m3 cache: 3 rows appended with GPT-NeoX rotary (rotated in fp32, rounded
    to bf16, then quantized: the stored k may differ from the oracle's by one e4m3 step)."""
    pytest.importorskip("ml_dtypes")
    from fp8_cases import check_fp8_kvcache, kvcache_case

    require_instance(torch.bfloat16, 128)
    gen = torch.Generator().manual_seed(15)
    case, out_dtype = kvcache_case(gen, torch.bfloat16, "scalar", sq=3, s_new=3, h=8, hk=2,
                                   d=128, max_sk=300, page_size=page_size, rotary_dim=64)
    case = {name: t.cuda() for name, t in case.items()}
    check_fp8_kvcache(case, out_dtype, interleaved=False, k_cache_ulps=1)
