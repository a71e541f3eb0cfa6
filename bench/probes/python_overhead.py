#!/usr/bin/env python3
"""Host time of one eager call of each flash_attn-style function on tiny torch tensors (b = 1,
one query row: the work is negligible, the Python and dispatch path is what is timed).

    python3 bench/probes/python_overhead.py [--device cpu|cuda] [--calls 2000] [--repeats 15]

Prints, per function, the median (and the minimum) over `repeats` runs of (time of `calls` calls)
/ calls, in us.
On CUDA the calls are only queued (no synchronisation inside the timed loop), so the number is
the host cost per call. The CPU backend runs on one thread (set_num_threads(1)).
--python-only replaces the extension's forward calls by no-ops: what is left is the Python layer
(argument checks, output allocation, DLPack export, dispatch), the part this package adds.
"""
import argparse
import statistics
import time

import torch

import flashattn


def problems(device):
    """name -> a zero-argument call."""
    h, hk, d, sk = 4, 2, 64, 16
    kw = dict(device=device, dtype=torch.float16 if device == "cuda" else torch.float32)
    q = torch.randn(1, 1, h, d, **kw)
    k = torch.randn(1, sk, hk, d, **kw)
    v = torch.randn(1, sk, hk, d, **kw)
    q_packed = q[0]
    k_packed, v_packed = k[0], v[0]
    cu_q = torch.tensor([0, 1], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, sk], dtype=torch.int32, device=device)
    k_cache = torch.randn(1, 64, hk, d, **kw)
    v_cache = torch.randn(1, 64, hk, d, **kw)
    k_new = torch.randn(1, 1, hk, d, **kw)
    seqlens = torch.tensor([sk], dtype=torch.int32, device=device)
    return {
        "flash_attn_func": lambda: flashattn.flash_attn_func(q, k, v, causal=True),
        "flash_attn_func(lse)": lambda: flashattn.flash_attn_func(
            q, k, v, causal=True, return_attn_probs=True),
        "flash_attn_varlen_func": lambda: flashattn.flash_attn_varlen_func(
            q_packed, k_packed, v_packed, cu_q, cu_k, 1, sk, causal=True),
        "flash_attn_with_kvcache": lambda: flashattn.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=seqlens, causal=True),
        "flash_attn_with_kvcache(append)": lambda: flashattn.flash_attn_with_kvcache(
            q, k_cache, v_cache, k_new, k_new, cache_seqlens=seqlens, causal=True),
    }


def per_call_us(fn, calls, repeats, sync):
    for _ in range(50):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
        sync()
    return statistics.median(times), min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--python-only", action="store_true",
                    help="no-op the extension's forward calls (time the Python layer alone)")
    a = ap.parse_args()
    if a.python_only:
        for name in ("forward", "forward_varlen", "forward_kvcache"):
            setattr(flashattn._C, name, lambda *args: None)
    flashattn.set_num_threads(1)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    with torch.inference_mode():
        for name, fn in problems(a.device).items():
            median, best = per_call_us(fn, a.calls, a.repeats, sync)
            print(f"{name:34s} median {median:7.2f} us/call  (min {best:7.2f})")


if __name__ == "__main__":
    main()
