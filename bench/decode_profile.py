#!/usr/bin/env python3
"""What the GPU does during one small decode call, for us and for SDPA (FlashAttention-2, cuDNN):
the kernels of each call and their CUDA times (torch.profiler), and our time over explicit split
counts (do_bench medians with a caller workspace, as bench.py).

    python3 bench/decode_profile.py --points 1x1024 1x4096 8x1024 --splits 0 1 2 4 8 16
"""
import argparse
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

import flashattn
from bench import warm_up_gpu  # bench/bench.py (this script's folder is on sys.path)

H, HK, D = 32, 8, 128
CALLS = 20


def kernels_per_call(fn):
    """(name, mean CUDA us per call) of every kernel fn launches, from CALLS profiled calls."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    totals = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            totals[e.name] += e.device_time
    return sorted(((n, t / CALLS) for n, t in totals.items()), key=lambda x: -x[1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", nargs="+", default=["1x1024", "1x4096", "1x16384", "1x65536", "8x1024",
                                                     "8x16384", "128x1024"])
    ap.add_argument("--splits", nargs="+", type=int, default=[0, 1, 2, 4, 8, 16, 32])
    a = ap.parse_args()
    warm_up_gpu()
    for point in a.points:
        b, ctx = map(int, point.split("x"))
        q = torch.randn(b, 1, H, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, ctx, HK, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        seqlens = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
        out = torch.empty_like(q)
        plan = flashattn.plan_kvcache(q, k, v, cache_seqlens=seqlens)
        print(f"== b={b} ctx={ctx}: plan splits={plan.num_splits} pack_gqa={plan.pack_gqa}", flush=True)

        def ours(splits=0):
            ws = flashattn.allocate_workspace(flashattn.plan_kvcache(q, k, v, cache_seqlens=seqlens,
                                                                     num_splits=splits), like=q)
            return lambda: flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, out=out,
                                                             workspace=ws, num_splits=splits)

        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

        def sdpa(backend):
            def fn():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
            return fn

        # Without cache_seqlens the kernel reads no per-sequence length first (as SDPA).
        no_seqlens = lambda: flashattn.flash_attn_with_kvcache(q, k, v, out=out)
        for label, fn in [("ours", ours()), ("ours-n", no_seqlens), ("flash", sdpa(SDPBackend.FLASH_ATTENTION)),
                          ("cudnn", sdpa(SDPBackend.CUDNN_ATTENTION))]:
            ks = kernels_per_call(fn)
            total = sum(t for _, t in ks)
            eager = do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
            print(f"  {label:6s} eager {eager:7.1f} us, kernels {total:7.1f} us: " +
                  "; ".join(f"{n[:60]} {t:.1f}" for n, t in ks[:4]), flush=True)
        line = []
        for s in a.splits:
            if s > 128:
                continue
            t = do_bench(ours(s), warmup=25, rep=100, return_mode="median") * 1e3
            line.append(f"{s}:{t:.1f}")
        print("  splits (us): " + " ".join(line), flush=True)
        del q, k, v, out
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
