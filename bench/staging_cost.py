#!/usr/bin/env python3
"""The cost of a head dim that is not a multiple of 8 on CUDA (staged, zero-padded copies:
src/api/staging.h): each call timed at head dim d and at d rounded up to a multiple of 8 (the
same kernels without the copies), prefill and decode, bf16, median of do_bench.

    python3 bench/staging_cost.py [--dims 59 111 200]
"""
import argparse

import torch
from triton.testing import do_bench

import flashattn


def time_us(fn):
    return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def prefill(d, b=2, s=4096, h=16):
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    return time_us(lambda: flashattn.flash_attn_func(q, k, v, causal=True))


def decode(d, b=8, ctx=4096, h=32, hk=8):
    q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16)
    kc, vc = (torch.randn(b, ctx, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
    return time_us(lambda: flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", type=int, nargs="+", default=[59, 111, 200])
    a = ap.parse_args()
    print("kind     shape                         d  time_us  d_padded  time_us  ratio")
    for name, fn, shape in (("prefill", prefill, "b2 s4096 h16 causal"),
                            ("decode", decode, "b8 ctx4096 h32 hk8")):
        for d in a.dims:
            padded = -(-d // 8) * 8
            t, tp = fn(d), fn(padded)
            print(f"{name:8} {shape:28} {d:3} {t:8.1f} {padded:9} {tp:8.1f} {t / tp:6.2f}")


if __name__ == "__main__":
    main()
