"""flash_attn (v2.8) compatible calls over the flashattn C++ library.

Same function names, argument names, defaults and return conventions as ``flash_attn``'s
``flash_attn_interface``, for the forward (inference) path, on any DLPack tensor. Differences:

* ``dropout_p > 0`` raises NotImplementedError (no dropout; inference only).
* ``return_attn_probs=True`` returns ``(out, softmax_lse, None)``: the probabilities are never
  materialised (flash_attn returns an empty tensor there when dropout_p == 0).
* ``deterministic`` is accepted and has no effect (it concerns the backward pass; the forward
  pass is deterministic).
* Keyword-only extras: ``out=`` (write into a caller's tensor, returned as is), and for
  ``flash_attn_with_kvcache`` ``workspace=`` (scratch from :func:`allocate_workspace`, so that a
  call, e.g. one captured in a CUDA graph, allocates nothing); ``flash_attn_varlen_func`` also
  takes ``seqused_k=`` and ``leftpad_k=``.
* A row that sees no key has output 0 and LSE -inf (flash_attn writes +inf).
* FP8 (e4m3), as FlashAttention-3 has it: ``flash_attn_func``, ``flash_attn_varlen_func`` and
  ``flash_attn_with_kvcache`` take float8_e4m3fn tensors (torch.float8_e4m3fn, NumPy
  ml_dtypes.float8_e4m3fn) and the keyword-only ``q_descale``, ``k_descale``, ``v_descale``:
  fp32 tensors, a scalar (shape () or (1)) or one factor per (batch, KV head), shape
  (batch, num_heads_k); the real value of a stored element x is descale * x (None: 1). Prefill:
  q, k and v all e4m3, out bf16. KV cache: an e4m3 k_cache/v_cache under a bf16/fp16 q (out has
  q's dtype) or an e4m3 q (out bf16); k/v to append have out's dtype and are quantized into the
  cache with k_descale/v_descale (e4m3(x / descale), to nearest even, saturated at +-448).
  softmax_lse stays float32.

torch tensors go through flashattn._torch_ops (torch custom ops, for torch.compile and CUDA
graphs); other frameworks through flashattn._frameworks.

Errors of the C++ library keep their message: ValueError (invalid argument), TypeError (dtype
or tensor type), NotImplementedError (valid but not supported by this build), RuntimeError
(backend failure).
"""
from __future__ import annotations

import operator
from collections import namedtuple

from . import _C
from ._frameworks import (WORKSPACE_ALIGNMENT, Context, _contiguous_last_dim, framework_of,
                          out_dtype_name, to_extension)

__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
    "plan_kvcache",
    "allocate_workspace",
    "KVCachePlan",
    "set_num_threads",
    "get_num_threads",
    "check_device_status",
]

KVCachePlan = namedtuple("KVCachePlan", ["num_splits", "pack_gqa", "workspace_bytes", "kernel"])
KVCachePlan.__doc__ = "What a flash_attn_with_kvcache call will do (see plan_kvcache)."

_num_threads = 0


def set_num_threads(n: int) -> None:
    """Threads of the CPU backend (0 = all hardware threads, the default)."""
    global _num_threads
    _num_threads = _int(n, "num_threads", 0, _INT32_MAX, "0 = all hardware threads")


def get_num_threads() -> int:
    return _num_threads


def check_device_status(stream=None) -> None:
    """Raises ValueError for the first out-of-range index value the CUDA kernels met.

    Lengths and indices in GPU memory (cu_seqlens, seqused_k, cache_seqlens, cache_leftpad,
    cache_batch_idx, block_table) are checked by the kernels, not the host: a bad one is never
    used to address memory, its sequence gets output 0 and LSE -inf (a bad block_table entry
    reads its page as zeros), and the first such value is recorded on the device. This waits for
    ``stream`` (an int cudaStream_t handle, or a torch/CuPy stream object; None: every stream of
    the current device), reads and clears that record, and raises ValueError naming the
    argument, the sequence and the value. Without CUDA it returns. ``FLASHATTN_KERNEL=
    automatic,checked=on`` makes every call check this itself (synchronising).
    """
    if stream is None:
        handle = 0
    elif isinstance(stream, int):
        handle = stream
    else:  # torch.cuda.Stream (cuda_stream) or cupy.cuda.Stream (ptr)
        handle = int(getattr(stream, "cuda_stream", getattr(stream, "ptr", 0)))
    _C.check_device_status(handle)


