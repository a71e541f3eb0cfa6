"""FP8 (e4m3) test inputs and their float64 oracle results, for test_fp8.py (CPU) and
test_gpu.py (CUDA): torch tensors quantized the way a user would (descale = amax / 448, one for
the tensor or one per (batch, KV head)), reference.py on the dequantized values.
"""
import numpy as np
import torch

import flashattn
import reference as ref
from conftest import assert_fp8_close, assert_lse_close

E4M3 = torch.float8_e4m3fn


def randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


def quantize(x, hk, kind, batch_of=None, batch=None):
    """x (float, dim 0 the batch, or rows / pages whose sequence batch_of gives) -> (e4m3 tensor,
    descale): kind "none" (descale None: x must fit e4m3 as it is), "scalar" (shape ()) or "bhk"
    (batch, hk), each amax / 448 of the values it scales."""
    if kind == "none":
        return x.clamp(-ref.E4M3_MAX, ref.E4M3_MAX).to(E4M3), None
    heads = x.shape[-2]
    if kind == "scalar":
        descale = (x.abs().amax() / ref.E4M3_MAX).clamp_min(1e-12).float()
        factors = descale
    else:
        rows = torch.arange(x.shape[0]) if batch_of is None else torch.as_tensor(batch_of)
        batch = x.shape[0] if batch is None else batch
        amax_rows = x.abs().reshape(x.shape[0], -1, hk, heads // hk, x.shape[-1]).amax(
            dim=(1, 3, 4))  # (rows, hk)
        descale = torch.stack([amax_rows[rows == b].amax(0) if (rows == b).any()
                               else torch.ones(hk) for b in range(batch)])
        descale = (descale / ref.E4M3_MAX).clamp_min(1e-12).float()
        per_head = descale.repeat_interleave(heads // hk, dim=1)[rows]  # (rows, heads)
        factors = per_head.reshape(x.shape[0], *([1] * (x.dim() - 3)), heads, 1)
    return (x / factors).clamp(-ref.E4M3_MAX, ref.E4M3_MAX).to(E4M3), descale


def f64(t):
    """A tensor's values (e4m3 ones exact) as a float64 NumPy array, on the host."""
    return None if t is None else t.double().cpu().numpy()


def dq(x8, descale, batch_of=None):
    """The dequantized values the oracle attends over."""
    return ref.dequantize(f64(x8), f64(descale), batch_of)


def cu(lengths):
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)


def page_table(gen, batch, max_pages):
    """A shuffled block table (batch, max_pages) over batch * max_pages + 2 pages, and the
    sequence of each page (the two unused pages: 0)."""
    num_pages = batch * max_pages + 2
    table = torch.randperm(num_pages, generator=gen)[:batch * max_pages].reshape(batch, max_pages)
    owner = np.zeros(num_pages, np.int64)
    for b in range(batch):
        owner[table[b].numpy()] = b
    return table.to(torch.int32), owner


