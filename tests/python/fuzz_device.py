"""The fuzz cases of fuzz_cases.py on a device (test_fuzz_gpu.py): each call made on torch
tensors of that device and on the CPU backend (NumPy), and the two judged together.

TorchBackend moves a case's NumPy arrays to torch tensors with the same memory layout: arrays
that share memory (aliases, the two halves of a packed buffer, padded or transposed strides)
become views of one device buffer with the same strides and offsets, so the device call sees the
layout the CPU call sees (a negative stride, which torch has not, becomes a contiguous copy).

The device is a parameter: "cuda" on the GPU machine; "cpu" (torch CPU tensors) or "numpy"
(the CPU backend twice) check this harness on a machine without a GPU.
"""
from __future__ import annotations

import numpy as np

from fuzz_cases import (BF16, E4M3, ERROR_MESSAGE, check_against_oracle, check_refused,
                        describe, is_fp8, run_call, steps)

# Bad values in index tensors (fuzz_cases.py *_BAD names): the host checks them only where it
# can read them (CPU tensors, src/api/validate.cpp); on the device a kernel checks a value as it
# reads it and records the first fault for check_device_status() (docs/DECISIONS.md D-61), and
# rules across sequences (two appends to one row) are not checked there at all.
DEVICE_VALUE_BAD = {
    "cu_q_short_of_total", "cu_k_decrease", "cu_k_wraps", "max_seqlen_q_small", "seqused_beyond",
    "leftpad_beyond", "page_in_use_invalid", "seqlens_int32_max", "seqlens_negative",
    "seqlens_past_capacity", "dup_batch_idx", "pages_shared_by_appends", "rotary_q_past_table",
    "batch_idx_out_of_range",
}
# The arguments check_device_status() may name (src/common/index_faults.h).
INDEX_ARGS = {"cu_seqlens_q", "cu_seqlens_k", "seqused_k", "leftpad_k", "cache_seqlens",
              "cache_leftpad", "cache_batch_idx", "block_table"}


