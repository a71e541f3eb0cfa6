#!/usr/bin/env python3
# Probe: decode times after a dirty (zero-write) and a clean (read) L2 flush, and the read floor.
"""How the L2's state before a decode call moves its time, for us and for SDPA (FlashAttention-2,
cuDNN). do_bench flushes the L2 by writing zeros over a 256 MB buffer before each call, which
leaves the L2 full of dirty lines: a call that evicts them pays for their write-back. This
script times each call after that flush ("dirty") and after a flush that only reads a 256 MB
buffer ("clean": the L2 is as cold for K/V, but holds clean lines), both as medians of event
timings of single calls.

    python3 bench/probes/l2_state.py --points 8x16384 32x4096 128x1024 1x1024 8x1024

--read-floor also times torch.sum over an int64 buffer of the point's K/V bytes after the same
flush: PyTorch's reduction kernel, a plain streaming read of as many bytes (8 per element, so
its arithmetic stays light), timed as the decode calls are.

--splits 0 2 4 also times our call with those explicit split counts (0: the heuristic's, which
prints as "ours"; FA2 and cuDNN are timed once per flush). --rounds N measures the list of points
N times over, in turn (the spread between rounds is the run-to-run noise of one process).
"""
import argparse
import pathlib
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # bench/bench.py
from bench import paged_kv, warm_up_gpu, warm_up_timing  # noqa: E402

H, HK, D = 32, 8, 128
REPS = 200


def median_us(fn, flush):
    start = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    for _ in range(5):
        fn()
    for i in range(REPS):
        flush()
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(start, end))
    return times[REPS // 2] * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", nargs="+", default=["8x16384", "32x4096", "128x1024", "1x1024", "8x1024"])
    ap.add_argument("--flushes", nargs="+", choices=["dirty", "clean"], default=["dirty", "clean"])
    ap.add_argument("--splits", nargs="+", type=int, default=[0])
    ap.add_argument("--rounds", type=int, default=1, help="times each point is measured, in turn")
    ap.add_argument("--read-floor", action="store_true",
                    help="also time torch.sum over an int64 buffer of the point's K/V bytes (a plain read)")
    ap.add_argument("--page-size", type=int, default=0,
                    help="our calls read the same K/V through a shuffled page table of this page size")
    args = ap.parse_args()
    warm_up_gpu()
    warm_up_timing()
    buf = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    all_flushes = {"dirty": lambda: buf.zero_(), "clean": lambda: buf.sum(dtype=torch.int32)}
    flushes = {name: all_flushes[name] for name in args.flushes}
    print(f"{'point':>10} {'flush':>6} {'ours us':>8} {'FA2 us':>8} {'cuDNN us':>8} {'ours TB/s':>9} {'cuDNN TB/s':>10}")
    for point in [p for _ in range(args.rounds) for p in args.points]:
        b, ctx = (int(x) for x in point.split("x"))
        q = torch.randn(b, 1, H, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, ctx, HK, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        seqlens = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
        out = torch.empty_like(q)
        kc, vc, paging = k, v, {}
        if args.page_size:
            kc, vc, block_table = paged_kv(k, v, args.page_size)
            paging = dict(block_table=block_table)

        def ours_with(splits):
            plan = flashattn.plan_kvcache(q, kc, vc, cache_seqlens=seqlens, num_splits=splits, **paging)
            ws = flashattn.allocate_workspace(plan, like=q)
            return plan.num_splits, lambda: flashattn.flash_attn_with_kvcache(
                q, kc, vc, cache_seqlens=seqlens, out=out, workspace=ws, num_splits=splits, **paging)
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        sdpa = lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
        nbytes = 2 * b * ctx * HK * D * 2
        for name, flush in flushes.items():
            t_ours = median_us(ours_with(0)[1], flush)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                t_fa2 = median_us(sdpa, flush)
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                t_cudnn = median_us(sdpa, flush)
            print(f"{point:>10} {name:>6} {t_ours:8.1f} {t_fa2:8.1f} {t_cudnn:8.1f} "
                  f"{nbytes / t_ours / 1e6:9.2f} {nbytes / t_cudnn / 1e6:10.2f}", flush=True)
            if args.read_floor:
                floor_buf = torch.zeros(nbytes // 8, device="cuda", dtype=torch.int64)
                t = median_us(lambda: floor_buf.sum(), flush)
                print(f"{point:>10} {name:>6} {t:8.1f}  read floor (torch.sum over {nbytes / 1e6:.0f} MB), "
                      f"{nbytes / t / 1e6:.2f} TB/s", flush=True)
                del floor_buf
            for splits in (s for s in args.splits if s > 0):
                planned, call = ours_with(splits)
                t = median_us(call, flush)
                print(f"{point:>10} {name:>6} {t:8.1f}  ours with {planned} splits, {nbytes / t / 1e6:.2f} TB/s",
                      flush=True)
        del q, k, v, kc, vc, out
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