def kvcache_case(gen, q_dtype, descale, *, b=3, sq=3, s_new=3, h=4, hk=2, d=64, max_sk=96,
                 page_size=None, rotary_dim=0):
    """An e4m3 cache (contiguous or paged) with its descales, q of q_dtype (bf16, fp16, e4m3),
    k/v to append of out's dtype (scaled up so that some saturate at +-448 * descale)."""
    out_dtype = torch.bfloat16 if q_dtype == E4M3 else q_dtype
    c = {}
    if q_dtype == E4M3:
        c["q"], c["q_descale"] = quantize(randn(gen, b, sq, h, d), hk, descale)
    else:
        c["q"] = randn(gen, b, sq, h, d, dtype=q_dtype)
    seqlens = torch.randint(0, max_sk - s_new + 1, (b,), generator=gen, dtype=torch.int32)
    seqlens[0] = max_sk - s_new
    c["cache_seqlens"] = seqlens
    owner = None
    capacity = max_sk  # keys a sequence can hold: whole pages when paged
    if page_size is None:
        shape = (b, max_sk, hk, d)
    else:
        max_pages = -(-max_sk // page_size)
        c["block_table"], owner = page_table(gen, b, max_pages)
        shape = (len(owner), page_size, hk, d)
        capacity = max_pages * page_size
    c["k_cache"], c["k_descale"] = quantize(randn(gen, *shape), hk, descale, owner, b)
    c["v_cache"], c["v_descale"] = quantize(randn(gen, *shape), hk, descale, owner, b)
    if s_new:
        c["k"] = randn(gen, b, s_new, hk, d, dtype=out_dtype) * 2
        c["v"] = randn(gen, b, s_new, hk, d, dtype=out_dtype) * 2
    if rotary_dim:
        # a row for every cache position and every query position
        angles = torch.rand(capacity + sq, rotary_dim // 2, generator=gen, dtype=torch.float64) * 6.3
        c["rotary_cos"], c["rotary_sin"] = angles.cos().to(out_dtype), angles.sin().to(out_dtype)
    return c, out_dtype


def kvcache_reference(case, out_dtype, causal=True, interleaved=True, scale=None):
    """reference.kvcache of a kvcache_case (tensors on any device): out, lse, and the caches'
    stored values after the append (float64)."""
    import ml_dtypes  # the rotated q and new keys are rounded to bf16 as the library stores them

    numpy_dtype = {torch.bfloat16: ml_dtypes.bfloat16, torch.float16: np.float16}[out_dtype]
    table = case.get("block_table")
    return ref.kvcache(
        f64(case["q"]), f64(case["k_cache"]), f64(case["v_cache"]), k_new=f64(case.get("k")),
        v_new=f64(case.get("v")), cos=f64(case.get("rotary_cos")),
        sin=f64(case.get("rotary_sin")), cache_seqlens=f64(case["cache_seqlens"]).astype(np.int64),
        block_table=None if table is None else f64(table).astype(np.int64), causal=causal,
        rotary_interleaved=interleaved, dtype=numpy_dtype, cache_e4m3=True, scale=scale,
        q_descale=f64(case.get("q_descale")), k_descale=f64(case["k_descale"]),
        v_descale=f64(case["v_descale"]))


def check_lse(lse, ref_lse):
    """LSE (fp32) by the 16-bit inputs' rule: e4m3 values are exact in bf16/fp16, and the
    descales only scale the scores."""
    assert lse.dtype == torch.float32
    assert_lse_close(f64(lse), ref_lse, np.float16)


def check_fp8_kvcache(case, out_dtype, causal=True, interleaved=True, k_cache_ulps=0, **call_kw):
    """flash_attn_with_kvcache on copies of the caches; out and LSE against the oracle, and every
    cache row against the oracle's stored values (appended rows quantized, the others kept):
    exact, or k within k_cache_ulps e4m3 steps (rotary rounds the rotation once, in fp32)."""
    c = dict(case, k_cache=case["k_cache"].clone(), v_cache=case["v_cache"].clone())
    out, lse = flashattn.flash_attn_with_kvcache(**c, causal=causal, rotary_interleaved=interleaved,
                                                 return_softmax_lse=True, **call_kw)
    assert out.dtype == out_dtype and c["k_cache"].dtype == E4M3
    r, rl, kc, vc = kvcache_reference(case, out_dtype, causal=causal, interleaved=interleaved,
                                      scale=call_kw.get("softmax_scale"))
    assert_fp8_close(f64(out), r)
    check_lse(lse, rl)
    np.testing.assert_array_equal(f64(c["v_cache"]), vc)
    steps = np.ldexp(1.0, np.maximum(np.frexp(np.abs(kc))[1] - 1, ref.E4M3_MIN_NORMAL_EXP) - 3)
    assert (np.abs(f64(c["k_cache"]) - kc) <= k_cache_ulps * steps).all(), "k_cache"
    return c
