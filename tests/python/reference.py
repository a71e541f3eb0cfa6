"""A plain NumPy float64 attention oracle for the Python tests.

Written from the semantics in docs (FlashAttention-2's), sharing no code with src/: the full
score matrix of each (sequence, head), the masks written as inequalities, softmax by np.exp.
``lowp`` gives the "naive same-dtype" variant of the pass rule: probabilities and output
rounded to the storage dtype.

FP8 (e4m3): the oracle attends over the dequantized inputs (``dequantize``: descale * stored);
``round_e4m3`` is the e4m3 rounding written from the format (1-4-3 bits, bias 7, max 448), for
the rows a kv-cache call quantizes into an e4m3 cache.
"""
from __future__ import annotations

import numpy as np


def round_to(x, dtype):
    """x rounded to a storage dtype, returned as float64."""
    return np.asarray(x).astype(dtype).astype(np.float64)


E4M3_MAX = 448.0  # the largest finite float8_e4m3fn value
E4M3_MIN_NORMAL_EXP = -6  # 2^-6: below it the spacing stays 2^-9 (subnormals)


def round_e4m3(x):
    """x rounded to the nearest float8_e4m3fn value, ties to even, saturated at +-448 (how the
    library quantizes), as float64."""
    x = np.asarray(x, np.float64)
    _, e = np.frexp(np.abs(x))  # |x| = m * 2^e, m in [0.5, 1): the binade is 2^(e - 1)
    binade = np.maximum(e - 1, E4M3_MIN_NORMAL_EXP)
    spacing = np.ldexp(1.0, binade - 3)  # 3 mantissa bits
    return np.clip(np.round(x / spacing) * spacing, -E4M3_MAX, E4M3_MAX)  # np.round: ties to even


def descale_factors(descale, batch, heads):
    """The factor of each (batch row, head) of a tensor with `heads` heads: (batch, heads). descale:
    None (1), a scalar (shape () or (1)), or (b, hk) per KV head (a query head uses its KV
    head's factor)."""
    if descale is None:
        return np.ones((batch, heads))
    d = np.asarray(descale, np.float64)
    if d.size == 1 and d.ndim < 2:
        return np.full((batch, heads), float(d.reshape(())))
    return np.repeat(d, heads // d.shape[1], axis=1)


def dequantize(x, descale, batch_of=None):
    """descale * x in float64 for an e4m3 tensor x (..., heads, d) whose dim 0 is the batch, or with
    batch_of (x.shape[0]) the sequence of each row / page (varlen rows, paged caches)."""
    x = np.asarray(x).astype(np.float64)
    if descale is None:
        return x
    rows = np.arange(x.shape[0]) if batch_of is None else np.asarray(batch_of)
    f = descale_factors(descale, int(rows.max(initial=0)) + 1, x.shape[-2])[rows]
    return x * f.reshape(f.shape[0], *([1] * (x.ndim - 3)), x.shape[-2], 1)


def quantize_rows(x, factors, dtype):
    """The e4m3 values an e4m3 cache stores for new rows x (s, hk, d) of batch b: x rounded to
    dtype (out's), divided by the factors (hk) of b in fp32, rounded to e4m3 (round_e4m3)."""
    x = round_to(x, dtype).astype(np.float32)
    return round_e4m3(x / np.asarray(factors, np.float32)[None, :, None])


def attend(q, k, v, *, scale=None, causal=False, window=(-1, -1), softcap=0.0, slopes=None,
           lowp=None):
    """One sequence. q (sq, h, d), k (sk, hk, d), v (sk, hk, dv), any float dtype.

    slopes: (h) ALiBi slopes or None. Returns out (sq, h, dv) and lse (h, sq) in float64;
    a query row that sees no key gets out 0 and lse -inf.
    """
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64)
    v = np.asarray(v, np.float64)
    sq, h, d = q.shape
    sk, hk, dv = v.shape
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    left, right = window
    if causal:
        right = 0
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    diag = i + sk - sq  # the key aligned with query i (bottom-right)
    visible = np.ones((sq, sk), bool)
    if left >= 0:
        visible &= j >= diag - left
    if right >= 0:
        visible &= j <= diag + right
    out = np.zeros((sq, h, dv))
    lse = np.full((h, sq), -np.inf)
    group = h // hk
    for head in range(h):
        kh = head // group
        s = q[:, head, :] @ k[:, kh, :].T  # (sq, sk)
        if softcap > 0:
            s = softcap * np.tanh(s * scale / softcap)
        else:
            s = s * scale
        if slopes is not None:
            s = s - slopes[head] * np.abs(diag - j)
        s = np.where(visible, s, -np.inf)
        m = s.max(axis=1, keepdims=True) if sk > 0 else np.full((sq, 1), -np.inf)
        m_safe = np.where(np.isfinite(m), m, 0.0)
        p = np.exp(s - m_safe)  # masked: exp(-inf) = 0
        denom = p.sum(axis=1, keepdims=True)
        has_key = denom[:, 0] > 0
        p = np.divide(p, denom, out=np.zeros_like(p), where=denom > 0)
        if lowp is not None:
            p = round_to(p, lowp)
        o = p @ v[:, kh, :]
        if lowp is not None:
            o = round_to(o, lowp)
        out[:, head, :] = o
        lse[head, has_key] = (np.log(denom[has_key, 0]) + m_safe[has_key, 0])
    return out, lse