# ---- argument checks done here (the rest is validated by the C++ library) ----------------------

# The C++ library takes sizes, lengths and options as int32.
_INT32_MAX = 2**31 - 1


def _int(value, name, lo, hi, meaning=None):
    """value as a Python int in [lo, hi]; TypeError / ValueError naming the argument otherwise
    (rather than the extension's signature listing or NumPy's OverflowError)."""
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__} "
                        f"({value!r})") from None
    if not lo <= n <= hi:
        note = f" ({meaning})" if meaning else ""
        bounds = f">= {lo}" if hi == float("inf") else f"in [{lo}, {hi}]"
        raise ValueError(f"{name}: must be {bounds}{note} (got {n})")
    return n


def _float(value, name):
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__} "
                        f"({value!r})") from None


def _check_dropout(dropout_p):
    if dropout_p is None or _float(dropout_p, "dropout_p") != 0.0:
        raise NotImplementedError(
            f"dropout_p: must be 0.0, got {dropout_p}; flashattn implements the inference "
            "forward pass (no dropout)")


def _window(window_size):
    """(left, right), each >= -1 (-1 = unbounded). A side beyond int32 reaches past any key, so
    it is passed as the int32 maximum, which the library treats as unbounded too."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(
            f"window_size: must be a pair (left, right), -1 = unbounded; got {window_size!r}"
        ) from None
    sides = (_int(left, "window_size[0]", -1, float("inf"), "-1 = unbounded"),
             _int(right, "window_size[1]", -1, float("inf"), "-1 = unbounded"))
    return tuple(min(side, _INT32_MAX) for side in sides)


def _flag(value, name):
    try:
        return bool(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}") from None


def _scale(softmax_scale):
    return None if softmax_scale is None else _float(softmax_scale, "softmax_scale")


def _splits(num_splits):
    return _int(num_splits, "num_splits", 0, _C.MAX_SPLITS, "0 = heuristic")


def _shape(x, name, ndims):
    shape = getattr(x, "shape", None)
    if shape is None:
        raise TypeError(f"{name}: expected a tensor, got {type(x).__name__} ({x!r})")
    shape = tuple(shape)  # no int(): a torch.compile trace keeps symbolic sizes symbolic
    if len(shape) not in ndims:
        want = " or ".join(str(n) for n in ndims)
        raise ValueError(f"{name}: must have {want} dimensions, got shape {shape}")
    return shape


def _check_out(out):
    if out is not None and framework_of(out) == "jax":
        raise TypeError("out: JAX arrays are immutable; pass a NumPy/torch/CuPy tensor or None")


def _output(ctx, out, shape):
    """out=, or a new out of q's framework (bf16 for an e4m3 q, else q's dtype)."""
    _check_out(out)
    return out if out is not None else ctx.empty(shape, out_dtype_name(ctx.like))


def _x(x):
    """An input argument for the extension (copied first if its last dim is not contiguous)."""
    return to_extension(_contiguous_last_dim(x))


def _w(x):
    """An argument the call writes (or only reads the shape of): passed as it is."""
    return to_extension(x)


# ---- torch tensors go through flashattn._torch_ops (torch custom ops for torch.compile) ---------

_torch_ops_module = None


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _torch_ops():
    """flashattn._torch_ops, imported on first use (importing flashattn never imports torch)."""
    global _torch_ops_module
    if _torch_ops_module is None:
        from . import _torch_ops

        _torch_ops_module = _torch_ops
    return _torch_ops_module


# ---- dense --------------------------------------------------------------------------------------

def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, out=None, q_descale=None, k_descale=None,
                    v_descale=None):
    """Attention over q (b, sq, h, d), k/v (b, sk, hk, d); returns out (b, sq, h, d).

    With return_attn_probs=True returns (out, softmax_lse (b, h, sq) float32, None).
    q, k, v in float8_e4m3fn: out is bf16; q_descale, k_descale, v_descale (fp32, scalar or
    (b, hk)) give their scales (module docstring).
    """
    _check_dropout(dropout_p)
    left, right = _window(window_size)
    b, sq, h, _ = _shape(q, "q", (4,))
    _shape(k, "k", (4,))
    dv = _shape(v, "v", (4,))[-1]
    scale, softcap, causal = _scale(softmax_scale), _float(softcap, "softcap"), _flag(causal, "causal")
    if _is_torch(q):
        out, lse = _torch_ops().dense(q, k, v, out, alibi_slopes, q_descale, k_descale,
                                      v_descale, scale, causal, left, right, softcap,
                                      bool(return_attn_probs))
        return (out, lse, None) if return_attn_probs else out
    ctx = Context(q)
    out = _output(ctx, out, (b, sq, h, dv))
    lse = ctx.empty((b, h, sq), "float32") if return_attn_probs else None
    _C.forward(_x(q), _x(k), _x(v), _w(out), _w(lse), _x(alibi_slopes), _x(q_descale),
               _x(k_descale), _x(v_descale), scale, causal, left, right, softcap, ctx.stream(),
               _num_threads)
    if return_attn_probs:
        return ctx.result(out), ctx.result(lse), None
    return ctx.result(out)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, *, out=None,
                              q_descale=None, k_descale=None, v_descale=None):
    """qkv (b, s, 3, h, d): flash_attn_func on its three slices (views, no copy); FP8 as there."""
    shape = _shape(qkv, "qkv", (5,))
    if shape[2] != 3:
        raise ValueError(f"qkv: dimension 2 must be 3 (q, k, v), got shape {shape}")
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale,
                           causal, window_size, softcap, alibi_slopes, deterministic,
                           return_attn_probs, out=out, q_descale=q_descale, k_descale=k_descale,
                           v_descale=v_descale)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, *, out=None,
                             q_descale=None, k_descale=None, v_descale=None):
    """kv (b, sk, 2, hk, d): flash_attn_func(q, kv[:, :, 0], kv[:, :, 1]); FP8 as there."""
    shape = _shape(kv, "kv", (5,))
    if shape[2] != 2:
        raise ValueError(f"kv: dimension 2 must be 2 (k, v), got shape {shape}")
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal,
                           window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                           out=out, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)


# ---- variable length ----------------------------------------------------------------------------

def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *,
                           seqused_k=None, leftpad_k=None, out=None, q_descale=None,
                           k_descale=None, v_descale=None):
    """Packed sequences: q (total_q, h, d), k/v (total_k, hk, d) by cu_seqlens_q/_k (b + 1,
    int32), or with block_table (b, max_pages) a paged k/v (num_pages, page_size, hk, d).

    Returns out (total_q, h, d); with return_attn_probs=True (out, softmax_lse (h, total_q), None).
    FP8 as flash_attn_func (descales (b, hk): one row per sequence).
    """
    _check_dropout(dropout_p)
    left, right = _window(window_size)
    total_q, h, _ = _shape(q, "q", (3,))
    _shape(k, "k", (3, 4))
    dv = _shape(v, "v", (3, 4))[-1]
    _shape(cu_seqlens_q, "cu_seqlens_q", (1,))
    _shape(cu_seqlens_k, "cu_seqlens_k", (1,))
    max_seqlen_q = _int(max_seqlen_q, "max_seqlen_q", 0, _INT32_MAX)
    max_seqlen_k = _int(max_seqlen_k, "max_seqlen_k", 0, _INT32_MAX)
    scale, softcap, causal = _scale(softmax_scale), _float(softcap, "softcap"), _flag(causal, "causal")
    if _is_torch(q):
        out, lse = _torch_ops().varlen(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                       max_seqlen_k, seqused_k, leftpad_k, block_table,
                                       alibi_slopes, q_descale, k_descale, v_descale, scale,
                                       causal, left, right, softcap, bool(return_attn_probs))
        return (out, lse, None) if return_attn_probs else out
    ctx = Context(q)
    out = _output(ctx, out, (total_q, h, dv))
    lse = ctx.empty((h, total_q), "float32") if return_attn_probs else None
    _C.forward_varlen(_x(q), _x(k), _x(v), _w(out), _x(cu_seqlens_q), _x(cu_seqlens_k),
                      max_seqlen_q, max_seqlen_k, _x(seqused_k), _x(leftpad_k),
                      _x(block_table), _w(lse), _x(alibi_slopes), _x(q_descale),
                      _x(k_descale), _x(v_descale), scale, causal, left, right, softcap,
                      ctx.stream(), _num_threads)
    if return_attn_probs:
        return ctx.result(out), ctx.result(lse), None
    return ctx.result(out)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, out=None, q_descale=None,
                                     k_descale=None, v_descale=None):
    """qkv (total, 3, h, d) with one cu_seqlens for queries and keys; FP8 as flash_attn_func."""
    shape = _shape(qkv, "qkv", (4,))
    if shape[1] != 3:
        raise ValueError(f"qkv: dimension 1 must be 3 (q, k, v), got shape {shape}")
    return flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens,
                                  max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
                                  window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, out=out, q_descale=q_descale,
                                  k_descale=k_descale, v_descale=v_descale)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False, *, out=None, q_descale=None,
                                    k_descale=None, v_descale=None):
    """kv (total_k, 2, hk, d); FP8 as flash_attn_func."""
    shape = _shape(kv, "kv", (4,))
    if shape[1] != 2:
        raise ValueError(f"kv: dimension 1 must be 2 (k, v), got shape {shape}")
    return flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k,
                                  max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                                  window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, out=out, q_descale=q_descale,
                                  k_descale=k_descale, v_descale=v_descale)


# ---- KV cache -----------------------------------------------------------------------------------

def _check_cache_seqlens(cache_seqlens):
    """flash_attn accepts an int (every sequence holds that many keys) or an int32 tensor."""
    if cache_seqlens is None or hasattr(cache_seqlens, "shape"):
        return
    if isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, int):
        raise TypeError("cache_seqlens: expected an int or an int32 tensor (b), got "
                        f"{type(cache_seqlens).__name__}")
    _int(cache_seqlens, "cache_seqlens", 0, _INT32_MAX)


def _cache_seqlens(ctx, cache_seqlens, batch):
    """An int cache_seqlens as a tensor (b) of q's framework."""
    _check_cache_seqlens(cache_seqlens)
    if cache_seqlens is None or hasattr(cache_seqlens, "shape"):
        return cache_seqlens
    return ctx.full((batch,), cache_seqlens, "int32")


