"""FP8 (e4m3) on the CPU backend (issue 29): torch CPU tensors of torch.float8_e4m3fn (and NumPy
ml_dtypes.float8_e4m3fn) with q_descale / k_descale / v_descale, as FlashAttention-3 takes them,
against reference.py (float64) on the dequantized inputs, under the FP8 bound (conftest.py).

Inputs are random normal values quantized the way a user would: descale = amax / 448, one for the
tensor (scalar) or one per (batch, KV head).
"""
import numpy as np
import pytest

import flashattn
import reference as ref
from conftest import assert_fp8_close

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

from fp8_cases import (E4M3, check_fp8_kvcache, check_lse, cu, dq, f64,  # noqa: E402
                       kvcache_case, page_table, quantize, randn)

DESCALES = ["none", "scalar", "bhk"]


# ---- the oracle's e4m3 rounding ------------------------------------------------------------------

def test_round_e4m3_matches_torch():
    """reference.round_e4m3 (written from the format) against torch's conversion, which rounds
    to nearest even but does not saturate (hence the clamp): normals, subnormals, ties, 448+. On
    float32 values (what the library quantizes): torch rounds a float64 through float32 first."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(100000) * np.exp2(rng.uniform(-13, 10, 100000))
    x = np.concatenate([x, [0.0, 2.0**-10, 3 * 2.0**-10, 2.0**-6, 15.5, 448, 463.9, 464, 1e4]])
    x = x.astype(np.float32).astype(np.float64)
    want = torch.from_numpy(np.clip(x, -ref.E4M3_MAX, ref.E4M3_MAX)).to(E4M3).double().numpy()
    np.testing.assert_array_equal(ref.round_e4m3(x), want)


# ---- prefill ------------------------------------------------------------------------------------

@pytest.mark.parametrize("descale", DESCALES)
@pytest.mark.parametrize("h,hk", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_dense(descale, h, hk, causal):
    gen = torch.Generator().manual_seed(1)
    b, sq, sk, d = 2, 37, 53, 64
    q8, qd = quantize(randn(gen, b, sq, h, d), hk, descale)
    k8, kd = quantize(randn(gen, b, sk, hk, d) * 3, hk, descale)
    v8, vd = quantize(randn(gen, b, sk, hk, d), hk, descale)
    out, lse, _ = flashattn.flash_attn_func(q8, k8, v8, causal=causal, return_attn_probs=True,
                                            q_descale=qd, k_descale=kd, v_descale=vd)
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, h, d)
    r, rl = ref.dense(dq(q8, qd), dq(k8, kd), dq(v8, vd), causal=causal)
    assert_fp8_close(out.double().numpy(), r)
    check_lse(lse, rl)


def test_fp8_dense_out_and_scalar_shape_1():
    """out= (bf16) written in place; a scalar descale of shape (1); softmax_scale and a window."""
    gen = torch.Generator().manual_seed(2)
    b, s, h, d = 2, 29, 4, 32
    q8, qd = quantize(randn(gen, b, s, h, d), 2, "scalar")
    k8, kd = quantize(randn(gen, b, s, 2, d), 2, "scalar")
    v8, vd = quantize(randn(gen, b, s, 2, d), 2, "scalar")
    qd, kd, vd = qd.reshape(1), kd.reshape(1), vd.reshape(1)
    out = torch.full((b, s, h, d), float("nan"), dtype=torch.bfloat16)
    res = flashattn.flash_attn_func(q8, k8, v8, softmax_scale=0.2, window_size=(7, 3), out=out,
                                    q_descale=qd, k_descale=kd, v_descale=vd)
    assert res is out
    r, _ = ref.dense(dq(q8, qd), dq(k8, kd), dq(v8, vd), scale=0.2, window=(7, 3))
    assert_fp8_close(out.double().numpy(), r)


@pytest.mark.parametrize("descale", ["scalar", "bhk"])
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_varlen(descale, causal):
    gen = torch.Generator().manual_seed(3)
    lq, lk = [3, 0, 17, 40, 1], [17, 5, 17, 33, 0]
    h, hk, d = 4, 2, 64
    rows_q = np.repeat(np.arange(len(lq)), lq)
    rows_k = np.repeat(np.arange(len(lk)), lk)
    q8, qd = quantize(randn(gen, sum(lq), h, d), hk, descale, rows_q, len(lq))
    k8, kd = quantize(randn(gen, sum(lk), hk, d), hk, descale, rows_k, len(lk))
    v8, vd = quantize(randn(gen, sum(lk), hk, d), hk, descale, rows_k, len(lk))
    out, lse, _ = flashattn.flash_attn_varlen_func(
        q8, k8, v8, cu(lq), cu(lk), max(lq), max(lk), causal=causal, return_attn_probs=True,
        q_descale=qd, k_descale=kd, v_descale=vd)
    assert out.dtype == torch.bfloat16 and out.shape == (sum(lq), h, d)
    r, rl = ref.varlen(dq(q8, qd, rows_q), dq(k8, kd, rows_k), dq(v8, vd, rows_k),
                       cu(lq).numpy(), cu(lk).numpy(), causal=causal)
    assert_fp8_close(out.double().numpy(), r)
    check_lse(lse, rl)


def test_fp8_varlen_paged():
    gen = torch.Generator().manual_seed(4)
    lq, lk, page_size, h, hk, d = [1, 7, 3], [40, 17, 1], 16, 4, 2, 64
    table, owner = page_table(gen, len(lk), 3)
    rows_q = np.repeat(np.arange(len(lq)), lq)
    q8, qd = quantize(randn(gen, sum(lq), h, d), hk, "bhk", rows_q, len(lq))
    k8, kd = quantize(randn(gen, len(owner), page_size, hk, d), hk, "bhk", owner, len(lk))
    v8, vd = quantize(randn(gen, len(owner), page_size, hk, d), hk, "bhk", owner, len(lk))
    out = flashattn.flash_attn_varlen_func(q8, k8, v8, cu(lq), cu(lk), max(lq), max(lk),
                                           causal=True, block_table=table, q_descale=qd,
                                           k_descale=kd, v_descale=vd)
    r, _ = ref.varlen(dq(q8, qd, rows_q), dq(k8, kd, owner), dq(v8, vd, owner), cu(lq).numpy(),
                      cu(lk).numpy(), block_table=table.numpy(), causal=True)
    assert_fp8_close(out.double().numpy(), r)


def test_fp8_packed_variants():
    """The packed calls pass the descales on: qkv and kv slices of one e4m3 buffer."""
    gen = torch.Generator().manual_seed(6)
    b, s, h, d = 2, 23, 4, 32
    q8, qd = quantize(randn(gen, b, s, h, d), h, "bhk")
    k8, kd = quantize(randn(gen, b, s, h, d), h, "bhk")
    v8, vd = quantize(randn(gen, b, s, h, d), h, "bhk")
    r, _ = ref.dense(dq(q8, qd), dq(k8, kd), dq(v8, vd), causal=True)
    scales = dict(q_descale=qd, k_descale=kd, v_descale=vd)
    qkv = torch.stack([q8.view(torch.uint8), k8.view(torch.uint8), v8.view(torch.uint8)], dim=2).view(E4M3)
    out = flashattn.flash_attn_qkvpacked_func(qkv, causal=True, **scales)
    assert_fp8_close(out.double().numpy(), r)
    kv = qkv[:, :, 1:]
    out = flashattn.flash_attn_kvpacked_func(q8, kv, causal=True, **scales)
    assert_fp8_close(out.double().numpy(), r)
    lens = [s] * b
    out = flashattn.flash_attn_varlen_qkvpacked_func(qkv.reshape(b * s, 3, h, d), cu(lens), s, causal=True, **scales)
    r_var, _ = ref.varlen(dq(q8, qd).reshape(b * s, h, d), dq(k8, kd).reshape(b * s, h, d),
                          dq(v8, vd).reshape(b * s, h, d), cu(lens).numpy(), cu(lens).numpy(), causal=True)
    assert_fp8_close(out.double().numpy(), r_var)
    out = flashattn.flash_attn_varlen_kvpacked_func(q8.reshape(b * s, h, d), kv.reshape(b * s, 2, h, d), cu(lens),
                                                    cu(lens), s, s, causal=True, **scales)
    assert_fp8_close(out.double().numpy(), r_var)


def test_fp8_numpy_ml_dtypes():
    """NumPy float8_e4m3fn arrays (ml_dtypes) with NumPy descales: out is ml_dtypes.bfloat16."""
    gen = torch.Generator().manual_seed(5)
    b, s, h, hk, d = 2, 21, 4, 2, 64
    (q8, qd), (k8, kd), (v8, vd) = (quantize(randn(gen, b, s, heads, d), hk, "bhk")
                                    for heads in (h, hk, hk))
    to_np = lambda t: t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    out, lse, _ = flashattn.flash_attn_func(to_np(q8), to_np(k8), to_np(v8), causal=True,
                                            return_attn_probs=True, q_descale=qd.numpy(),
                                            k_descale=kd.numpy(), v_descale=vd.numpy())
    assert out.dtype == ml_dtypes.bfloat16 and lse.dtype == np.float32
    r, rl = ref.dense(dq(q8, qd), dq(k8, kd), dq(v8, vd), causal=True)
    assert_fp8_close(out.astype(np.float64), r)
    assert_fp8_close(lse, rl, "lse")


# ---- kv cache -----------------------------------------------------------------------------------

@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16, E4M3])
@pytest.mark.parametrize("descale", ["scalar", "bhk"])
@pytest.mark.parametrize("page_size", [None, 16])
@pytest.mark.parametrize("s_new,sq", [(0, 1), (1, 1), (3, 3)])
def test_fp8_kvcache(q_dtype, descale, page_size, s_new, sq):
    gen = torch.Generator().manual_seed(6)
    case, out_dtype = kvcache_case(gen, q_dtype, descale, sq=sq, s_new=s_new,
                                          page_size=page_size)
    c = check_fp8_kvcache(case, out_dtype)
    if s_new:  # some appended values were beyond 448 * descale: stored saturated, not NaN
        assert (c["k_cache"].double().abs() == ref.E4M3_MAX).any()
        assert not torch.isnan(c["k_cache"].double()).any()


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("page_size", [None, 16])
def test_fp8_kvcache_rotary(interleaved, page_size):
    gen = torch.Generator().manual_seed(7)
    case, out_dtype = kvcache_case(gen, torch.bfloat16, "bhk", sq=2, s_new=2,
                                          page_size=page_size, rotary_dim=32)
    check_fp8_kvcache(case, out_dtype, interleaved=interleaved, k_cache_ulps=1)


def test_fp8_kvcache_plan():
    gen = torch.Generator().manual_seed(8)
    case, _ = kvcache_case(gen, E4M3, "bhk", sq=1, s_new=1, page_size=16)
    plan = flashattn.plan_kvcache(**case, causal=True, num_splits=3)
    assert plan.num_splits >= 1 and plan.kernel == "cpu"


# ---- errors -------------------------------------------------------------------------------------

def test_fp8_errors():
    """The library's rules (ValueError / TypeError / NotImplementedError, the argument named);
    out is never written by a refused call."""
    gen = torch.Generator().manual_seed(9)
    b, s, h, hk, d = 2, 8, 4, 2, 32
    (q8, qd), (k8, kd), (v8, vd) = (quantize(randn(gen, b, s, heads, d), hk, "bhk")
                                    for heads in (h, hk, hk))
    qb = randn(gen, b, s, h, d, dtype=torch.bfloat16)
    kb, vb = (randn(gen, b, s, hk, d, dtype=torch.bfloat16) for _ in range(2))
    out = torch.full((b, s, h, d), float("nan"), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="q_descale"):  # a descale for a bf16 q
        flashattn.flash_attn_func(qb, kb, vb, q_descale=qd, out=out)
    with pytest.raises(ValueError, match="k_descale"):  # for a bf16 cache
        flashattn.flash_attn_with_kvcache(qb, kb, vb, k_descale=kd)
    with pytest.raises(ValueError, match="k_descale"):  # neither scalar nor (b, hk)
        flashattn.flash_attn_func(q8, k8, v8, k_descale=torch.ones(b, h), out=out)
    with pytest.raises(ValueError, match="v_descale"):
        flashattn.flash_attn_func(q8, k8, v8, v_descale=torch.ones(3), out=out)
    with pytest.raises(TypeError, match="q_descale"):  # fp32 only
        flashattn.flash_attn_func(q8, k8, v8, q_descale=qd.double(), out=out)
    with pytest.raises(TypeError, match="v"):  # e4m3 k with a bf16 v
        flashattn.flash_attn_func(q8, k8, vb, out=out)
    with pytest.raises(TypeError, match="k"):  # prefill: q, k, v all e4m3
        flashattn.flash_attn_func(q8, kb, vb, out=out)
    with pytest.raises(TypeError, match="out"):  # the output of an e4m3 q is bf16
        flashattn.flash_attn_func(q8, k8, v8, out=torch.empty(b, s, h, d, dtype=torch.float16))
    assert torch.isnan(out).all()
    # kv cache: mixed e4m3 / bf16 caches, and rotary of an e4m3 q
    seqlens = torch.full((b,), 4, dtype=torch.int32)
    with pytest.raises(TypeError, match="v_cache"):
        flashattn.flash_attn_with_kvcache(qb, k8, vb, cache_seqlens=seqlens, k_descale=kd)
    with pytest.raises(NotImplementedError, match="rotary"):
        cos = torch.ones(2 * s, 8, dtype=torch.bfloat16)
        flashattn.flash_attn_with_kvcache(q8, k8, v8, cache_seqlens=seqlens, rotary_cos=cos,
                                          rotary_sin=cos, q_descale=qd)
