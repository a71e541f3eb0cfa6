"""flashattn: exact attention the FlashAttention-2 way (forward/inference), C++/CUDA.

The calls mirror flash_attn v2.8 (``flash_attn_func``, ``flash_attn_varlen_func``,
``flash_attn_with_kvcache``, ...) and take any DLPack tensor: NumPy (CPU backend), PyTorch
(CPU and CUDA), CuPy and JAX (CUDA). See ``flashattn.interface`` for the differences from
flash_attn and ``flashattn._frameworks`` for how outputs, streams and JAX are handled.
"""
import sys

from . import _C, interface
from .interface import (
    KVCachePlan,
    allocate_workspace,
    check_device_status,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
    get_num_threads,
    plan_kvcache,
    set_num_threads,
)

__version__ = "0.1.0"


def cuda_available() -> bool:
    """True when this build has the CUDA backend and a CUDA device is visible."""
    return bool(_C.cuda_available())


def build_info() -> str:
    """Version, backends, compiled head dims and dtypes of the C++ library."""
    return _C.build_info()


if "torch" in sys.modules:  # register the torch custom ops now; else on the first torch call
    interface._torch_ops()

__all__ = interface.__all__ + ["cuda_available", "build_info"]
