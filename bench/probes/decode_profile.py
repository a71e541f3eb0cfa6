#!/usr/bin/env python3
# Probe: the kernels and GPU span of one small decode call, ours and SDPA's (torch.profiler).
"""What the GPU does during one small decode call, for us and for SDPA (FlashAttention-2, cuDNN):
eager times first (do_bench medians with a caller workspace, as bench.py), our time over explicit
split counts, then the kernels of each call, their CUDA times and the call's GPU span
(torch.profiler, each call after an L2 flush; after the timings, since a profiler session
disturbs the timings that follow it).

    python3 bench/probes/decode_profile.py --points 1x1024 1x4096 8x1024 --splits 1 2 4 8 16
"""
import argparse
import pathlib
import sys
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

import flashattn
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # bench/bench.py
from bench import warm_up_gpu  # noqa: E402

H, HK, D = 32, 8, 128
CALLS = 20


def median_us(fn, backend=None):
    if backend is None:
        return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
    with sdpa_kernel(backend):
        return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def is_flush(name):
    return "FillFunctor" in name  # the L2 flush between calls (torch zero_)


def kernels_per_call(fn, backend=None):
    """From CALLS profiled calls, each after an L2 flush as in do_bench: (name, mean CUDA us per
    call) of every kernel fn launches, and the median GPU span of a call (first kernel's start to
    last kernel's end: the kernels, the gaps between them, a dependent launch's wait)."""
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")

    def run():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(CALLS):
                flush.zero_()
                fn()
            torch.cuda.synchronize()
        return prof
    if backend is None:
        prof = run()
    else:
        with sdpa_kernel(backend):
            prof = run()
    totals = defaultdict(float)
    kernels = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not is_flush(e.name):
            totals[e.name] += e.device_time
            kernels.append((e.time_range.start, e.time_range.end))
    kernels.sort()
    per_call = len(kernels) // CALLS
    spans = sorted(kernels[i + per_call - 1][1] - kernels[i][0]
                   for i in range(0, per_call * CALLS, per_call)) if per_call else [0.0]
    ranked = sorted(((n, t / CALLS) for n, t in totals.items()), key=lambda x: -x[1])
    return ranked, spans[len(spans) // 2]


def calls_of(b, ctx, with_seqlens=True):
    q = torch.randn(b, 1, H, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, ctx, HK, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.full((b,), ctx, device="cuda", dtype=torch.int32) if with_seqlens else None
    out = torch.empty_like(q)

    def ours(splits=0):
        plan = flashattn.plan_kvcache(q, k, v, cache_seqlens=seqlens, num_splits=splits)
        ws = flashattn.allocate_workspace(plan, like=q)
        return lambda: flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, out=out,
                                                         workspace=ws, num_splits=splits)

    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    sdpa = lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
    plan = flashattn.plan_kvcache(q, k, v, cache_seqlens=seqlens)
    return plan, ours, [("ours", ours(), None), ("flash", sdpa, SDPBackend.FLASH_ATTENTION),
                        ("cudnn", sdpa, SDPBackend.CUDNN_ATTENTION)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", nargs="+", default=["1x1024", "1x4096", "1x16384", "1x65536", "8x1024",
                                                     "8x4096", "8x16384", "128x1024"])
    ap.add_argument("--splits", nargs="*", type=int, default=[])
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--no-seqlens", action="store_true",
                    help="call without cache_seqlens (every cache row visible, as SDPA)")
    a = ap.parse_args()
    warm_up_gpu()
    points = [tuple(map(int, p.split("x"))) for p in a.points]
    for b, ctx in points:
        plan, ours, calls = calls_of(b, ctx, not a.no_seqlens)
        times = " ".join(f"{label} {median_us(fn, backend):.1f}" for label, fn, backend in calls)
        line = f"b={b} ctx={ctx} splits={plan.num_splits}: {times} us"
        if a.splits:
            line += "; splits " + " ".join(f"{s}:{median_us(ours(s)):.1f}" for s in a.splits if s <= 128)
        print(line, flush=True)
        torch.cuda.empty_cache()
    if a.no_profile:
        return
    for b, ctx in points:
        _, _, calls = calls_of(b, ctx, not a.no_seqlens)
        for label, fn, backend in calls:
            ks, span = kernels_per_call(fn, backend)
            print(f"  b={b} ctx={ctx} {label:6s} span {span:6.1f} us, kernels {sum(t for _, t in ks):7.1f} us: " +
                  "; ".join(f"{n[:50]} {t:.1f}" for n, t in ks[:3]), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
