#!/usr/bin/env python3
# Probe: one prefill call per implementation inside a profiler range, for Nsight Compute.
"""One prefill call each of ours and of SDPA FLASH_ATTENTION (FlashAttention-2) per point, inside
a CUDA profiler range, for Nsight Compute (`ncu --profile-from-start off`); warm-up calls run
outside the range. Points are d x seqlen on the FlashAttention-2 grid (16k tokens, hidden 2048).

    ncu --profile-from-start off --section SpeedOfLight python3 bench/probes/prefill_ncu.py 64x512
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn
from decode_ncu import run_in_profiler_range  # bench/probes/decode_ncu.py (this script's folder is on sys.path)

TOKENS, HIDDEN = 16384, 2048


def main():
    calls = []
    for point in sys.argv[1:] or ["64x512"]:
        d, s = map(int, point.split("x"))
        b, h = TOKENS // s, HIDDEN // d
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))

        def ours(q=q, k=k, v=v):
            flashattn.flash_attn_func(q, k, v)

        def flash(q=q, k=k, v=v):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        calls += [ours, flash]
    run_in_profiler_range(calls)


if __name__ == "__main__":
    main()
