"""Hugging Face transformers: flashattn as ``attn_implementation="flashattn"``.

    import flashattn.integrations.transformers   # registers "flashattn" (again: register())
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="flashattn")

What is registered:

* ``AttentionInterface["flashattn"]``: :func:`attention_forward`, which takes the model's
  (batch, heads, seq, head_dim) states and calls flashattn as transformers' flash_attention_2
  path calls flash_attn: without padding, ``flash_attn_func``; with a padding mask (left or right
  padding, or a static cache longer than the mask), the unpadded rows through
  ``flash_attn_varlen_func`` with cu_seqlens built from the mask, and the output padded back with
  zeros at the padded query positions; with ``cu_seq_lens_q/_k`` given (padding-free packed
  batches), ``flash_attn_varlen_func`` on them. Causal (bottom-right aligned), GQA/MQA,
  ``scaling``, ``softcap`` and ``sliding_window`` (the window of w keys: (w - 1, w - 1)) are
  passed on.
* ``AttentionMaskInterface["flashattn"]``: transformers' flash-attention mask (the 2D padding mask,
  or None when nothing is padded), so the model hands the padding mask to the function above.
* transformers treats every implementation whose name contains "flash" as a flash-attention
  kernel and, when a model is created, loads that kernel's functions (flash_attn_func,
  flash_attn_varlen_func, flash_attn_with_kvcache, pad/unpad helpers) through
  ``transformers.modeling_flash_attention_utils._lazy_imports``. That loader knows only the
  flash_attn packages and hub kernels, so it is extended to answer "flashattn" with flashattn's
  functions (other names go to transformers' own loader unchanged).

Not supported (refused with an error, not ignored): attention sinks (``s_aux``), dropout > 0
(training), a 4D attention mask. ``output_attentions`` gives no weights (None), as with
flash_attention_2.
"""
import torch
import transformers.modeling_flash_attention_utils as _hf_flash
from transformers import AttentionInterface, AttentionMaskInterface

from .. import interface as _fa

NAME = "flashattn"


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      sliding_window=None, softcap=None, is_causal=None, s_aux=None, **kwargs):
    """transformers' attention-function contract: query (b, h, sq, d), key/value (b, hk, sk, d),
    attention_mask None or a 2D padding mask (b, mask_len), 1/True = a real token.
    Returns (out (b, sq, h, d), None)."""
    if s_aux is not None:
        raise NotImplementedError("s_aux: attention sinks are not supported by flashattn")
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))  # (b, s, heads, d): flash layout
    q, k, v = _autocast(q, k, v)
    options = dict(dropout_p=dropout, softmax_scale=scaling,
                   causal=module.is_causal if is_causal is None else bool(is_causal),
                   window_size=_window(sliding_window), softcap=0.0 if softcap is None else softcap)
    if attention_mask is not None:
        out = _attend_padded(q, k, v, attention_mask, options)
    elif _packed(kwargs):
        out = _attend_packed(q, k, v, kwargs, options)
    else:
        out = _fa.flash_attn_func(q, k, v, **options)
    return out, None


def _window(sliding_window):
    """transformers' sliding_window w: each query sees w keys, itself included."""
    if sliding_window is None:
        return (-1, -1)
    return (int(sliding_window) - 1, int(sliding_window) - 1)


def _autocast(q, k, v):
    """float32 states under CUDA autocast run in the autocast dtype (CUDA kernels: fp16/bf16)."""
    if q.dtype == torch.float32 and q.is_cuda and torch.is_autocast_enabled("cuda"):
        dtype = torch.get_autocast_dtype("cuda")
        return q.to(dtype), k.to(dtype), v.to(dtype)
    return q, k, v


def _cu_seqlens(mask):
    """(b + 1,) int32 offsets of each sequence's rows among the unpadded rows of a (b, s) mask."""
    lengths = mask.sum(dim=-1, dtype=torch.int32)
    return torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))


def _attend_padded(q, k, v, mask, options):
    """Unpad by the 2D mask, attend over the packed rows (varlen), pad the output back."""
    if mask.dim() != 2:
        raise ValueError(f"attention_mask: flashattn takes a 2D padding mask (batch, keys), got "
                         f"shape {tuple(mask.shape)}")
    mask = mask.bool()
    b, sq, h, _ = q.shape
    mask_len = mask.shape[1]
    if k.shape[1] > mask_len:  # a static cache holds more rows than are in use: drop the rest
        k, v = k[:, :mask_len], v[:, :mask_len]
    sk = k.shape[1]
    mask_q = mask if sq == sk else mask[:, -sq:]  # the queries are the last sq positions
    cu_k = _cu_seqlens(mask)
    cu_q = cu_k if sq == sk else _cu_seqlens(mask_q)
    # The padded lengths bound every sequence's length: no device read of the mask for them.
    rows = _fa.flash_attn_varlen_func(q[mask_q], k[mask], v[mask], cu_q, cu_k, sq, sk, **options)
    out = rows.new_zeros(b, sq, h, rows.shape[-1])
    out[mask_q] = rows
    return out


_PACKED_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def _packed(kwargs):
    return all(kwargs.get(key) is not None for key in _PACKED_KEYS)


def _attend_packed(q, k, v, kwargs, options):
    """Padding-free batch: sequences concatenated along the rows, offsets given."""
    b, sq, h, _ = q.shape
    q, k, v = (x.reshape(-1, *x.shape[2:]) for x in (q, k, v))
    max_q, max_k = (int(kwargs[key]) for key in ("max_length_q", "max_length_k"))
    out = _fa.flash_attn_varlen_func(q, k, v, kwargs["cu_seq_lens_q"].int(),
                                     kwargs["cu_seq_lens_k"].int(), max_q, max_k, **options)
    return out.view(b, sq, h, out.shape[-1])


# ---- registration -------------------------------------------------------------------------------

def _flashattn_functions():
    """What transformers' flash loader returns for a flash implementation."""
    return (_fa.flash_attn_func, _fa.flash_attn_varlen_func, _fa.flash_attn_with_kvcache,
            _hf_flash._pad_input, _hf_flash._unpad_input)


def _extend_flash_loader():
    loader = getattr(_hf_flash, "_lazy_imports", None)
    if loader is None or getattr(loader, "_flashattn_extended", False):
        return

    def lazy_imports(implementation, *args, **kwargs):
        if implementation == NAME:
            return _flashattn_functions()
        return loader(implementation, *args, **kwargs)

    lazy_imports._flashattn_extended = True
    _hf_flash._lazy_imports = lazy_imports


def register():
    """Register attn_implementation="flashattn" with transformers (idempotent)."""
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, AttentionMaskInterface()["flash_attention_2"])
    _extend_flash_loader()


register()