class TorchBackend:
    """run_call's backend for torch tensors on `device`."""

    def __init__(self, device):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        # NumPy dtypes DLPack / torch.from_numpy cannot take, moved as their bits
        self._bits = {BF16: (np.int16, torch.bfloat16), E4M3: (np.int8, torch.float8_e4m3fn)}

    def _flat(self, owner):
        """A NumPy array that owns its memory, as a 1-D tensor on the device (a copy)."""
        flat = owner.reshape(-1)
        if flat.dtype in self._bits:
            ints, dtype = self._bits[flat.dtype]
            return self.torch.from_numpy(flat.view(ints)).to(self.device, copy=True).view(dtype)
        return self.torch.from_numpy(flat).to(self.device, copy=True)

    def _tensor(self, a, buffers):
        owner = a.base if a.base is not None else a
        offset = a.__array_interface__["data"][0] - owner.__array_interface__["data"][0] \
            if isinstance(owner, np.ndarray) else 0
        shares = (isinstance(owner, np.ndarray) and owner.base is None and owner.dtype == a.dtype
                  and owner.flags.c_contiguous and offset % a.itemsize == 0
                  and all(s >= 0 and s % a.itemsize == 0 for s in a.strides))
        if not shares:
            owner, offset = np.ascontiguousarray(a), 0
        if id(owner) not in buffers:
            buffers[id(owner)] = (owner, self._flat(owner))  # owner kept alive: ids stay unique
        flat = buffers[id(owner)][1]
        strides = [s // a.itemsize for s in a.strides] if shares else None
        if strides is None:
            return flat.view(a.shape)
        return flat.as_strided(a.shape, strides, offset // a.itemsize)

    def put(self, kwargs):
        buffers = {}
        return {name: (self._tensor(x, buffers) if isinstance(x, np.ndarray) else x)
                for name, x in kwargs.items()}

    def get(self, t):
        """A tensor's values on the host, as a NumPy array of its own."""
        t = t.detach().to("cpu").contiguous()
        for numpy_dtype, (ints, dtype) in self._bits.items():
            if t.dtype == dtype:
                return np.array(t.view(getattr(self.torch, np.dtype(ints).name)).numpy()).view(numpy_dtype)
        return np.array(t.numpy())

    def finish(self):
        """Waits for the call; reads (and clears) the device's index-fault status."""
        import flashattn

        try:
            if self.device.type == "cuda":
                self.torch.cuda.synchronize(self.device)
            flashattn.check_device_status()
        except ValueError as e:  # an index fault, named
            return {"status": ("ValueError", str(e)), "fatal": None}
        except Exception as e:  # noqa: BLE001 - a CUDA error: the context is unusable
            return {"status": None, "fatal": f"{type(e).__name__}: {e}"}
        return {"status": None, "fatal": None}


def run_pair(case, device):
    """The Worker's job: the case on the CPU backend and on `device`."""
    cpu = run_call(case)
    dev = run_call(case) if device == "numpy" else run_call(case, TorchBackend(device))
    dev.setdefault("status", None)
    return {"cpu": cpu, "dev": dev, "fatal": dev.get("fatal")}


def _argument(error):
    return error[1].split(":", 1)[0]


def _check_caches_agree(case, cpu, dev, what):
    """The device's caches after the call equal the CPU backend's, everywhere (rows appended,
    rows kept); keys rotated by rotary may differ by one step of the storage type."""
    for name in cpu["caches"]:
        a, b = cpu["caches"][name].astype(np.float64), dev["caches"][name].astype(np.float64)
        assert a.shape == b.shape
        rotated = name == "k_cache" and "rotary_cos" in case["kwargs"]
        tol = steps(np.maximum(np.abs(a), np.abs(b)), cpu["caches"][name].dtype, 1 if rotated else 0)
        same = (np.abs(a - b) <= tol) | (np.isnan(a) & np.isnan(b))
        assert same.all(), (f"{name}: the device's differs from the CPU backend's at "
                            f"{np.argwhere(~same)[:5].tolist()}\n{what}")


def check_pair(case, report, device, event=lambda text: None):
    """Judges a run_pair report.

    * The CPU backend ran the call: the device runs it too, reports no index fault, and both
      results hold the pass rule against the oracle (fuzz_cases.check_against_oracle); the
      caches after an append agree.
    * The CPU backend refused it: the device refuses it too, with the same kind of error naming
      the same argument, and writes nothing -- except for a bad value in an index tensor, which
      the host cannot read on the device: there the call may run (writing only out and the
      caches), and what check_device_status() reports is a ValueError naming an index argument.
    * Neither crashes nor leaves a CUDA error.
    """
    what = describe(case)
    assert "crash" not in report, f"crash: {report['crash']}\n{what}"
    assert not report.get("fatal"), f"{device}: {report['fatal']}\n{what}"
    cpu, dev = report["cpu"], report["dev"]
    outcome = {True: "refused", False: "ran"}
    event(f"{case['bad'] or 'valid'}: cpu {outcome[cpu['error'] is not None]}, "
          f"{device} {outcome[dev['error'] is not None]}"
          + (f", fault in {_argument(dev['status'])}" if dev["status"] else ""))
    if dev["error"] and "no CUDA kernel compiled" in dev["error"][1]:  # a build with fewer instances
        event(f"{device}: not compiled")
        return
    if dev["status"] is not None:
        message = dev["status"][1]
        assert case["bad"] in DEVICE_VALUE_BAD, f"index fault on a call without one: {message}\n{what}"
        assert ERROR_MESSAGE.match(message) and _argument(dev["status"]) in INDEX_ARGS, \
            f"unclear device status: {message!r}\n{what}"
    if cpu["error"] is None:
        assert dev["error"] is None, \
            f"the CPU backend ran the call, {device} refused it: {dev['error']}\n{what}"
        assert dev["status"] is None, f"{device} reported {dev['status']} for a call the CPU ran\n{what}"
        check_against_oracle(case, cpu, f"cpu: {what}")
        check_against_oracle(case, dev, f"{device}: {what}")
        _check_caches_agree(case, cpu, dev, what)
        return
    # A valid call is refused only where FP8 is not supported (rotary with an e4m3 q).
    kinds = ("NotImplementedError",) if case["bad"] is None else ("ValueError", "TypeError")
    assert case["bad"] is not None or is_fp8(case), f"a valid call was refused: {cpu['error']}\n{what}"
    check_refused(cpu, what, kinds)
    if case["bad"] in DEVICE_VALUE_BAD and dev["error"] is None:
        allowed = {"out", "k_cache", "v_cache"}
        assert set(dev["changed"]) <= allowed, f"{dev['changed']} written\n{what}"
        return
    assert dev["error"] is not None, \
        f"the CPU backend refused the call ({cpu['error']}), {device} ran it\n{what}"
    check_refused(dev, what, kinds)
    assert (dev["error"][0], _argument(dev["error"])) == (cpu["error"][0], _argument(cpu["error"])), \
        f"different refusals: cpu {cpu['error']}, {device} {dev['error']}\n{what}"
