#!/usr/bin/env python3
# Probe: the GPU gap before a decode call's first kernel, from CUPTI timestamps.
"""The GPU's gap before a decode call's first kernel, from CUPTI kernel timestamps
(torch.profiler), in two orders of work:

  after-event   do_bench's order: [zero-write L2 flush, start event, call, end event]. Per call:
                the event time, the gap from the flush kernel's end to the call's first kernel,
                and the call's kernel span (first start to last end). Ours and SDPA cuDNN.
  back-to-back  [q.mul_(1), call] x 100 with no event between (a decode step's attention right
                after the kernel that wrote its query), eager and CUDA-graph replay: time per
                step and the gap from mul_'s end to the call's first kernel. Ours only.

    python3 bench/probes/launch_gap.py 1x1024 32x4096      (FLASHATTN_KERNEL=automatic,pdl=off: without the
                                                     programmatic dependent launch)

--append: our call also appends one new key and value per sequence (k_new, v_new) in place,
which runs the append kernel before the attention.
"""
import argparse
import json
import statistics
import tempfile

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import flashattn

H, HK, D = 32, 8, 128
CALLS = 60
STEPS = 100
GRAPH_STEPS = 20


def kernels_of(prof):
    """The profiled kernels, in start order."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    return sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])


def calls_after(kernels, is_marker):
    """(gap, span) of each run of kernels after a marker kernel: gap from the marker's end to the
    run's first start, span from that start to the run's last end; in microseconds."""
    runs, marker_end, run = [], None, None
    for k in kernels:
        if is_marker(k["name"]):
            if run:
                runs.append(run)
            marker_end, run = k["ts"] + k["dur"], None
        elif marker_end is not None:
            run = run or [k["ts"] - marker_end, k["ts"], 0.0]
            run[2] = k["ts"] + k["dur"]
    if run:
        runs.append(run)
    return [(gap, end - start) for gap, start, end in runs]


def after_event(name, call):
    buf = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    for _ in range(5):
        call()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(CALLS)]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for start, end in events:
            buf.zero_()
            start.record()
            call()
            end.record()
        torch.cuda.synchronize()
    runs = calls_after(kernels_of(prof), lambda n: "FillFunctor" in n)
    event_us = statistics.median(s.elapsed_time(e) * 1e3 for s, e in events)
    gap, span = (statistics.median(x) for x in zip(*runs))
    print(f"  after-event  {name:>6}: event {event_us:7.1f} us, gap after the flush {gap:5.2f}, kernels {span:7.1f}")


def back_to_back(q, call):
    def step():
        q.mul_(1.0)
        call()

    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
        side.synchronize()
        with torch.cuda.graph(graph):
            for _ in range(GRAPH_STEPS):
                step()
    torch.cuda.current_stream().wait_stream(side)
    modes = {"eager": lambda: [step() for _ in range(STEPS)],
             "graph": lambda: [graph.replay() for _ in range(STEPS // GRAPH_STEPS)]}
    for mode, run in modes.items():
        run()
        per_step = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            per_step.append(start.elapsed_time(end) * 1e3 / STEPS)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
        gaps = [gap for gap, _ in calls_after(kernels_of(prof), lambda n: "MulFunctor" in n)]
        print(f"  back-to-back {mode:>6}: {statistics.median(per_step):7.2f} us per step, "
              f"gap after mul_ {statistics.median(gaps):5.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("points", nargs="*", default=["1x1024", "32x4096"], help="BATCHxCONTEXT")
    ap.add_argument("--append", action="store_true", help="our call appends one key and value in place")
    args = ap.parse_args()
    for point in args.points:
        b, ctx = map(int, point.split("x"))
        q = torch.randn(b, 1, H, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, ctx, HK, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        seqlens = torch.full((b,), ctx - 1 if args.append else ctx, device="cuda", dtype=torch.int32)
        new = dict(k=torch.randn(b, 1, HK, D, device="cuda", dtype=torch.bfloat16),
                   v=torch.randn(b, 1, HK, D, device="cuda", dtype=torch.bfloat16)) if args.append else {}

        def ours():
            flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, **new)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               enable_gqa=True)
        print(point, flush=True)
        after_event("ours", ours)
        after_event("cudnn", cudnn)
        back_to_back(q, ours)


if __name__ == "__main__":
    main()
