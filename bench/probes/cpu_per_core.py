#!/usr/bin/env python3
# Probe: per-core GFLOP/s of bench/cpu_bench.py's prefill points (and decode GB/s), ours and torch's, in CPU time.
"""One thread each, ours and torch's SDPA taking turns on the same tensors; each call timed in
process CPU time (time.process_time), so that other jobs on a shared machine cost nothing but
preemption, which `chrt -f` removes. Prints the best of --repeat calls per point as GFLOP/s per
CPU-second (decode: GB/s of K and V per CPU-second). FLASHATTN_KERNEL caps our kernel set, so
two processes compare two sets (D-67: best of several runs, alternating them):

    for i in 1 2 3; do for cap in avx512 avx512bf16; do
      FLASHATTN_KERNEL=automatic,cpu=$cap chrt -f 10 python3 bench/probes/cpu_per_core.py --dtype bf16
    done; done
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from cpu_bench import DECODE_HEAD_DIM, DECODE_HEADS, DECODE_KV_HEADS, PREFILL, random_array  # noqa: E402

import flashattn  # noqa: E402


def best_cpu_seconds_each(fns, repeat):
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            start = time.process_time()
            fn()
            best[i] = min(best[i], time.process_time() - start)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--decode", nargs="*", default=[], metavar="BxCTX", help="decode points, e.g. 1x4096 8x32768")
    ap.add_argument("--skip-prefill", action="store_true")
    args = ap.parse_args()
    flashattn.set_num_threads(1)
    torch.set_num_threads(1)
    print(f"FLASHATTN_KERNEL={os.environ.get('FLASHATTN_KERNEL', 'automatic')} {args.dtype}, 1 thread, "
          f"best of {args.repeat}, per CPU-second")
    for b, s, h, hk, d, causal in [] if args.skip_prefill else PREFILL:
        q = random_array((b, s, h, d), args.dtype, 1)
        k = random_array((b, s, hk, d), args.dtype, 2)
        v = random_array((b, s, hk, d), args.dtype, 3)
        tq, tk, tv = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        ours, theirs = best_cpu_seconds_each([
            lambda: flashattn.flash_attn_func(q, k, v, causal=causal),
            lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, enable_gqa=hk != h)], args.repeat)
        print(f"{b},{s},{h}/{hk},{d},{'causal' if causal else 'non-causal':10}  ours {flops / ours / 1e9:6.1f}"
              f"  torch {flops / theirs / 1e9:6.1f} GFLOP/s", flush=True)
    for point in args.decode:
        b, ctx = (int(x) for x in point.split("x"))
        h, hk, d = DECODE_HEADS, DECODE_KV_HEADS, DECODE_HEAD_DIM
        q = random_array((b, 1, h, d), "bf16", 1)
        k = random_array((b, ctx, hk, d), "bf16", 2)
        v = random_array((b, ctx, hk, d), "bf16", 3)
        seqlens = torch.full((b,), ctx, dtype=torch.int32)
        tq = q.transpose(1, 2).contiguous()
        tk, tv = (x.transpose(1, 2).contiguous() for x in (k, v))
        nbytes = 2 * b * ctx * hk * d * 2
        ours, theirs = best_cpu_seconds_each([
            lambda: flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens),
            lambda: F.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)], args.repeat)
        print(f"decode b={b} ctx={ctx}  ours {nbytes / ours / 1e9:6.2f}  torch {nbytes / theirs / 1e9:6.2f} GB/s",
              flush=True)


if __name__ == "__main__":
    main()
