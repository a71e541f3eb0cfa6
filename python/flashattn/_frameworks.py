"""Framework adapters: allocate outputs in the caller's framework, find its stream and device.

A call is described by its first tensor (``q``). Outputs are created by the same framework as
``q`` (``numpy.empty``, ``torch.empty``, ``cupy.empty``) on the same device, and the CUDA work
is queued on that framework's current stream (torch: ``torch.cuda.current_stream()``; CuPy:
``cupy.cuda.get_current_stream()``), so the call composes with the caller's stream ordering and
can be captured in a CUDA graph.

JAX arrays are immutable, so flashattn cannot write into a JAX buffer. For a JAX ``q`` the
outputs are allocated by a helper framework (torch if importable, else CuPy, on the GPU; NumPy
on the CPU), written there, and handed back to JAX with ``jax.dlpack.from_dlpack`` (zero copy
where JAX accepts the buffer). JAX inputs are waited for (``block_until_ready``) first, since
JAX gives no stream to order against.
"""
from __future__ import annotations

from . import _C

DL_CPU = 1
DL_CUDA = 2
# 256 bytes: the alignment forward_kvcache asks of a caller's workspace.
WORKSPACE_ALIGNMENT = 256

_FRAMEWORK_OF_MODULE = {"numpy": "numpy", "torch": "torch", "cupy": "cupy", "jax": "jax",
                        "jaxlib": "jax"}

# Dtypes a framework's DLPack export may refuse (NumPy's ml_dtypes bfloat16 and float8_e4m3fn,
# torch's float8_e4m3fn before DLPack 1.0 float8 codes), passed as their bits (an integer view)
# with a tag the extension reads back: {dtype name: (tag, integer view dtype name)}.
E4M3 = "float8_e4m3fn"
_BITS = {"bfloat16": (_C.BF16_BITS_TAG, "uint16"), E4M3: (_C.E4M3_BITS_TAG, "uint8")}
# The dtype of out for q's dtype: q's, except bf16 for an e4m3 q (prefill with q, k, v e4m3, and
# a KV cache call with an e4m3 q; the library's rule, include/flashattn/flashattn.h).
_OUT_DTYPE = {E4M3: "bfloat16"}


def out_dtype_name(q) -> str:
    """Name of the dtype of out for q ('bfloat16' for an e4m3 q, else q's own)."""
    name = _dtype_name(q)
    return _OUT_DTYPE.get(name, name)


def framework_of(x) -> str:
    root = type(x).__module__.split(".")[0]
    return _FRAMEWORK_OF_MODULE.get(root, "other")


def dlpack_device(x):
    """(device_type, device_id) per DLPack: 1 = CPU, 2 = CUDA."""
    get = getattr(x, "__dlpack_device__", None)
    if get is None:
        return (DL_CPU, 0)
    device_type, device_id = get()
    return (int(device_type), int(device_id))


def torch_capsule(t):
    """A torch tensor as the extension takes it: a DLPack capsule (torch.utils.dlpack.to_dlpack:
    no Python-level __dlpack__ protocol work, measured ~3 us per tensor on the H200 machine); a
    float8_e4m3fn tensor as its uint8 bits, tagged (torch's DLPack export of float8 depends on
    its version; the bits go through any)."""
    import torch
    import torch.utils.dlpack

    if t.requires_grad:  # DLPack refuses tensors that require grad; grad use is refused earlier
        t = t.detach()
    if t.dtype == torch.float8_e4m3fn:
        tag, bits = _BITS[E4M3]
        return (tag, torch.utils.dlpack.to_dlpack(t.view(getattr(torch, bits))))
    return torch.utils.dlpack.to_dlpack(t)


def to_extension(x):
    """What the extension receives for an argument: None; for a torch tensor torch_capsule(x);
    the array itself otherwise, or for a NumPy array of an ml_dtypes dtype that DLPack cannot
    export (bfloat16, float8_e4m3fn) its bits as an integer view, tagged."""
    if x is None:
        return None
    framework = framework_of(x)
    if framework == "torch":
        if x.requires_grad:
            import torch

            if torch.is_grad_enabled():
                raise NotImplementedError(
                    "flashattn has no backward pass: a tensor requires grad; call it under "
                    "torch.no_grad() / torch.inference_mode(), or detach the inputs")
        return torch_capsule(x)
    if framework == "numpy":
        bits = _BITS.get(getattr(x.dtype, "name", ""))
        if bits is not None:
            tag, view = bits
            return (tag, x.view(view))
    if framework == "jax":
        x.block_until_ready()
    return x


def _contiguous_last_dim(x):
    """An input whose last dimension is not contiguous, copied into one that is (flash_attn makes
    such inputs contiguous the same way); any other input unchanged. NumPy, torch and CuPy; other
    types go to the library as they are, which names the fix if it must refuse them. Only for
    inputs: a tensor the call writes (out, softmax_lse, a cache that is appended to) is never
    copied, so the library refuses it with that message instead."""
    if x is None:
        return x
    kind = type(x)
    copy_if_strided = _COPY_IF_STRIDED.get(kind)
    if copy_if_strided is None:
        copy_if_strided = _COPY_IF_STRIDED.setdefault(kind, _copier_for(x))
    return copy_if_strided(x)


