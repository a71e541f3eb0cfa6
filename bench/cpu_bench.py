#!/usr/bin/env python3
"""Side-by-side CPU benchmark: flashattn's CPU backend vs PyTorch's CPU scaled_dot_product_attention
on identical inputs, in one process, on the same threads (issue #30).

    python3 bench/cpu_bench.py --machine h200-host          # writes bench/results/cpu-h200-host.json/.png
    python3 bench/cpu_bench.py --quick                      # the small points only

Prefill: fp32 and bf16, (b, s, h/hk, d, causal) in PREFILL; GFLOP/s with FLOPs 4*b*h*sq*sk*d,
halved when causal. Decode: bf16, one query row per sequence, 32 query heads over 8 KV heads,
d = 128, batch 1 and 8, context 4k and 32k, contiguous and paged (page 16); GB/s of the K and V
bytes read, next to the bandwidth a plain numpy.sum shows over as many bytes (the floor the issue
measures decode against). With torch, also the same cache in float8_e4m3fn (contiguous, descales
given), timed in turns with our bf16 call: its GB/s of e4m3 bytes and its speedup over bf16.
Times are the best of --repeat calls after one warm-up call, ours and torch's taking turns.
Without torch, flashattn runs alone (fp32 from NumPy; bf16 through ml_dtypes when installed).
"""
import argparse
import json
import os
import platform
import socket
import sys
import time

import numpy as np

import flashattn

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # torch is optional: ours alone then
    torch = None

PREFILL = [  # (batch, seqlen, heads, kv_heads, head_dim, causal)
    (1, 2048, 16, 16, 128, True),
    (4, 512, 8, 2, 64, False),
    (1, 8192, 8, 8, 128, True),
    (1, 2048, 8, 8, 256, True),
]
QUICK_PREFILL = PREFILL[:2]
DECODE_HEADS, DECODE_KV_HEADS, DECODE_HEAD_DIM, DECODE_PAGE = 32, 8, 128, 16
DECODE = [(b, ctx) for b in (1, 8) for ctx in (4096, 32768)]
QUICK_DECODE = [(1, 4096), (8, 4096)]
# Pause before each timed call: torch's OpenMP workers keep spinning for a while after its calls
# (measured: our decode b=1 4k call right after a torch call, median 4.7 ms; alone 2.2 ms).
SETTLE_S = 0.05


def best_seconds(fn, repeat):
    return best_seconds_each([fn], repeat)[0]


def best_seconds_each(fns, repeat):
    """Best time of each function over `repeat` rounds, the functions taking turns within a round
    (so that a change in the machine's load touches all of them alike)."""
    for fn in fns:
        fn()  # warm-up: first-touch of buffers, thread start-up
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            time.sleep(SETTLE_S)
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


# ---- tensors: torch when present (both libraries see the same memory), else NumPy --------------

def random_array(shape, dtype, seed):
    if torch is not None:
        g = torch.Generator().manual_seed(seed)
        return torch.randn(*shape, generator=g, dtype=torch.float32).to(
            torch.bfloat16 if dtype == "bf16" else torch.float32)
    x = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    if dtype == "bf16":
        import ml_dtypes  # noqa: PLC0415 - optional, only for bf16 without torch
        return x.astype(ml_dtypes.bfloat16)
    return x


def bf16_available():
    if torch is not None:
        return True
    try:
        import ml_dtypes  # noqa: F401, PLC0415
        return True
    except ImportError:
        return False


# ---- prefill -----------------------------------------------------------------------------------

def prefill_point(dtype, b, s, h, hk, d, causal, repeat):
    q = random_array((b, s, h, d), dtype, 1)
    k = random_array((b, s, hk, d), dtype, 2)
    v = random_array((b, s, hk, d), dtype, 3)
    flops = 4 * b * h * s * s * d / (2 if causal else 1)
    calls = [lambda: flashattn.flash_attn_func(q, k, v, causal=causal)]
    if torch is not None:
        # SDPA's layout is (b, h, s, d): contiguous copies, made outside the timing.
        tq, tk, tv = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        calls.append(lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, enable_gqa=hk != h))
    times = best_seconds_each(calls, repeat)
    ours = times[0]
    row = {"dtype": dtype, "batch": b, "seqlen": s, "heads": h, "kv_heads": hk, "head_dim": d,
           "causal": causal, "flops": flops, "ours_ms": ours * 1e3, "ours_gflops": flops / ours / 1e9}
    if torch is not None:
        theirs = times[1]
        row.update(torch_ms=theirs * 1e3, torch_gflops=flops / theirs / 1e9, ratio=theirs / ours)
    return row


# ---- decode ------------------------------------------------------------------------------------

