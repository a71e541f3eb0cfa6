#!/usr/bin/env python3
"""One decode call each of ours and of SDPA cuDNN per point, inside a CUDA profiler range, for
Nsight Compute (`ncu --profile-from-start off`); warm-up calls run outside the range.

    ncu --profile-from-start off --section SpeedOfLight python3 bench/decode_ncu.py 1x16384 128x1024
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn

H, HK, D = 32, 8, 128


def main():
    calls = []
    for point in sys.argv[1:] or ["1x16384"]:
        b, ctx = map(int, point.split("x"))
        q = torch.randn(b, 1, H, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, ctx, HK, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        seqlens = torch.full((b,), ctx, device="cuda", dtype=torch.int32)

        def ours(q=q, k=k, v=v, seqlens=seqlens):
            flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens)

        def cudnn(q=q, k=k, v=v):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               enable_gqa=True)
        calls += [ours, cudnn]
    run_in_profiler_range(calls)


def run_in_profiler_range(calls):
    """Each call once as a warm-up, then each once more inside the CUDA profiler range."""
    for fn in calls:
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for fn in calls:
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