def plan_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                 cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                 softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                 rotary_interleaved=True, alibi_slopes=None, num_splits=0, *, q_descale=None,
                 k_descale=None, v_descale=None):
    """What flash_attn_with_kvcache will do with these arguments (a host-side function of the
    shapes and options; it reads no tensor data): KVCachePlan(num_splits, pack_gqa,
    workspace_bytes, kernel), kernel being the name of the kernel that will run the call
    ("cpu", "splitkeys", "dims", ...; docs/ARCHITECTURE.md). Allocate the workspace once with allocate_workspace(plan, like=q) and pass
    it as workspace= so that the call allocates nothing (needed in CUDA graph capture)."""
    left, right = _window(window_size)
    b = _shape(q, "q", (4,))[0]
    _shape(k_cache, "k_cache", (4,))
    _shape(v_cache, "v_cache", (4,))
    scale, softcap, num_splits = _scale(softmax_scale), _float(softcap, "softcap"), _splits(num_splits)
    ctx = Context(q)
    cache_seqlens = _cache_seqlens(ctx, cache_seqlens, b)
    num_splits, pack_gqa, workspace_bytes, kernel = _C.plan_kvcache(
        _x(q), _w(k_cache), _w(v_cache), _x(k), _x(v), _x(rotary_cos), _x(rotary_sin),
        _x(cache_seqlens), _x(cache_batch_idx), _x(cache_leftpad), _x(block_table),
        _x(alibi_slopes), _x(q_descale), _x(k_descale), _x(v_descale), scale,
        _flag(causal, "causal"), left, right, softcap,
        _flag(rotary_interleaved, "rotary_interleaved"), num_splits)
    return KVCachePlan(num_splits, pack_gqa, workspace_bytes, kernel)


