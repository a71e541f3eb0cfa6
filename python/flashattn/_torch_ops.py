"""The torch path of the public calls: torch custom ops (torch.library), so that torch.compile
traces flashattn as single graph nodes (no graph break, CUDA graphs with mode="reduce-overhead"),
and a direct eager path with the least host work.

Imported by flashattn.interface the first time a call gets a torch tensor, or at
``import flashattn`` when torch is already imported; ``import flashattn`` never imports torch.

Ops (namespace ``flashattn``); outputs are new tensors (out, softmax_lse), softmax_lse of shape
(0,) when not asked for:

* ``flashattn::fwd``          flash_attn_func (and its packed variants)
* ``flashattn::fwd_varlen``   flash_attn_varlen_func (and its packed variants)
* ``flashattn::fwd_kvcache``  flash_attn_with_kvcache; mutates k_cache and v_cache (the append of
  k/v) and the optional scratch workspace.

Each has a fake (meta) implementation giving the output shapes and dtypes from the input shapes,
so that tracing never runs the library (out is bf16 for an e4m3 q: _frameworks.out_dtype_name). Eager calls on plain tensors skip the dispatcher and run
the same implementation directly (the op adds host work per call and nothing else); calls being
compiled (torch.compiler.is_compiling()) or on tensor subclasses (fake, functional) go through the
op. ``out=`` is written directly in eager calls; in a compiled graph the op's output is copied
into it.
"""
from typing import Optional, Tuple

import torch

from . import _C
from ._frameworks import _contiguous_last_dim, out_dtype_name, to_extension, torch_capsule
_NO_LSE = (0,)  # shape of the softmax_lse output when it is not asked for


# ---- shared by the ops and the eager path -------------------------------------------------------

