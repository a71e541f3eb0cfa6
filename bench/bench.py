#!/usr/bin/env python3
"""Side-by-side benchmark on one GPU: flashattn vs PyTorch SDPA FLASH_ATTENTION (FlashAttention-2)
and CUDNN_ATTENTION, on identical inputs, in one process.

    python3 bench/bench.py prefill --out bench/results/prefill-h200.json --plot bench/results/prefill-h200.png
    python3 bench/bench.py decode  --out bench/results/decode-h200.json  --plot bench/results/decode-h200.png
    python3 bench/bench.py chunked --out bench/results/prefill-paged-h200.json
    python3 bench/bench.py prefill-fp8 --out bench/results/prefill-fp8-h200.json --plot bench/results/prefill-fp8-h200.png
    python3 bench/bench.py decode-fp8  --out bench/results/decode-fp8-h200.json  --plot bench/results/decode-fp8-h200.png

Prefill follows the FlashAttention-2 benchmark convention: 16384 tokens per batch
(batch = 16384 / seqlen), hidden 2048 (heads = 2048 / head_dim), bf16, FLOPs = 4*b*h*s*s*d,
halved when causal. Decode: q_len 1, 32 query heads, 8 KV heads, head_dim 128, bf16; bytes =
K and V read. Times are triton.testing.do_bench medians (ms); a decode point's calls are timed
--rounds times in turn, the whole table is measured --passes times over, and each call keeps its
best median. Chunked prefill: one sequence, a chunk of 512 or 2048 query tokens over 8k or 32k
cached ones, causal, 32 query heads, 8 KV heads, d = 128, the cache contiguous and in pages of 16
and 256 rows (TFLOP/s, paged over contiguous). FP8 (prefill-fp8, decode-fp8): the same points
with q, k, v (prefill) or the cache (decode) in float8_e4m3fn, per-tensor descales (amax / 448),
timed beside our bf16 call on the same values; records as above, plus the bf16 figure of the
point ("bf16", "bf16_us") and the speedup. FP8 TFLOP/s are counted as for bf16.
"""
import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn

try:
    from triton.testing import do_bench
except ImportError:  # pragma: no cover - triton ships with torch on the GPU machine
    do_bench = None

TOKENS = 16384
CHECK_MAX_TOKENS = 256 * 1024  # decode points checked against fp32 SDPA
HIDDEN = 2048
DECODE_HEADS, DECODE_KV_HEADS, DECODE_HEAD_DIM = 32, 8, 128