def numpy_sum_gbs(nbytes, repeat):
    x = np.random.default_rng(0).standard_normal(nbytes // 4, dtype=np.float32)
    seconds = best_seconds(lambda: x.sum(), repeat)
    return nbytes / seconds / 1e9


def paged_copy(cache, page):
    """(b, ctx, hk, d) -> shuffled pages (pages, page, hk, d) and the block table (b, ctx/page)."""
    b, ctx, hk, d = cache.shape
    per_seq = ctx // page
    pages = cache.reshape(b * per_seq, page, hk, d)
    perm = np.random.default_rng(7).permutation(b * per_seq)
    table = np.argsort(perm).astype(np.int32).reshape(b, per_seq)
    if torch is not None:
        return pages[torch.from_numpy(perm)].contiguous(), torch.from_numpy(table)
    return np.ascontiguousarray(pages[perm]), table


def decode_points(b, ctx, repeat):
    h, hk, d = DECODE_HEADS, DECODE_KV_HEADS, DECODE_HEAD_DIM
    q = random_array((b, 1, h, d), "bf16", 1)
    k = random_array((b, ctx, hk, d), "bf16", 2)
    v = random_array((b, ctx, hk, d), "bf16", 3)
    seqlens = np.full(b, ctx, dtype=np.int32)
    if torch is not None:
        seqlens = torch.from_numpy(seqlens)
    nbytes = 2 * b * ctx * hk * d * 2  # K and V, bf16
    floor = numpy_sum_gbs(nbytes, repeat)
    rows = []
    base = {"dtype": "bf16", "batch": b, "context": ctx, "heads": h, "kv_heads": hk, "head_dim": d,
            "bytes": nbytes, "numpy_sum_gbs": floor}
    calls = [lambda: flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens)]
    if torch is not None:
        tq = q.transpose(1, 2).contiguous()
        tk, tv = (x.transpose(1, 2).contiguous() for x in (k, v))
        calls.append(lambda: F.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True))
    times = best_seconds_each(calls, repeat)
    ours = times[0]
    row = dict(base, page_size=0, ours_ms=ours * 1e3, ours_gbs=nbytes / ours / 1e9)
    if torch is not None:
        theirs = times[1]
        row.update(torch_ms=theirs * 1e3, torch_gbs=nbytes / theirs / 1e9, ratio=theirs / ours)
        del calls, tk, tv
    rows.append(row)
    fp8_row = fp8_cache_point(q, k, v, seqlens, base, repeat) if torch is not None else None
    pk, table = paged_copy(k, DECODE_PAGE)
    del k
    pv, _ = paged_copy(v, DECODE_PAGE)
    del v
    ours = best_seconds(lambda: flashattn.flash_attn_with_kvcache(
        q, pk, pv, cache_seqlens=seqlens, block_table=table), repeat)
    rows.append(dict(base, page_size=DECODE_PAGE, ours_ms=ours * 1e3, ours_gbs=nbytes / ours / 1e9))
    for r in rows:
        r["fraction_of_floor"] = r["ours_gbs"] / floor
    if fp8_row is not None:
        rows.append(fp8_row)
    return rows


def fp8_cache_point(q, k, v, seqlens, base, repeat):
    """The contiguous cache k, v in float8_e4m3fn with per-(batch, KV head) descales, timed in
    turns with our bf16 call on k, v."""
    descale = torch.ones(base["batch"], base["kv_heads"])
    k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
    nbytes = base["bytes"] // 2  # one byte per element
    floor = numpy_sum_gbs(nbytes, repeat)
    bf16, fp8 = best_seconds_each([
        lambda: flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens),
        lambda: flashattn.flash_attn_with_kvcache(q, k8, v8, cache_seqlens=seqlens, k_descale=descale,
                                                  v_descale=descale)], repeat)
    return dict(base, dtype="e4m3", bytes=nbytes, numpy_sum_gbs=floor, page_size=0, ours_ms=fp8 * 1e3,
                ours_gbs=nbytes / fp8 / 1e9, fraction_of_floor=nbytes / fp8 / 1e9 / floor, bf16_ms=bf16 * 1e3,
                speedup=bf16 / fp8)


# ---- report ------------------------------------------------------------------------------------

def print_prefill(row):
    shape = f"{row['batch']},{row['seqlen']},{row['heads']}/{row['kv_heads']},{row['head_dim']}," + (
        "causal" if row["causal"] else "non-causal")
    theirs = f"{row['torch_gflops']:8.1f}  {row['ratio']:5.2f}x" if "torch_gflops" in row else "       -      -"
    print(f"{row['dtype']:5} {shape:28} {row['ours_gflops']:8.1f} {theirs}", flush=True)


