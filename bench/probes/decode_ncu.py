#!/usr/bin/env python3
# Probe: one decode call per implementation inside a profiler range, for Nsight Compute (DRAM bytes, time).
"""One decode call each of ours, SDPA cuDNN and SDPA FlashAttention-2 per point, inside a CUDA
profiler range, for Nsight Compute (`ncu --profile-from-start off`); warm-up calls run outside
the range.

    ncu --profile-from-start off --section SpeedOfLight python3 bench/probes/decode_ncu.py 1x16384 128x1024

--flush dirty|clean puts the benchmark's L2 state before each profiled call: "dirty" writes zeros
over 256 MB as do_bench does (the L2 is left full of dirty lines, which the call then writes back
as it evicts them), "clean" reads 256 MB. Run it under `ncu --cache-control none` (ncu's own
flush would undo it) and ask for dram__bytes_read.sum and dram__bytes_write.sum: the call's
write bytes are the write-back it pays for. `--summarize FILE` reads that run's
`ncu --csv --print-units base` output and prints one line per call (its kernels summed).
"""
import argparse
import csv
import functools

H, HK, D = 32, 8, 128


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("points", nargs="*", default=["1x16384"], help="BATCHxCONTEXT")
    ap.add_argument("--flush", choices=["none", "dirty", "clean"], default="none")
    ap.add_argument("--flash", action="store_true", help="also SDPA FLASH_ATTENTION (FlashAttention-2)")
    ap.add_argument("--summarize", metavar="CSV", help="print the calls of this ncu CSV and exit")
    args = ap.parse_args()
    if args.summarize:
        summarize(args.summarize, args.points, ["ours", "cudnn"] + (["flash"] if args.flash else []))
        return
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import flashattn

    calls = []
    for point in args.points:
        b, ctx = map(int, point.split("x"))
        q = torch.randn(b, 1, H, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, ctx, HK, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        seqlens = torch.full((b,), ctx, device="cuda", dtype=torch.int32)

        def ours(q=q, k=k, v=v, seqlens=seqlens):
            flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens)

        def sdpa(backend, q=q, k=k, v=v):
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               enable_gqa=True)
        calls += [ours, functools.partial(sdpa, SDPBackend.CUDNN_ATTENTION)]
        if args.flash:
            calls.append(functools.partial(sdpa, SDPBackend.FLASH_ATTENTION))
    run_in_profiler_range(calls, make_flush(args.flush))


def make_flush(kind):
    """What runs before each profiled call: nothing, or do_bench's zero-write over 256 MB, or a read."""
    import torch

    if kind == "none":
        return lambda: None
    buf = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    return (lambda: buf.zero_()) if kind == "dirty" else (lambda: buf.sum(dtype=torch.int32))


def run_in_profiler_range(calls, flush):
    """Each call once as a warm-up, then each once more inside the CUDA profiler range, after flush."""
    import torch

    for fn in calls:
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for fn in calls:
        flush()
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


FLUSH_KERNELS = ("FillFunctor", "reduce_kernel")  # zero_() and sum(): the flush, not a call


def summarize(path, points, names):
    """One line per profiled call: its kernels' time, DRAM bytes read and written, summed."""
    kernels = {}  # ncu's kernel ID -> {"name": ..., metric: value}
    with open(path) as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own log lines are not CSV
    for row in csv.DictReader(lines):
        k = kernels.setdefault(row["ID"], {"name": row["Kernel Name"]})
        k[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
    calls, current = [], None
    for k in kernels.values():
        if any(flush in k["name"] for flush in FLUSH_KERNELS):
            current = None
            continue
        if current is None:
            current = {"kernels": 0, "ns": 0.0, "read": 0.0, "write": 0.0}
            calls.append(current)
        current["kernels"] += 1
        current["ns"] += k.get("gpu__time_duration.sum", 0.0)
        current["read"] += k.get("dram__bytes_read.sum", 0.0)
        current["write"] += k.get("dram__bytes_write.sum", 0.0)
    labels = [f"{p} {n}" for p in points for n in names]
    print(f"{'call':>16} {'kernels':>7} {'us':>7} {'read MB':>8} {'write MB':>8} {'K/V TB/s':>8} {'DRAM TB/s':>9}")
    for label, c in zip(labels + ["?"] * len(calls), calls):
        b, ctx = (int(x) for x in label.split()[0].split("x")) if label != "?" else (0, 0)
        kv_bytes = 2 * b * ctx * HK * D * 2
        print(f"{label:>16} {c['kernels']:>7} {c['ns'] / 1e3:7.1f} {c['read'] / 1e6:8.1f} {c['write'] / 1e6:8.1f} "
              f"{kv_bytes / c['ns'] / 1e3:8.2f} {(c['read'] + c['write']) / c['ns'] / 1e3:9.2f}")


if __name__ == "__main__":
    main()
