#!/usr/bin/env python3
# Probe: host time against GPU time (CUDA-graph replay) of small decode calls.
"""Where the time of a small decode call goes: GPU time of the kernels alone (CUDA graph replay)
against the eager call (do_bench, as bench.py), and the host time per call.

    python3 bench/probes/decode_overhead.py --batch 1 --context 4096 [--page-size 16]
"""
import argparse
import time

import torch
from triton.testing import do_bench

import flashattn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--page-size", type=int, default=0)
    ap.add_argument("--splits", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="cProfile the host side of the call")
    a = ap.parse_args()
    b, ctx, h, hk, d = a.batch, a.context, 32, 8, 128
    q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16)
    kwargs = dict(cache_seqlens=torch.full((b,), ctx, device="cuda", dtype=torch.int32), num_splits=a.splits)
    if a.page_size:
        pages = b * ctx // a.page_size
        kc = torch.randn(pages, a.page_size, hk, d, device="cuda", dtype=torch.bfloat16)
        kwargs["block_table"] = torch.randperm(pages, device="cuda").view(b, -1).to(torch.int32)
    else:
        kc = torch.randn(b, ctx, hk, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    plan = flashattn.plan_kvcache(q, kc, vc, **kwargs)
    ws = flashattn.allocate_workspace(plan, like=q)
    out = torch.empty_like(q)
    fn = lambda: flashattn.flash_attn_with_kvcache(q, kc, vc, out=out, workspace=ws, **kwargs)
    eager = do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
    fn()
    torch.cuda.synchronize()
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(10):
                fn()
    torch.cuda.synchronize()
    replay = do_bench(graph.replay, warmup=10, rep=100, return_mode="median") * 1e3 / 10
    if a.profile:
        import cProfile
        import pstats
        prof = cProfile.Profile()
        prof.runcall(lambda: [fn() for _ in range(2000)])
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)
        n = 2000
        t0 = time.perf_counter()
        for _ in range(n):
            flashattn._C.data_ptr(q)
        print(f"one DLPack import: {(time.perf_counter() - t0) / n * 1e6:.2f} us")
        t0 = time.perf_counter()
        for _ in range(n):
            torch.cuda.current_stream().cuda_stream
        print(f"current_stream(): {(time.perf_counter() - t0) / n * 1e6:.2f} us")
    print(f"b={b} ctx={ctx} page={a.page_size} splits={plan.num_splits} pack_gqa={plan.pack_gqa}: "
          f"eager {eager:.1f} us, host {host:.1f} us/call, graph replay {replay:.1f} us/call")


if __name__ == "__main__":
    main()