def median_ms(fn):
    if do_bench is not None:
        return do_bench(fn, warmup=25, rep=100, return_mode="median")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        fn()
    times = []
    for _ in range(20):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def warm_up_gpu(seconds=1.0):
    """Busy the GPU for a while before the first timing, so that it starts at full clocks."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    while True:
        for _ in range(20):
            a @ a
        end.record()
        end.synchronize()
        if start.elapsed_time(end) > seconds * 1e3:
            return


def warm_up_timing():
    """Throwaway timed decode calls, ours and SDPA's: the first do_bench of a process measured
    our call at 2x its later time (docs/DECISIONS.md D-42), and the first SDPA FLASH_ATTENTION
    decode timing 1.5-1.8x (docs/DECISIONS.md D-42)."""
    q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 1024, 8, 128, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        median_ms(lambda: flashattn.flash_attn_with_kvcache(q, k, k))
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
            sdpa_ms(backend, q, k, k, False, gqa=True)


def sdpa_ms(backend, q, k, v, causal, gqa=False):
    """q (b, s, h, d) etc.; SDPA wants (b, h, s, d): pass transposed views (same memory)."""
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    try:
        with sdpa_kernel(backend):
            fn = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=gqa)
            fn()
            return median_ms(fn)
    except RuntimeError as e:  # backend refused this shape
        print(f"  {backend}: {str(e).splitlines()[0][:80]}", file=sys.stderr)
        return float("nan")


def progress(i, n, label):
    done = int(30 * i / n)
    print(f"\r[{'#' * done}{'-' * (30 - done)}] {i}/{n} {label:<40}", end="", file=sys.stderr, flush=True)


def max_err(ours, q, k, v, causal):
    ref = F.scaled_dot_product_attention(q.transpose(1, 2).float(), k.transpose(1, 2).float(),
                                         v.transpose(1, 2).float(), is_causal=causal)
    return (ours.float() - ref.transpose(1, 2)).abs().max().item()


def bench_prefill(args):
    rows = []
    points = [(d, s, c) for d in args.head_dims for s in args.seqlens for c in args.causal]
    for i, (d, s, causal) in enumerate(points):
        progress(i, len(points), f"prefill d={d} s={s} causal={causal}")
        b, h = TOKENS // s, HIDDEN // d
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        tflops = lambda ms: flops / (ms * 1e-3) / 1e12
        out = flashattn.flash_attn_func(q, k, v, causal=causal)
        err = max_err(out, q, k, v, causal) if s <= 4096 else float("nan")
        ours = median_ms(lambda: flashattn.flash_attn_func(q, k, v, causal=causal))
        flash = sdpa_ms(SDPBackend.FLASH_ATTENTION, q, k, v, causal)
        cudnn = sdpa_ms(SDPBackend.CUDNN_ATTENTION, q, k, v, causal)
        rows.append(dict(kind="prefill", d=d, h=h, b=b, s=s, causal=causal, ours=tflops(ours),
                         flash=tflops(flash), cudnn=tflops(cudnn), ours_ms=ours, max_err=err))
        del q, k, v, out
    progress(len(points), len(points), "done")
    print(file=sys.stderr)
    return rows


def paged_kv(k, v, page, shuffled=True):
    """The contiguous cache k, v (b, ctx, hk, d) as a paged one with pages of `page` rows in
    shuffled order (or, not shuffled, in their own order: the same bytes at the same offsets as
    contiguous): (k_cache, v_cache, block_table)."""
    b, ctx, hk, d = k.shape
    pages = b * ctx // page
    order = torch.randperm(pages, device=k.device) if shuffled else torch.arange(pages, device=k.device)
    block_table = order.view(b, -1).to(torch.int32)
    slots = block_table.flatten().long()
    kc, vc = (torch.empty(pages, page, hk, d, device=k.device, dtype=k.dtype) for _ in range(2))
    kc[slots] = k.reshape(pages, page, hk, d)
    vc[slots] = v.reshape(pages, page, hk, d)
    return kc, vc, block_table


def best_of_rounds(timed, rounds):
    """The lowest of `rounds` medians (ms) of each timing in `timed` (name -> a function that
    returns one median), the timings taking turns round by round. A small decode call
    (~10-20 us) can be host-bound in one timing (the GPU waits for the Python call after
    do_bench's flush: batch-1 points measured 1.3-1.5x slower in some runs, docs/DECISIONS.md D-43);
    taking turns and keeping each call's best median treats every implementation alike."""
    medians = {name: [] for name in timed}
    for _ in range(rounds):
        for name, median in timed.items():
            medians[name].append(median())
    return {name: nan_min(*ms) for name, ms in medians.items()}


def nan_min(*values):
    """The least of values that are not nan (a backend that refused a shape times nan)."""
    return min((x for x in values if not math.isnan(x)), default=math.nan)


def decode_points(args):
    return [(b, c, p) for b in args.batches for c in args.contexts for p in args.page_sizes
            if b * c <= 2 * 1024 * 1024]


def measure_decode_point(b, ctx, page, rounds, check):
    """One decode point's best medians (ms) by call, and its max error against fp32 SDPA (nan
    when not checked)."""
    h, hk, d = DECODE_HEADS, DECODE_KV_HEADS, DECODE_HEAD_DIM
    q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, ctx, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
    kwargs = dict(cache_seqlens=seqlens)
    kc, vc = k, v
    if page:
        kc, vc, kwargs["block_table"] = paged_kv(k, v, page)
    fn = lambda: flashattn.flash_attn_with_kvcache(q, kc, vc, **kwargs)
    out = fn()
    err = float("nan")
    if check and b * ctx <= CHECK_MAX_TOKENS:  # the fp32 reference expands K/V per query head
        ref = F.scaled_dot_product_attention(q.transpose(1, 2).float(), k.transpose(1, 2).float(),
                                             v.transpose(1, 2).float(), enable_gqa=True)
        err = (out.float() - ref.transpose(1, 2)).abs().max().item()
        del ref
    # The same call with a caller workspace (no allocation inside the call).
    ws = flashattn.allocate_workspace(flashattn.plan_kvcache(q, kc, vc, **kwargs), like=q)
    timed = {"ours": lambda: median_ms(fn),
             "ours_ws": lambda: median_ms(lambda: flashattn.flash_attn_with_kvcache(q, kc, vc, workspace=ws, **kwargs))}
    if not page:
        timed["flash"] = lambda: sdpa_ms(SDPBackend.FLASH_ATTENTION, q, k, v, False, gqa=True)
        timed["cudnn"] = lambda: sdpa_ms(SDPBackend.CUDNN_ATTENTION, q, k, v, False, gqa=True)
    medians = best_of_rounds(timed, rounds)
    del q, k, v, kc, vc, out, ws
    torch.cuda.empty_cache()
    return medians, err


def bench_decode(args):
    """The table measured --passes times over, each point's calls keeping their best median of
    all passes: a host or GPU disturbance of a second or so (it has doubled every timing of one
    point, docs/DECISIONS.md D-44) then costs one pass of a point, not its row."""
    points = decode_points(args)
    best, errs = {}, {}
    steps = args.passes * len(points)
    for n in range(args.passes):
        for i, (b, ctx, page) in enumerate(points):
            progress(n * len(points) + i, steps, f"decode pass {n + 1} b={b} ctx={ctx} page={page}")
            medians, err = measure_decode_point(b, ctx, page, args.rounds, check=n == 0)
            prev = best.get((b, ctx, page), {})
            best[(b, ctx, page)] = {name: nan_min(m, prev.get(name, math.nan)) for name, m in medians.items()}
            errs.setdefault((b, ctx, page), err)
    progress(steps, steps, "done")
    print(file=sys.stderr)
    rows = []
    for b, ctx, page in points:
        medians = best[(b, ctx, page)]
        nbytes = 2 * b * ctx * DECODE_KV_HEADS * DECODE_HEAD_DIM * 2  # K and V, bf16
        tbps = lambda ms: nbytes / (ms * 1e-3) / 1e12
        row = dict(kind="decode", b=b, context=ctx, page_size=page, ours_us=medians["ours"] * 1e3,
                   ours_TBps=tbps(medians["ours"]), ours_ws_us=medians["ours_ws"] * 1e3,
                   max_err=errs[(b, ctx, page)])
        if not page:
            row.update(flash_us=medians["flash"] * 1e3, flash_TBps=tbps(medians["flash"]),
                       cudnn_us=medians["cudnn"] * 1e3, cudnn_TBps=tbps(medians["cudnn"]))
        rows.append(row)
    return rows


# ---- FP8 -----------------------------------------------------------------------------------------

E4M3_MAX = 448.0


def quantized(x):
    """x (b, s, heads, d) as float8_e4m3fn with one descale for the tensor (amax / 448), and
    that descale as FlashAttention-3's (b, hk) float32 tensor."""
    descale = (x.abs().amax().float() / E4M3_MAX).clamp(min=1e-12)
    return (x.float() / descale).to(torch.float8_e4m3fn), descale.expand(x.shape[0], x.shape[2]).contiguous()


def dequantized(x8, descale):
    return x8.float() * descale[:, None, :, None].float()


def bench_prefill_fp8(args):
    rows = []
    points = [(d, s, c) for d in args.head_dims for s in args.seqlens for c in args.causal]
    for i, (d, s, causal) in enumerate(points):
        progress(i, len(points), f"prefill-fp8 d={d} s={s} causal={causal}")
        b, h = TOKENS // s, HIDDEN // d
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        (q8, qd), (k8, kd), (v8, vd) = quantized(q), quantized(k), quantized(v)
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        tflops = lambda ms: flops / (ms * 1e-3) / 1e12
        fp8 = lambda: flashattn.flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)
        out = fp8()
        err = (max_err(out, dequantized(q8, qd), dequantized(k8, kd), dequantized(v8, vd), causal)
               if s <= 4096 else float("nan"))
        ours = median_ms(fp8)
        bf16 = median_ms(lambda: flashattn.flash_attn_func(q, k, v, causal=causal))
        rows.append(dict(kind="prefill-fp8", d=d, h=h, b=b, s=s, causal=causal, ours=tflops(ours), ours_ms=ours,
                         bf16=tflops(bf16), bf16_ms=bf16, speedup=bf16 / ours, max_err=err))
        del q, k, v, q8, k8, v8, out
    progress(len(points), len(points), "done")
    print(file=sys.stderr)
    return rows