def _copier_for(x):
    """The last-dim check and copy for x's type (looked up once per type: a call checks each
    input in well under a microsecond)."""
    framework = framework_of(x)
    if framework == "torch":
        def torch_copy(t):
            if t.is_contiguous() or t.dim() == 0 or t.shape[-1] <= 1 or t.stride(-1) == 1:
                return t
            return t.contiguous()
        return torch_copy
    if framework in ("numpy", "cupy"):
        if framework == "numpy":
            import numpy as module
        else:
            import cupy as module

        def array_copy(a):
            if a.flags.c_contiguous or a.ndim == 0 or a.shape[-1] <= 1 or a.strides[-1] == a.itemsize:
                return a
            return module.ascontiguousarray(a)
        return array_copy
    return lambda other: other


_COPY_IF_STRIDED = {}


class Context:
    """Framework, device and stream of one call, taken from its first tensor."""

    def __init__(self, like):
        self.like = like
        self.framework = framework_of(like)
        self.device_type, self.device_id = dlpack_device(like)
        self.on_cuda = self.device_type == DL_CUDA
        # The framework that allocates: the caller's own, or a helper for JAX / unknown types.
        self.allocator = self._pick_allocator()

    def _pick_allocator(self) -> str:
        if self.framework in ("numpy", "torch", "cupy"):
            return self.framework
        if not self.on_cuda:
            return "numpy"
        for helper in ("torch", "cupy"):
            try:
                __import__(helper)
                return helper
            except ImportError:
                continue
        raise TypeError(
            f"q: {type(self.like).__module__}.{type(self.like).__name__} on CUDA needs torch or "
            "cupy to allocate outputs (JAX arrays are immutable); install one of them or pass "
            "out= as a torch/cupy tensor")

    # ---- allocation ------------------------------------------------------------------------
    def _dtype(self, dtype):
        """dtype None: q's dtype; else a name ('float32', 'int32', 'uint8', 'bfloat16')."""
        if dtype is None and self.framework == self.allocator:
            return self.like.dtype
        name = dtype if dtype is not None else _dtype_name(self.like)
        if self.allocator == "torch":
            import torch

            return getattr(torch, name)
        if self.allocator == "cupy":
            import cupy

            if name in _BITS:
                raise TypeError(f"q: {name} outputs cannot be allocated with CuPy (no {name} "
                                "dtype); install torch or pass out=")
            return cupy.dtype(name)
        import numpy as np

        if name in _BITS:  # NumPy has these through ml_dtypes only
            import ml_dtypes

            return np.dtype(getattr(ml_dtypes, name))
        return np.dtype(name)

    def empty(self, shape, dtype=None):
        shape = tuple(int(s) for s in shape)
        dt = self._dtype(dtype)
        if self.allocator == "torch":
            import torch

            device = (torch.device("cuda", self.device_id) if self.on_cuda
                      else torch.device("cpu"))
            return torch.empty(shape, dtype=dt, device=device)
        if self.allocator == "cupy":
            import cupy

            with cupy.cuda.Device(self.device_id):
                return cupy.empty(shape, dtype=dt)
        import numpy as np

        return np.empty(shape, dtype=dt)

    def full(self, shape, value, dtype):
        """An input array in the caller's framework (used for an int cache_seqlens)."""
        if self.framework == "jax":
            import jax.numpy as jnp

            return jnp.full(shape, value, dtype=dtype)
        buf = self.empty(shape, dtype)
        buf[...] = value
        return buf

    def result(self, buf):
        """An output buffer as the caller's framework sees it."""
        if buf is None or self.framework != "jax":
            return buf
        import jax.dlpack

        try:
            return jax.dlpack.from_dlpack(buf)
        except Exception:  # older JAX wants a capsule, or refuses the alignment: copy
            import jax.numpy as jnp

            if self.allocator == "numpy":
                return jnp.asarray(buf)
            raise

    # ---- stream and device ------------------------------------------------------------------
    def stream(self) -> int:
        if not self.on_cuda:
            return 0
        if self.allocator == "torch":
            import torch

            # The raw handle without building a torch.cuda.Stream (~4.6 us per call measured);
            # the public call where this private one is missing.
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
            if raw is not None:
                return int(raw(self.device_id))
            return int(torch.cuda.current_stream(self.device_id).cuda_stream)
        if self.allocator == "cupy":
            import cupy

            with cupy.cuda.Device(self.device_id):
                return int(cupy.cuda.get_current_stream().ptr)
        return 0


def _dtype_name(x) -> str:
    """'float16' / 'bfloat16' / 'float32' / 'int32' / ... of any array-like."""
    dtype = x.dtype
    name = getattr(dtype, "name", None) or str(dtype)
    return name.replace("torch.", "")