def _x(t):
    """A tensor as the extension takes it: for torch _frameworks.torch_capsule (None stays None;
    an argument of another framework in an eager call goes the generic way)."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        return to_extension(t)
    return torch_capsule(t)


def _in(t):
    """An input the call only reads, as _x gives it, copied first if its last dimension is strided
    (_frameworks._contiguous_last_dim, flash_attn's rule). A tensor the call writes (out,
    softmax_lse, a cache appended to, the workspace) goes through _x unchanged, so the library
    refuses a strided one by name instead of writing into a copy."""
    return _x(_contiguous_last_dim(t))


def _stream(q) -> int:
    return torch._C._cuda_getCurrentRawStream(q.get_device()) if q.is_cuda else 0


def _num_threads() -> int:
    from .interface import get_num_threads

    return get_num_threads()


def refuse_grad(*tensors):
    """flashattn has no backward pass: refuse inputs that would need one."""
    if torch.is_grad_enabled():
        for t in tensors:
            if getattr(t, "requires_grad", False):
                raise NotImplementedError(
                    "flashattn has no backward pass: a tensor requires grad; call it under "
                    "torch.no_grad() / torch.inference_mode(), or detach the inputs")


def _eager(q) -> bool:
    """Run the implementation directly: a plain tensor outside of torch.compile tracing."""
    return type(q) is torch.Tensor and not torch.compiler.is_compiling()


def _run_dense(q, k, v, out, lse, alibi_slopes, q_descale, k_descale, v_descale, softmax_scale,
               causal, left, right, softcap):
    _C.forward(_in(q), _in(k), _in(v), _x(out), _x(lse), _in(alibi_slopes), _in(q_descale),
               _in(k_descale), _in(v_descale), softmax_scale, causal, left, right, softcap,
               _stream(q), _num_threads())


def _run_varlen(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                seqused_k, leftpad_k, block_table, alibi_slopes, q_descale, k_descale, v_descale,
                softmax_scale, causal, left, right, softcap):
    _C.forward_varlen(_in(q), _in(k), _in(v), _x(out), _in(cu_seqlens_q), _in(cu_seqlens_k),
                      max_seqlen_q, max_seqlen_k, _in(seqused_k), _in(leftpad_k), _in(block_table),
                      _x(lse), _in(alibi_slopes), _in(q_descale), _in(k_descale), _in(v_descale),
                      softmax_scale, causal, left, right, softcap, _stream(q), _num_threads())


def _run_kvcache(q, k_cache, v_cache, out, lse, k, v, rotary_cos, rotary_sin, cache_seqlens,
                 cache_batch_idx, cache_leftpad, block_table, alibi_slopes, q_descale, k_descale,
                 v_descale, softmax_scale, causal, left, right, softcap, rotary_interleaved,
                 num_splits, workspace):
    _C.forward_kvcache(_in(q), _x(k_cache), _x(v_cache), _x(out), _in(k), _in(v), _in(rotary_cos),
                       _in(rotary_sin), _in(cache_seqlens), _in(cache_batch_idx),
                       _in(cache_leftpad), _in(block_table), _x(lse), _in(alibi_slopes),
                       _in(q_descale), _in(k_descale), _in(v_descale),
                       softmax_scale, causal, left, right, softcap, rotary_interleaved,
                       num_splits, _x(workspace), _stream(q), _num_threads())


def _graph_workspace(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                     cache_batch_idx, cache_leftpad, block_table, alibi_slopes, q_descale,
                     k_descale, v_descale, softmax_scale, causal, left, right, softcap,
                     rotary_interleaved, num_splits):
    """Scratch for a flash_attn_with_kvcache call being captured into a CUDA graph
    (mode="reduce-overhead"): from torch's allocator, i.e. the graph's memory pool, of the size
    the planner gives."""
    plan = _C.plan_kvcache(_x(q), _x(k_cache), _x(v_cache), _x(k), _x(v), _x(rotary_cos),
                           _x(rotary_sin), _x(cache_seqlens), _x(cache_batch_idx),
                           _x(cache_leftpad), _x(block_table), _x(alibi_slopes), _x(q_descale),
                           _x(k_descale), _x(v_descale), softmax_scale, causal, left, right,
                           softcap, rotary_interleaved, num_splits)
    workspace_bytes = plan[2]  # (num_splits, pack_gqa, workspace_bytes, ...)
    return torch.empty(workspace_bytes, dtype=torch.uint8, device=q.device)


def _dense_shapes(q, v):
    """(out shape, lse rows shape) of flash_attn_func and flash_attn_with_kvcache."""
    b, sq, h, _ = q.shape
    return (b, sq, h, v.shape[-1]), (b, h, sq)


def _varlen_shapes(q, v):
    total_q, h, _ = q.shape
    return (total_q, h, v.shape[-1]), (h, total_q)


def _allocate(q, v, shapes, return_lse, out=None):
    """(out, softmax_lse): out= or a new tensor like q (bf16 for an e4m3 q); lse (float32) when
    asked for, else None."""
    out_shape, lse_shape = shapes(q, v)
    if out is None:
        out = q.new_empty(out_shape, dtype=getattr(torch, out_dtype_name(q)))
    lse = q.new_empty(lse_shape, dtype=torch.float32) if return_lse else None
    return out, lse


def _op_outputs(out, lse, q):
    """An op returns tensors only: softmax_lse not asked for is an empty (0,) tensor."""
    return out, (q.new_empty(_NO_LSE, dtype=torch.float32) if lse is None else lse)


# ---- the ops ------------------------------------------------------------------------------------

@torch.library.custom_op("flashattn::fwd", mutates_args=())
def _fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alibi_slopes: Optional[torch.Tensor],
         q_descale: Optional[torch.Tensor], k_descale: Optional[torch.Tensor],
         v_descale: Optional[torch.Tensor], softmax_scale: Optional[float], causal: bool,
         window_left: int, window_right: int, softcap: float,
         return_lse: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    out, lse = _allocate(q, v, _dense_shapes, return_lse)
    _run_dense(q, k, v, out, lse, alibi_slopes, q_descale, k_descale, v_descale, softmax_scale,
               causal, window_left, window_right, softcap)
    return _op_outputs(out, lse, q)


@_fwd.register_fake
def _fwd_fake(q, k, v, alibi_slopes, q_descale, k_descale, v_descale, softmax_scale, causal,
              window_left, window_right, softcap, return_lse):
    return _op_outputs(*_allocate(q, v, _dense_shapes, return_lse), q)


@torch.library.custom_op("flashattn::fwd_varlen", mutates_args=())
def _fwd_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                seqused_k: Optional[torch.Tensor], leftpad_k: Optional[torch.Tensor],
                block_table: Optional[torch.Tensor], alibi_slopes: Optional[torch.Tensor],
                q_descale: Optional[torch.Tensor], k_descale: Optional[torch.Tensor],
                v_descale: Optional[torch.Tensor], softmax_scale: Optional[float], causal: bool,
                window_left: int, window_right: int, softcap: float,
                return_lse: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    out, lse = _allocate(q, v, _varlen_shapes, return_lse)
    _run_varlen(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                seqused_k, leftpad_k, block_table, alibi_slopes, q_descale, k_descale, v_descale,
                softmax_scale, causal, window_left, window_right, softcap)
    return _op_outputs(out, lse, q)


@_fwd_varlen.register_fake
def _fwd_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
                     leftpad_k, block_table, alibi_slopes, q_descale, k_descale, v_descale,
                     softmax_scale, causal, window_left, window_right, softcap, return_lse):
    return _op_outputs(*_allocate(q, v, _varlen_shapes, return_lse), q)


@torch.library.custom_op("flashattn::fwd_kvcache",
                         mutates_args=("k_cache", "v_cache", "workspace"))
def _fwd_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 k: Optional[torch.Tensor], v: Optional[torch.Tensor],
                 rotary_cos: Optional[torch.Tensor], rotary_sin: Optional[torch.Tensor],
                 cache_seqlens: Optional[torch.Tensor], cache_batch_idx: Optional[torch.Tensor],
                 cache_leftpad: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
                 alibi_slopes: Optional[torch.Tensor], q_descale: Optional[torch.Tensor],
                 k_descale: Optional[torch.Tensor], v_descale: Optional[torch.Tensor],
                 softmax_scale: Optional[float], causal: bool, window_left: int,
                 window_right: int, softcap: float, rotary_interleaved: bool, num_splits: int,
                 return_lse: bool,
                 workspace: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    out, lse = _allocate(q, v_cache, _dense_shapes, return_lse)
    if workspace is None and q.is_cuda and torch.cuda.is_current_stream_capturing():
        workspace = _graph_workspace(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                     cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                     alibi_slopes, q_descale, k_descale, v_descale,
                                     softmax_scale, causal, window_left, window_right, softcap,
                                     rotary_interleaved, num_splits)
    _run_kvcache(q, k_cache, v_cache, out, lse, k, v, rotary_cos, rotary_sin, cache_seqlens,
                 cache_batch_idx, cache_leftpad, block_table, alibi_slopes, q_descale, k_descale,
                 v_descale, softmax_scale, causal, window_left, window_right, softcap,
                 rotary_interleaved, num_splits, workspace)
    return _op_outputs(out, lse, q)


@_fwd_kvcache.register_fake
def _fwd_kvcache_fake(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                      cache_batch_idx, cache_leftpad, block_table, alibi_slopes, q_descale,
                      k_descale, v_descale, softmax_scale, causal, window_left, window_right,
                      softcap, rotary_interleaved, num_splits, return_lse, workspace):
    return _op_outputs(*_allocate(q, v_cache, _dense_shapes, return_lse), q)


# ---- what flashattn.interface calls for torch tensors -----------------------------------------
# Arguments are already normalised (window split into left/right, floats and bools); each returns
# (out, softmax_lse or None).

def _into(out, result):
    """The op's output, or out= filled with it."""
    if out is None:
        return result
    out.copy_(result)
    return out