def bench_decode_fp8(args):
    """Each point's fp8-cache and bf16-cache calls timed in turn (best_of_rounds), the table
    measured --passes times over, as bench_decode."""
    h, hk, d = DECODE_HEADS, DECODE_KV_HEADS, DECODE_HEAD_DIM
    points = decode_points(args)
    best, errs = {}, {}
    steps = args.passes * len(points)
    for n in range(args.passes):
        for i, (b, ctx, page) in enumerate(points):
            progress(n * len(points) + i, steps, f"decode-fp8 pass {n + 1} b={b} ctx={ctx} page={page}")
            q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(b, ctx, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            (k8, kd), (v8, vd) = quantized(k), quantized(v)
            seqlens = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
            kw, kw8 = dict(cache_seqlens=seqlens), dict(cache_seqlens=seqlens, k_descale=kd, v_descale=vd)
            kc, vc, kc8, vc8 = k, v, k8, v8
            if page:
                kc, vc, kw["block_table"] = paged_kv(k, v, page)
                kc8, vc8, kw8["block_table"] = paged_kv(k8.view(torch.uint8), v8.view(torch.uint8), page)
                kc8, vc8 = kc8.view(torch.float8_e4m3fn), vc8.view(torch.float8_e4m3fn)
            fp8 = lambda: flashattn.flash_attn_with_kvcache(q, kc8, vc8, **kw8)
            if n == 0 and b * ctx <= CHECK_MAX_TOKENS:
                ref = F.scaled_dot_product_attention(q.transpose(1, 2).float(), dequantized(k8, kd).transpose(1, 2),
                                                     dequantized(v8, vd).transpose(1, 2), enable_gqa=True)
                errs[(b, ctx, page)] = (fp8().float() - ref.transpose(1, 2)).abs().max().item()
            medians = best_of_rounds({"ours": lambda: median_ms(fp8),
                                      "bf16": lambda: median_ms(lambda: flashattn.flash_attn_with_kvcache(q, kc, vc, **kw))},
                                     args.rounds)
            prev = best.get((b, ctx, page), {})
            best[(b, ctx, page)] = {name: nan_min(m, prev.get(name, math.nan)) for name, m in medians.items()}
            del q, k, v, k8, v8, kc, vc, kc8, vc8
            torch.cuda.empty_cache()
    progress(steps, steps, "done")
    print(file=sys.stderr)
    rows = []
    for b, ctx, page in points:
        m = best[(b, ctx, page)]
        nbytes = 2 * b * ctx * hk * d  # K and V, one byte each
        rows.append(dict(kind="decode-fp8", b=b, context=ctx, page_size=page, ours_us=m["ours"] * 1e3,
                         ours_TBps=nbytes / (m["ours"] * 1e-3) / 1e12, bf16_us=m["bf16"] * 1e3,
                         speedup=m["bf16"] / m["ours"], max_err=errs.get((b, ctx, page), math.nan)))
    return rows


CHUNK_HEADS, CHUNK_KV_HEADS, CHUNK_HEAD_DIM = 32, 8, 128


def chunk_flops(chunk, cached):
    """A causal chunk of `chunk` queries after `cached` keys: query i sees cached + i + 1 keys."""
    keys_seen = chunk * cached + chunk * (chunk + 1) // 2
    return 4 * CHUNK_HEADS * CHUNK_HEAD_DIM * keys_seen


def bench_chunked(args):
    """Chunked prefill (issue 27): one sequence's chunk of query tokens attends causally over
    its cached tokens and itself (flash_attn_with_kvcache, the chunk's keys already in the
    cache), with the cache contiguous and as shuffled pages; each paged time beside the
    contiguous one, the outputs compared bit for bit."""
    points = [(chunk, cached) for chunk in args.chunks for cached in args.cached]
    rows = []
    for i, (chunk, cached) in enumerate(points):
        progress(i, len(points), f"chunk {chunk} over {cached}")
        total = cached + chunk
        q = torch.randn(1, chunk, CHUNK_HEADS, CHUNK_HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, total, CHUNK_KV_HEADS, CHUNK_HEAD_DIM, device="cuda", dtype=torch.bfloat16)
                for _ in range(2))
        seqlens = torch.tensor([total], device="cuda", dtype=torch.int32)
        options = lambda bt: dict(cache_seqlens=seqlens, block_table=bt, causal=True)
        call = lambda kc, vc, bt=None: flashattn.flash_attn_with_kvcache(q, kc, vc, **options(bt))
        kernel = lambda kc, vc, bt=None: flashattn.plan_kvcache(q, kc, vc, **options(bt)).kernel  # the one call runs
        tflops = lambda ms: chunk_flops(chunk, cached) / (ms * 1e-3) / 1e12
        contiguous = call(k, v)
        ms = median_ms(lambda: call(k, v))
        row = dict(kind="chunked", chunk=chunk, cached=cached, contiguous_TFLOPs=tflops(ms),
                   contiguous_kernel=kernel(k, v))
        for page in args.chunk_pages:
            rows_padded = -(-total // page) * page  # whole pages
            pad = torch.zeros(1, rows_padded - total, CHUNK_KV_HEADS, CHUNK_HEAD_DIM, device="cuda",
                              dtype=torch.bfloat16)
            kc, vc, bt = paged_kv(torch.cat([k, pad], 1), torch.cat([v, pad], 1), page)
            paged_ms = median_ms(lambda: call(kc, vc, bt))
            row[f"page{page}_TFLOPs"] = tflops(paged_ms)
            row[f"page{page}_kernel"] = kernel(kc, vc, bt)
            row[f"page{page}_vs_contiguous"] = ms / paged_ms
            row[f"page{page}_same_output"] = bool(torch.equal(call(kc, vc, bt), contiguous))
            del kc, vc, bt
        rows.append(row)
        del q, k, v
        torch.cuda.empty_cache()
    progress(len(points), len(points), "done")
    print(file=sys.stderr)
    return rows


def print_table(rows):
    if not rows:
        return
    if rows[0]["kind"] in ("chunked", "prefill-fp8", "decode-fp8"):
        for r in rows:
            print("  ".join(f"{key}={value:.3f}" if isinstance(value, float) else f"{key}={value}"
                            for key, value in r.items()))
        return
    if rows[0]["kind"] == "prefill":
        print(f"{'d':>4} {'seqlen':>6} {'causal':>6} | {'ours':>7} {'flash':>7} {'cudnn':>7} | {'/flash':>6} {'/cudnn':>6}  TFLOP/s")
        for r in rows:
            print(f"{r['d']:>4} {r['s']:>6} {str(r['causal']):>6} | {r['ours']:7.1f} {r['flash']:7.1f} {r['cudnn']:7.1f} |"
                  f" {r['ours'] / r['flash']:6.2f} {r['ours'] / r['cudnn']:6.2f}")
    else:
        print(f"{'batch':>5} {'ctx':>6} {'page':>4} | {'ours us':>8} {'TB/s':>5} {'ws us':>7} | {'flash us':>8} {'TB/s':>5} | {'cudnn us':>8} {'TB/s':>5}")
        for r in rows:
            extra = (f" {r['flash_us']:8.1f} {r['flash_TBps']:5.2f} | {r['cudnn_us']:8.1f} {r['cudnn_TBps']:5.2f}"
                     if "flash_us" in r else "")
            print(f"{r['b']:>5} {r['context']:>6} {r['page_size']:>4} | {r['ours_us']:8.1f} {r['ours_TBps']:5.2f} {r['ours_ws_us']:7.1f} |{extra}")


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    if rows[0]["kind"] == "prefill":
        combos = sorted({(r["d"], r["causal"]) for r in rows})
        fig, axes = plt.subplots(1, len(combos), figsize=(4 * len(combos), 3.5), squeeze=False)
        for ax, (d, causal) in zip(axes[0], combos):
            sel = [r for r in rows if r["d"] == d and r["causal"] == causal]
            xs = [r["s"] for r in sel]
            for key in ("ours", "flash", "cudnn"):
                ax.plot(xs, [r[key] for r in sel], marker="o", label=key)
            ax.set_xscale("log", base=2)
            ax.set_title(f"d={d} {'causal' if causal else 'non-causal'}")
            ax.set_xlabel("seqlen")
            ax.set_ylabel("TFLOP/s")
        axes[0][0].legend()
    else:
        fig, ax = plt.subplots(figsize=(8, 4))
        labels = [f"b{r['b']}/{r['context'] // 1024}k/p{r['page_size']}" for r in rows]
        ax.plot(labels, [r["ours_TBps"] for r in rows], marker="o", label="ours")
        ax.plot(labels, [r.get("flash_TBps", math.nan) for r in rows], marker="o", label="flash")
        ax.plot(labels, [r.get("cudnn_TBps", math.nan) for r in rows], marker="o", label="cudnn")
        ax.set_ylabel("K+V TB/s")
        ax.tick_params(axis="x", rotation=90, labelsize=6)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_fp8(rows, path):
    """FP8 over bf16 (our calls) per point."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4))
    if rows[0]["kind"] == "prefill-fp8":
        labels = [f"d{r['d']}/{r['s']}/{'c' if r['causal'] else 'n'}" for r in rows]
    else:
        labels = [f"b{r['b']}/{r['context'] // 1024}k/p{r['page_size']}" for r in rows]
    ax.plot(labels, [r["speedup"] for r in rows], marker="o", label="fp8 / bf16 (ours)")
    ax.axhline(1.0, color="gray", lw=0.5)
    ax.set_ylabel("speedup over our bf16")
    ax.tick_params(axis="x", rotation=90, labelsize=6)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=["prefill", "decode", "chunked", "prefill-fp8", "decode-fp8"])
    ap.add_argument("--head-dims", type=lambda s: [int(x) for x in s.split(",")], default=[64, 128, 256])
    ap.add_argument("--seqlens", type=lambda s: [int(x) for x in s.split(",")],
                    default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--causal", type=lambda s: {"both": (False, True), "yes": (True,), "no": (False,)}[s],
                    default=(False, True), help="prefill: both (default), yes or no")
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 128])
    ap.add_argument("--contexts", type=lambda s: [int(x) for x in s.split(",")], default=[1024, 4096, 16384, 65536])
    ap.add_argument("--page-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[0, 16, 1])
    ap.add_argument("--rounds", type=int, default=3,
                    help="decode: each call timed this many times in turn, its best median kept")
    ap.add_argument("--passes", type=int, default=2,
                    help="decode: the whole table measured this many times over, each call's best median kept")
    ap.add_argument("--chunks", type=lambda s: [int(x) for x in s.split(",")], default=[512, 2048],
                    help="chunked: query tokens per chunk")
    ap.add_argument("--cached", type=lambda s: [int(x) for x in s.split(",")], default=[8192, 32768],
                    help="chunked: tokens already in the cache")
    ap.add_argument("--chunk-pages", type=lambda s: [int(x) for x in s.split(",")], default=[16, 256],
                    help="chunked: page sizes")
    ap.add_argument("--out", help="JSON file for the raw records")
    ap.add_argument("--plot", help="PNG file")
    args = ap.parse_args()
    warm_up_gpu()
    warm_up_timing()
    rows = {"prefill": bench_prefill, "decode": bench_decode, "chunked": bench_chunked,
            "prefill-fp8": bench_prefill_fp8, "decode-fp8": bench_decode_fp8}[args.kind](args)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                cudnn=torch.backends.cudnn.version(), rows=rows)
    if args.kind in ("decode", "decode-fp8"):
        meta.update(rounds=args.rounds, passes=args.passes)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(meta, f, indent=1)
    if args.plot and args.kind in ("prefill-fp8", "decode-fp8"):
        plot_fp8(rows, args.plot)
    elif args.plot and args.kind != "chunked":
        plot(rows, args.plot)
    print_table(rows)


if __name__ == "__main__":
    main()