def print_decode(row):
    layout = f"page {row['page_size']}" if row["page_size"] else "contiguous"
    if row["dtype"] != "bf16":
        layout += f" {row['dtype']}"
    theirs = f"{row['torch_gbs']:7.1f}" if "torch_gbs" in row else "      -"
    vs_bf16 = f"  {row['speedup']:.2f}x our bf16" if "speedup" in row else ""
    print(f"b={row['batch']} ctx={row['context']:<6} {layout:15} {row['ours_gbs']:7.1f} {theirs} "
          f"{row['numpy_sum_gbs']:7.1f} {row['fraction_of_floor']:6.2f}{vs_bf16}", flush=True)


def plot(result, path):
    try:
        import matplotlib  # noqa: PLC0415
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        print("matplotlib not importable: no plot", file=sys.stderr)
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5))
    pre = result["prefill"]
    labels = [f"{r['dtype']}\n{r['batch']}x{r['seqlen']}\n{r['heads']}/{r['kv_heads']} d{r['head_dim']}"
              + ("\ncausal" if r["causal"] else "") for r in pre]
    x = np.arange(len(pre))
    ax1.bar(x - 0.2, [r["ours_gflops"] for r in pre], 0.4, label="flashattn")
    ax1.bar(x + 0.2, [r.get("torch_gflops", 0) for r in pre], 0.4, label="torch SDPA (CPU)")
    ax1.set_xticks(x, labels, fontsize=7)
    ax1.set_ylabel("GFLOP/s")
    ax1.set_title(f"prefill, {result['threads']} threads")
    ax1.legend()
    dec = result["decode"]
    labels = [f"b{r['batch']}\n{r['context'] // 1024}k\n" + (f"p{r['page_size']}" if r["page_size"] else "contig") +
              ("" if r["dtype"] == "bf16" else f"\n{r['dtype']}") for r in dec]
    x = np.arange(len(dec))
    ax2.bar(x - 0.2, [r["ours_gbs"] for r in dec], 0.4, label="flashattn")
    ax2.bar(x + 0.2, [r.get("torch_gbs", 0) for r in dec], 0.4, label="torch SDPA (CPU)")
    ax2.plot(x, [r["numpy_sum_gbs"] for r in dec], "k_", markersize=20, label="numpy.sum floor")
    ax2.set_xticks(x, labels, fontsize=7)
    ax2.set_ylabel("GB/s (K and V bytes)")
    ax2.set_title("decode (bf16; e4m3: FP8 cache), 32/8 heads, d128")
    ax2.legend()
    fig.suptitle(f"{result['machine']}: {result['cpu']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--machine", default=socket.gethostname().split(".")[0], help="name in the output files")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="threads of both sides")
    ap.add_argument("--repeat", type=int, default=3, help="timed calls per point (best kept)")
    ap.add_argument("--quick", action="store_true", help="the two small prefill and decode points only")
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--out", help="JSON path [bench/results/cpu-<machine>.json]")
    ap.add_argument("--plot", help="PNG path [next to the JSON]")
    args = ap.parse_args()
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"cpu-{args.machine}.json")
    plot_path = args.plot or os.path.splitext(out)[0] + ".png"

    flashattn.set_num_threads(args.threads)
    if torch is not None:
        torch.set_num_threads(args.threads)
    result = {"machine": args.machine, "cpu": cpu_model(), "threads": args.threads,
              "torch": torch.__version__ if torch is not None else None,
              "flashattn": getattr(flashattn, "__version__", None),
              "kernel_override": os.environ.get("FLASHATTN_KERNEL", "automatic"),
              # torch's own kernel level (ATEN_CPU_CAPABILITY caps it, e.g. avx2 beside cpu=avx2)
              "torch_cpu_capability": torch.backends.cpu.get_cpu_capability() if torch is not None else None,
              "repeat": args.repeat, "prefill": [], "decode": []}

    print(f"{result['cpu']}, {args.threads} threads, torch {result['torch']} ({result['torch_cpu_capability']}), "
          f"FLASHATTN_KERNEL={result['kernel_override']}")
    print("dtype (b,s,h/hk,d,mask)                 ours GFLOP/s  torch  ratio (torch time / ours)")
    dtypes = ["fp32"] + (["bf16"] if bf16_available() else [])
    for dtype in dtypes:
        for point in QUICK_PREFILL if args.quick else PREFILL:
            row = prefill_point(dtype, *point, args.repeat)
            result["prefill"].append(row)
            print_prefill(row)
    if not args.skip_decode:
        if not bf16_available():
            print("decode skipped: bf16 needs torch or ml_dtypes")
        else:
            print("decode                         ours GB/s  torch  numpy.sum  ours/numpy")
            for b, ctx in QUICK_DECODE if args.quick else DECODE:
                for row in decode_points(b, ctx, args.repeat):
                    result["decode"].append(row)
                    print_decode(row)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    plot(result, plot_path)
    print(f"wrote {out} and {plot_path}")


if __name__ == "__main__":
    main()