def allocate_workspace(plan, like):
    """A 256-byte aligned uint8 buffer of plan.workspace_bytes (or an int) on like's device,
    allocated by like's framework (for JAX: the helper framework, since JAX arrays are
    immutable)."""
    nbytes = _int(plan.workspace_bytes if isinstance(plan, KVCachePlan) else plan, "plan",
                  0, 2**62, "workspace bytes")
    ctx = Context(like)
    raw = ctx.empty((nbytes + WORKSPACE_ALIGNMENT,), "uint8")
    offset = -_C.data_ptr(raw) % WORKSPACE_ALIGNMENT
    return raw[offset:offset + nbytes]


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, *, out=None, workspace=None,
                            q_descale=None, k_descale=None, v_descale=None):
    """Decode/prefill against a KV cache (b_cache, max_sk, hk, d), or paged with block_table
    (num_pages, page_size, hk, d; any page size). k/v (b, s_new, hk, d), when given, are written
    into the cache at rows cache_seqlens[b]... (in place) before attending; rotary_cos/sin
    (max_position, rotary_dim / 2) rotate q and the new keys.

    Returns out (b, sq, h, d); with return_softmax_lse=True (out, softmax_lse (b, h, sq)).
    workspace=: scratch of plan_kvcache(...).workspace_bytes from allocate_workspace; without it
    the backend uses a scratch buffer it keeps per CUDA stream (and allocates one per call while
    the stream is being captured into a CUDA graph: pass workspace= there).
    FP8: an e4m3 k_cache/v_cache under a bf16/fp16 q (out q's dtype) or an e4m3 q (out bf16),
    with q_descale, k_descale, v_descale (fp32, scalar or (b, hk)); appended k/v have out's
    dtype and are quantized into the cache (module docstring).
    """
    left, right = _window(window_size)
    b, sq, h, _ = _shape(q, "q", (4,))
    _shape(k_cache, "k_cache", (4,))
    dv = _shape(v_cache, "v_cache", (4,))[-1]
    scale, softcap, num_splits = _scale(softmax_scale), _float(softcap, "softcap"), _splits(num_splits)
    causal, rotary_interleaved = _flag(causal, "causal"), _flag(rotary_interleaved, "rotary_interleaved")
    if _is_torch(q):
        _check_cache_seqlens(cache_seqlens)
        out, lse = _torch_ops().kvcache(q, k_cache, v_cache, out, k, v, rotary_cos, rotary_sin,
                                        cache_seqlens, cache_batch_idx, cache_leftpad,
                                        block_table, alibi_slopes, q_descale, k_descale,
                                        v_descale, scale, causal, left, right, softcap,
                                        rotary_interleaved, num_splits,
                                        bool(return_softmax_lse), workspace)
        return (out, lse) if return_softmax_lse else out
    ctx = Context(q)
    cache_seqlens = _cache_seqlens(ctx, cache_seqlens, b)
    out = _output(ctx, out, (b, sq, h, dv))
    lse = ctx.empty((b, h, sq), "float32") if return_softmax_lse else None
    _C.forward_kvcache(_x(q), _w(k_cache), _w(v_cache), _w(out), _x(k), _x(v),
                       _x(rotary_cos), _x(rotary_sin), _x(cache_seqlens),
                       _x(cache_batch_idx), _x(cache_leftpad), _x(block_table), _w(lse),
                       _x(alibi_slopes), _x(q_descale), _x(k_descale), _x(v_descale), scale,
                       causal, left, right, softcap,
                       rotary_interleaved, num_splits,
                       _w(workspace), ctx.stream(), _num_threads)
    if return_softmax_lse:
        return ctx.result(out), ctx.result(lse)
    return ctx.result(out)