def slopes_of(alibi, b):
    if alibi is None:
        return None
    alibi = np.asarray(alibi, np.float64)
    return alibi if alibi.ndim == 1 else alibi[b]


def dense(q, k, v, *, alibi=None, **kw):
    """q (b, sq, h, d) ... -> out (b, sq, h, dv), lse (b, h, sq)."""
    outs, lses = [], []
    for b in range(q.shape[0]):
        o, l = attend(q[b], k[b], v[b], slopes=slopes_of(alibi, b), **kw)
        outs.append(o)
        lses.append(l)
    return np.stack(outs), np.stack(lses)


def paged_rows(cache, block_table, b, n):
    """The first n rows of sequence b of a paged cache (num_pages, page_size, hk, d)."""
    page_size = cache.shape[1]
    pos = np.arange(n)
    pages = np.asarray(block_table)[b, pos // page_size]
    return cache[pages, pos % page_size]


def varlen(q, k, v, cu_q, cu_k, *, block_table=None, seqused_k=None, leftpad_k=None,
           alibi=None, **kw):
    """q (total_q, h, d); k/v (total_k, hk, d) or paged. -> out (total_q, h, dv), lse (h, total_q)."""
    total_q, h, _ = q.shape
    dv = v.shape[-1]
    out = np.zeros((total_q, h, dv))
    lse = np.full((h, total_q), -np.inf)
    for b in range(len(cu_q) - 1):
        q0, q1 = int(cu_q[b]), int(cu_q[b + 1])
        n_k = int(cu_k[b + 1] - cu_k[b])
        end = int(seqused_k[b]) if seqused_k is not None else n_k
        start = int(leftpad_k[b]) if leftpad_k is not None else 0
        if block_table is not None:
            kb = paged_rows(k, block_table, b, end)
            vb = paged_rows(v, block_table, b, end)
        else:
            kb = k[int(cu_k[b]):int(cu_k[b]) + end]
            vb = v[int(cu_k[b]):int(cu_k[b]) + end]
        o, l = attend(q[q0:q1], kb[start:end], vb[start:end], slopes=slopes_of(alibi, b), **kw)
        out[q0:q1] = o
        lse[:, q0:q1] = l
    return out, lse


def rotary(x, cos, sin, positions, interleaved):
    """Rotate the first rotary_dim = 2 * cos.shape[1] features of x (s, h, d) at positions (s)."""
    x = np.array(x, np.float64)
    half = cos.shape[1]
    c = np.asarray(cos, np.float64)[positions][:, None, :]  # (s, 1, half)
    s = np.asarray(sin, np.float64)[positions][:, None, :]
    if interleaved:
        x1, x2 = x[..., 0:2 * half:2].copy(), x[..., 1:2 * half:2].copy()
        x[..., 0:2 * half:2] = x1 * c - x2 * s
        x[..., 1:2 * half:2] = x1 * s + x2 * c
    else:
        x1, x2 = x[..., :half].copy(), x[..., half:2 * half].copy()
        x[..., :half] = x1 * c - x2 * s
        x[..., half:2 * half] = x1 * s + x2 * c
    return x


def kvcache(q, k_cache, v_cache, *, k_new=None, v_new=None, cos=None, sin=None,
            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
            causal=False, window=(-1, -1), rotary_interleaved=True, alibi=None, dtype=None,
            cache_e4m3=False, q_descale=None, k_descale=None, v_descale=None, **kw):
    """flash_attn_with_kvcache in float64. Returns out, lse and the updated caches (float64).

    dtype: storage dtype; the rotated q and the appended (rotated) keys are rounded to it, as
    the implementation stores them in that dtype. FP8: q, k_cache, v_cache hold the stored values
    (e4m3 ones as float64) and attention runs on descale * stored; with cache_e4m3 the appended
    rows are stored quantized (quantize_rows, dtype = out's dtype), and the returned caches hold
    the stored values.
    """
    kc = np.asarray(k_cache).astype(np.float64)
    vc = np.asarray(v_cache).astype(np.float64)
    b_size, sq = q.shape[:2]
    hk = kc.shape[2]
    qf = descale_factors(q_descale, b_size, q.shape[2])
    kf, vf = descale_factors(k_descale, b_size, hk), descale_factors(v_descale, b_size, hk)
    paged = block_table is not None
    max_sk = kc.shape[1] if not paged else np.asarray(block_table).shape[1] * kc.shape[1]
    seqlens = (np.full(b_size, max_sk) if cache_seqlens is None
               else np.asarray(cache_seqlens).astype(np.int64))
    s_new = 0 if k_new is None else k_new.shape[1]
    rnd = (lambda x: round_to(x, dtype)) if dtype is not None else (lambda x: x)
    local = window[0] >= 0 or window[1] >= 0
    outs, lses = [], []
    for b in range(b_size):
        row = b if cache_batch_idx is None else int(cache_batch_idx[b])
        end = int(seqlens[b]) + s_new
        qb = np.asarray(q[b]).astype(np.float64) * qf[b][None, :, None]
        if cos is not None:
            pos = seqlens[b] + (np.arange(sq) if (causal or local) else np.zeros(sq, np.int64))
            qb = rnd(rotary(qb, cos, sin, pos, rotary_interleaved))
        if s_new:
            kn = np.asarray(k_new[b], np.float64)
            if cos is not None:
                kn = rotary(kn, cos, sin, seqlens[b] + np.arange(s_new), rotary_interleaved)
            kn, vn = rnd(kn), rnd(np.asarray(v_new[b]).astype(np.float64))
            if cache_e4m3:
                kn, vn = quantize_rows(kn, kf[b], dtype), quantize_rows(vn, vf[b], dtype)
            rows = seqlens[b] + np.arange(s_new)
            if paged:
                ps = kc.shape[1]
                pages = np.asarray(block_table)[b, rows // ps]
                kc[pages, rows % ps] = kn
                vc[pages, rows % ps] = vn
            else:
                kc[row, rows] = kn
                vc[row, rows] = vn
        if paged:
            kb, vb = paged_rows(kc, block_table, b, end), paged_rows(vc, block_table, b, end)
        else:
            kb, vb = kc[row, :end], vc[row, :end]
        start = 0 if cache_leftpad is None else int(cache_leftpad[b])
        kb, vb = kb * kf[b][None, :, None], vb * vf[b][None, :, None]  # dequantized (FP8)
        o, l = attend(qb, kb[start:end], vb[start:end], causal=causal, window=window,
                      slopes=slopes_of(alibi, b), **kw)
        outs.append(o)
        lses.append(l)
    return np.stack(outs), np.stack(lses), kc, vc