def dense(q, k, v, out, alibi_slopes, q_descale, k_descale, v_descale, softmax_scale, causal,
          left, right, softcap, return_lse):
    refuse_grad(q, k, v, alibi_slopes)
    if _eager(q):
        out, lse = _allocate(q, v, _dense_shapes, return_lse, out)
        _run_dense(q, k, v, out, lse, alibi_slopes, q_descale, k_descale, v_descale,
                   softmax_scale, causal, left, right, softcap)
        return out, lse
    result, lse = _fwd(q, k, v, alibi_slopes, q_descale, k_descale, v_descale, softmax_scale,
                       causal, left, right, softcap, return_lse)
    return _into(out, result), (lse if return_lse else None)


def varlen(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
           leftpad_k, block_table, alibi_slopes, q_descale, k_descale, v_descale, softmax_scale,
           causal, left, right, softcap, return_lse):
    refuse_grad(q, k, v, alibi_slopes)
    if _eager(q):
        out, lse = _allocate(q, v, _varlen_shapes, return_lse, out)
        _run_varlen(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    seqused_k, leftpad_k, block_table, alibi_slopes, q_descale, k_descale,
                    v_descale, softmax_scale, causal, left, right, softcap)
        return out, lse
    result, lse = _fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              seqused_k, leftpad_k, block_table, alibi_slopes, q_descale,
                              k_descale, v_descale, softmax_scale, causal, left, right, softcap,
                              return_lse)
    return _into(out, result), (lse if return_lse else None)


def kvcache(q, k_cache, v_cache, out, k, v, rotary_cos, rotary_sin, cache_seqlens,
            cache_batch_idx, cache_leftpad, block_table, alibi_slopes, q_descale, k_descale,
            v_descale, softmax_scale, causal, left, right, softcap, rotary_interleaved,
            num_splits, return_lse, workspace):
    refuse_grad(q, k_cache, v_cache, k, v, alibi_slopes)
    if isinstance(cache_seqlens, int):  # flash_attn accepts an int: every sequence holds it
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32,
                                   device=q.device)
    if _eager(q):
        out, lse = _allocate(q, v_cache, _dense_shapes, return_lse, out)
        _run_kvcache(q, k_cache, v_cache, out, lse, k, v, rotary_cos, rotary_sin, cache_seqlens,
                     cache_batch_idx, cache_leftpad, block_table, alibi_slopes, q_descale,
                     k_descale, v_descale, softmax_scale, causal, left, right, softcap,
                     rotary_interleaved, num_splits, workspace)
        return out, lse
    result, lse = _fwd_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                               cache_batch_idx, cache_leftpad, block_table, alibi_slopes,
                               q_descale, k_descale, v_descale, softmax_scale, causal, left,
                               right, softcap, rotary_interleaved, num_splits, return_lse,
                               workspace)
    return _into(out, result), (lse if return_lse else None)
