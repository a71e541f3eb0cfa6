#!/usr/bin/env python3
"""Writes docs/PERFORMANCE.md from the benchmark records in bench/results/*.json (written by
bench/bench.py), and the performance summary of README.md between its perf-summary markers.

    python3 scripts/make_performance_doc.py            # both files
    python3 scripts/make_performance_doc.py --check    # exit 1 if either is out of date

Records of kind "prefill" and "decode" get their own tables; any other file (or kind) gets a
generic table of its rows' fields, so a new benchmark shows up without a change here.
Ratios are speedups: the other implementation's time over ours (> 1: ours is faster).
"""
import argparse
import json
import math
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "PERFORMANCE.md"
README = ROOT / "README.md"
SUMMARY_BEGIN = "<!-- perf-summary:begin (scripts/make_performance_doc.py) -->"
SUMMARY_END = "<!-- perf-summary:end -->"
# The README's summary rows: prefill (d, seqlen, causal) and decode (batch, context).
SUMMARY_PREFILL = [(64, 4096, False), (128, 16384, False), (128, 16384, True), (256, 16384, False), (256, 512, True)]
SUMMARY_DECODE = [(1, 16384), (8, 16384), (32, 4096), (128, 1024), (128, 16384)]
SUMMARY_FILES = {"prefill": "prefill-h200.json", "decode": "decode-h200.json"}

METHOD = """\
## Method

Every table comes from `bench/bench.py` on one GPU: flashattn, PyTorch SDPA with the
FLASH_ATTENTION backend (FlashAttention-2, "FA2") and SDPA with the CUDNN_ATTENTION backend, side
by side in one process on identical inputs (bf16). Each call is timed eagerly, host path included,
by `triton.testing.do_bench` (25 warm-up and 100 timed repetitions, median), which flushes the L2
before every call by writing zeros over 256 MB. Before the first timing the GPU is kept busy for a
second and each implementation makes one throwaway timed decode call (the first timing of a
process measured up to 2× slow; docs/DECISIONS.md D-42).

Prefill follows the FlashAttention-2 benchmark grid: 16,384 tokens per batch (batch = 16384 /
seqlen), hidden 2048 (heads = 2048 / d), q, k and v of the same length. Work is counted, not
measured: FLOPs = 4 · batch · heads · seqlen² · d, halved under a causal mask; the tables give
TFLOP/s.

Decode is one query token per sequence over a KV cache: 32 query heads, 8 KV heads, d = 128,
every sequence `context` keys long. Bytes = the K and V the call must read,
2 · batch · context · 8 · 128 · 2 bytes; the tables give µs and TB/s of those bytes. The paged
columns run the same cache as pages of 16 and of 1 rows in shuffled order (SDPA has no paged
form). A decode point's calls are timed in turn over several rounds and the whole table over
several passes, each call keeping its best median (D-43, D-44). "ws" is our call with a
caller-supplied workspace (no allocation in the call).

Every output is checked against an fp32 SDPA reference in the same run (`max_err`: prefill up to
seqlen 4096, decode up to 256k tokens). The plots beside the records show the same numbers.
Reproduce on a GPU with the CUDA build of the Python package and torch:

```sh
python3 bench/bench.py prefill --out bench/results/prefill-h200.json --plot bench/results/prefill-h200.png
python3 bench/bench.py decode  --out bench/results/decode-h200.json  --plot bench/results/decode-h200.png
python3 scripts/make_performance_doc.py
```
"""


def fmt(x, digits=1):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def ratio(theirs, ours):
    if theirs is None or ours is None or any(math.isnan(v) for v in (theirs, ours)) or ours == 0:
        return math.nan
    return theirs / ours


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def context_label(n):
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def finite(values):
    return [v for v in values if not math.isnan(v)]


# ---- prefill ------------------------------------------------------------------------------

def prefill_speedups(rows):
    """(d, s, causal) -> (ours/FA2, ours/cuDNN) as throughput ratios (= their time / ours)."""
    return {(r["d"], r["s"], r["causal"]): (ratio(r["ours"], r["flash"]), ratio(r["ours"], r["cudnn"])) for r in rows}


def prefill_summary(rows):
    speed = prefill_speedups(rows)
    fa2 = finite([v[0] for v in speed.values()])
    cudnn = finite([v[1] for v in speed.values()])
    if not fa2:
        return "No FA2 comparison in this run."
    worst = min(speed, key=lambda k: speed[k][0] if not math.isnan(speed[k][0]) else math.inf)
    d, s, causal = worst
    text = (f"Over the {len(rows)} points: median {statistics.median(fa2):.2f}× FA2, every point "
            f"≥ {min(fa2):.2f}× (the lowest: d = {d}, seqlen {s}{', causal' if causal else ''})")
    if cudnn:
        text += f"; {min(cudnn):.2f}–{max(cudnn):.2f}× cuDNN"
    return text + "."


def prefill_section(rows):
    out = ["TFLOP/s; ratios are ours over theirs (> 1: ours is faster).", ""]
    body = []
    for r in sorted(rows, key=lambda r: (r["d"], r["causal"], r["s"])):
        body.append([str(r["d"]), str(r["s"]), fmt(r["causal"]), fmt(r["ours"]), fmt(r.get("flash")),
                     fmt(r.get("cudnn")), fmt(ratio(r["ours"], r.get("flash", math.nan)), 2),
                     fmt(ratio(r["ours"], r.get("cudnn", math.nan)), 2), fmt(r.get("max_err"), 4)])
    out += table(["d", "seqlen", "causal", "flashattn", "FA2", "cuDNN", "vs FA2", "vs cuDNN", "max_err"], body)
    out += ["", prefill_summary(rows)]
    return out


# ---- decode -------------------------------------------------------------------------------

def decode_points(rows):
    """(batch, context) -> {page_size: row}, in the records' order."""
    points = {}
    for r in rows:
        points.setdefault((r["b"], r["context"]), {})[r["page_size"]] = r
    return points


def decode_summary(rows):
    points = decode_points(rows)
    fa2, cudnn, paged = [], [], {}
    for pages in points.values():
        base = pages.get(0)
        if not base:
            continue
        fa2.append(ratio(base.get("flash_us", math.nan), base["ours_us"]))
        cudnn.append(ratio(base.get("cudnn_us", math.nan), base["ours_us"]))
        for page, r in pages.items():
            if page:
                paged.setdefault(page, []).append(r["ours_us"] / base["ours_us"] - 1)
    fa2, cudnn = finite(fa2), finite(cudnn)
    parts = [f"Over the {len(points)} points (contiguous K/V)"]
    if fa2:
        parts.append(f"{min(fa2):.2f}–{max(fa2):.2f}× FA2's speed")
    if cudnn:
        parts.append(f"{min(cudnn):.3f}–{max(cudnn):.3f}× cuDNN's")
    text = ": ".join([parts[0], ", ".join(parts[1:])]) if len(parts) > 1 else parts[0]
    if paged:
        text += "; paged time against contiguous: " + ", ".join(
            f"page {page} {100 * min(extra):+.1f}% to {100 * max(extra):+.1f}%"
            for page, extra in sorted(paged.items(), reverse=True))
    return text + "."


def decode_section(rows):
    points = decode_points(rows)
    pages = sorted({p for v in points.values() for p in v if p}, reverse=True)
    out = ["µs per call and TB/s of K+V read; \"vs\" columns are their time over ours (> 1: ours is faster).", ""]
    header = ["batch × context", "flashattn µs", "TB/s", "ws µs", "FA2 TB/s", "cuDNN TB/s", "vs FA2", "vs cuDNN"]
    header += [f"page {p} TB/s" for p in pages]
    body = []
    for (b, ctx), by_page in points.items():
        base = by_page.get(0, {})
        ours = base.get("ours_us", math.nan)
        row = [f"{b} × {context_label(ctx)}", fmt(ours), fmt(base.get("ours_TBps"), 2), fmt(base.get("ours_ws_us")),
               fmt(base.get("flash_TBps"), 2), fmt(base.get("cudnn_TBps"), 2),
               fmt(ratio(base.get("flash_us", math.nan), ours), 2), fmt(ratio(base.get("cudnn_us", math.nan), ours), 3)]
        row += [fmt(by_page[p]["ours_TBps"], 2) if p in by_page else "–" for p in pages]
        body.append(row)
    out += table(header, body)
    out += ["", decode_summary(rows)]
    return out


# ---- FP8 (bench.py prefill-fp8, decode-fp8): each point against our bf16 figure ----------------

def fp8_summary(rows):
    speed = finite([r.get("speedup", math.nan) for r in rows])
    if not speed:
        return "No bf16 comparison in this run."
    return (f"Over the {len(rows)} points: FP8 over bf16 median {statistics.median(speed):.2f}×, "
            f"from {min(speed):.2f}× to {max(speed):.2f}×.")


def fp8_ranges(groups):
    """(label, rows) -> table rows: the speedup's min, median and max, and its range where the
    issue sets its bar (prefill seqlen >= 4k, decode batch x context >= 128k tokens)."""
    body = []
    for label, rows, at_bar in groups:
        speed = finite([r["speedup"] for r in rows])
        bar = finite([r["speedup"] for r in at_bar])
        body.append([label, str(len(rows)), fmt(min(speed), 2), fmt(statistics.median(speed), 2), fmt(max(speed), 2),
                     f"{fmt(min(bar), 2)}–{fmt(max(bar), 2)}" if bar else "–"])
    return body


def prefill_fp8_section(rows):
    out = ["Our FP8 call over our bf16 call on the same points (TFLOP/s counted as for bf16; > 1: FP8 is",
           "faster), per head dim over the FA2 grid; every point is in the JSON and the plot.", ""]
    groups = [(f"d {d}", [r for r in rows if r["d"] == d], [r for r in rows if r["d"] == d and r["s"] >= 4096])
              for d in sorted({r["d"] for r in rows})]
    out += table(["head dim", "points", "min", "median", "max", "seqlen ≥ 4k"], fp8_ranges(groups))
    return out + ["", fp8_summary(rows)]


def decode_fp8_section(rows):
    out = ["An e4m3 cache against a bf16 one, our calls on the same points (one query token, 32 heads,",
           "8 KV heads, d 128; bf16 time over FP8 time, > 1: FP8 is faster); every point is in the JSON.", ""]
    layouts = sorted({r["page_size"] for r in rows})
    groups = [("contiguous" if not page else f"page {page}", [r for r in rows if r["page_size"] == page],
               [r for r in rows if r["page_size"] == page and r["b"] * r["context"] >= 128 * 1024]) for page in layouts]
    out += table(["cache", "points", "min", "median", "max", "≥ 128k tokens"], fp8_ranges(groups))
    return out + ["", fp8_summary(rows)]


def fp8_error_section(rows):
    out = ["Error against float64 attention of the full-precision (fp32) inputs, relative to max|ref|",
           "(max) and as RMS error over RMS ref (rms): our bf16 call and our FP8 call (`bench/fp8_error.py`).", ""]
    body = [[r["call"], str(r["d"]), str(r["s"]), fmt(r["causal"]), fmt(r["bf16_max_rel"], 4), fmt(r["bf16_rms_rel"], 4),
             fmt(r["fp8_max_rel"], 4), fmt(r["fp8_rms_rel"], 4)] for r in rows]
    return out + table(["call", "d", "keys", "causal", "bf16 max", "bf16 rms", "FP8 max", "FP8 rms"], body)


# ---- anything else ------------------------------------------------------------------------

def generic_section(rows):
    columns = []
    for r in rows:
        for key, value in r.items():
            if key not in columns and not isinstance(value, (dict, list)):
                columns.append(key)
    body = [[fmt(r.get(c), 3) if isinstance(r.get(c), float) else fmt(r.get(c)) for c in columns] for r in rows]
    return ["Fields as recorded.", ""] + table(columns, body)


# ---- the CPU backend (bench/cpu_bench.py) ----------------------------------------------------------

def cpu_section(rows):
    prefill = [r for r in rows if r["kind"] == "cpu_prefill"]
    decode = [r for r in rows if r["kind"] == "cpu_decode"]
    out = ["Side by side with PyTorch's CPU `scaled_dot_product_attention` on the same threads, best of",
           "`repeat` alternating calls; decode against the bandwidth a plain `numpy.sum` shows over the",
           "same bytes (issue 30's bars: 1.0x torch for prefill, 0.7 of numpy.sum for decode).", ""]
    out += table(["dtype", "b, s, h/hk, d", "causal", "flashattn GFLOP/s", "torch GFLOP/s", "ratio"],
                 [[r["dtype"], f"{r['batch']}, {r['seqlen']}, {r['heads']}/{r['kv_heads']}, {r['head_dim']}",
                   "yes" if r["causal"] else "no", fmt(r["ours_gflops"]), fmt(r.get("torch_gflops")),
                   fmt(r.get("ratio"), 2)] for r in prefill])
    out += [""] + table(["decode (bf16 cache unless named, 32/8 heads, d 128)", "flashattn GB/s", "torch GB/s",
                         "numpy.sum GB/s", "of numpy.sum", "FP8 over our bf16"],
                        [[f"b {r['batch']}, {context_label(r['context'])}, " +
                          ("contiguous" if not r["page_size"] else f"page {r['page_size']}") +
                          ("" if r.get("dtype", "bf16") == "bf16" else f", {r['dtype']} cache"),
                          fmt(r["ours_gbs"]), fmt(r.get("torch_gbs")), fmt(r["numpy_sum_gbs"]),
                          fmt(r["fraction_of_floor"], 2), fmt(r.get("speedup"), 2)] for r in decode])
    if any("speedup" in r for r in decode):
        out += ["", "An e4m3 cache's GB/s and floor count its one byte per element; \"FP8 over our bf16\" is our",
                "bf16-cache call's time over the FP8 call's on the same values, timed in turns."]
    return out


SECTIONS = {"prefill": ("Prefill", prefill_section), "decode": ("Decode", decode_section),
            "prefill-fp8": ("FP8 prefill", prefill_fp8_section), "decode-fp8": ("FP8 KV-cache decode", decode_fp8_section),
            "fp8-error": ("FP8 quantization error", fp8_error_section)}


def file_order(path):
    """Prefill files first, then decode, then any other, by name within each, FP8 after bf16."""
    rank = 0 if path.name.startswith("prefill") else 1 if path.name.startswith("decode") else 2
    return rank, "fp8" in path.name, path.name


def load_results():
    results = []
    for path in sorted(RESULTS.glob("*.json"), key=file_order):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            print(f"skipped {path.name}: {e}", file=sys.stderr)
            continue
        rows = data.get("rows", []) if isinstance(data, dict) else data if isinstance(data, list) else []
        if isinstance(data, dict) and not rows:  # bench/cpu_bench.py: prefill and decode lists
            rows = [dict(r, kind="cpu_" + part) for part in ("prefill", "decode") for r in data.get(part, [])]
        rows = [r for r in rows if isinstance(r, dict)]
        meta = data if isinstance(data, dict) else {}
        results.append((path, meta, rows))
    return results


def file_section(path, meta, rows):
    kinds = {r.get("kind") for r in rows}
    cpu = bool(rows) and kinds <= {"cpu_prefill", "cpu_decode"}
    kind = kinds.pop() if len(kinds) == 1 else None
    title, make = SECTIONS.get(kind, (path.stem, generic_section))
    if cpu:
        title, make = f"CPU backend ({meta.get('cpu', 'CPU')}, {meta.get('threads', '?')} threads)", cpu_section
    out = [f"## {title}: `{path.name}`", ""]
    facts = [f"{name} {meta[key]}" for key, name in (("torch", "torch"), ("torch_cpu_capability", "torch CPU capability"),
                                                      ("cudnn", "cuDNN"), ("rounds", "rounds"),
                                                      ("passes", "passes")) if meta.get(key) is not None]
    if meta.get("kernel_override", "automatic") != "automatic":  # bench/cpu_bench.py under a cap
        facts.append(f"FLASHATTN_KERNEL={meta['kernel_override']}")
    if "device" in meta or facts:
        out += [f"Recorded on {meta.get('device', 'an unnamed device')}" + (f" ({', '.join(facts)})" if facts else "") + ".", ""]
    if isinstance(meta.get("note"), str):
        out += ["Note: " + meta["note"] + ".", ""]
    plot = path.with_suffix(".png")
    if plot.exists():
        out += [f"![{path.stem}](../bench/results/{plot.name})", ""]
    if not rows:
        return out + ["(no rows)", ""]
    try:
        return out + make(rows) + [""]
    except (KeyError, TypeError, ZeroDivisionError) as e:  # a record of another shape
        print(f"{path.name}: generic table ({type(e).__name__}: {e})", file=sys.stderr)
        return out + generic_section(rows) + [""]


def performance_doc(results):
    out = ["# Performance", "",
           "Current results only, generated by `scripts/make_performance_doc.py` from `bench/results/*.json`",
           "(do not edit by hand). Each measured choice in the code is in docs/DECISIONS.md.", "", METHOD]
    for path, meta, rows in results:
        out += file_section(path, meta, rows)
    return "\n".join(out).rstrip() + "\n"


def readme_summary(results):
    by_kind = {}
    for path, meta, rows in results:
        for kind, name in SUMMARY_FILES.items():
            if path.name == name:
                by_kind[kind] = [r for r in rows if r.get("kind") == kind]
    out = []
    prefill = by_kind.get("prefill", [])
    if prefill:
        found = {(r["d"], r["s"], r["causal"]): r for r in prefill}
        out += ["Prefill, bf16, FlashAttention-2's grid (16k tokens, hidden 2048), TFLOP/s:", ""]
        body = [[str(d), str(s), fmt(c), fmt(found[(d, s, c)]["ours"]), fmt(found[(d, s, c)]["flash"]),
                 fmt(found[(d, s, c)]["cudnn"]), fmt(ratio(found[(d, s, c)]["ours"], found[(d, s, c)]["flash"]), 2)]
                for d, s, c in SUMMARY_PREFILL if (d, s, c) in found]
        out += table(["d", "seqlen", "causal", "flashattn", "FlashAttention-2", "cuDNN", "vs FA2"], body)
        out += ["", prefill_summary(prefill), ""]
    decode = by_kind.get("decode", [])
    if decode:
        points = decode_points(decode)
        out += ["Decode, bf16, one query token, 32 heads, 8 KV heads, d 128; TB/s of K+V read:", ""]
        body = []
        for b, ctx in SUMMARY_DECODE:
            pages = points.get((b, ctx))
            if not pages or 0 not in pages:
                continue
            base = pages[0]
            body.append([f"{b} × {context_label(ctx)}", fmt(base["ours_TBps"], 2),
                         fmt(pages[16]["ours_TBps"], 2) if 16 in pages else "–",
                         fmt(base.get("flash_TBps"), 2), fmt(base.get("cudnn_TBps"), 2)])
        out += table(["batch × context", "flashattn", "page 16", "FlashAttention-2", "cuDNN"], body)
        out += ["", decode_summary(decode)]
    return "\n".join(out).rstrip()


def updated_readme(text, summary):
    if SUMMARY_BEGIN not in text or SUMMARY_END not in text:
        return None
    head, rest = text.split(SUMMARY_BEGIN, 1)
    _, tail = rest.split(SUMMARY_END, 1)
    return head + SUMMARY_BEGIN + "\n" + summary + "\n" + SUMMARY_END + tail


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if a generated file is out of date")
    args = ap.parse_args()
    results = load_results()
    outputs = {DOC: performance_doc(results)}
    readme = updated_readme(README.read_text(), readme_summary(results)) if README.exists() else None
    if readme is not None:
        outputs[README] = readme
    stale = [path for path, text in outputs.items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"out of date: {path.relative_to(ROOT)}", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(outputs[path])
        print(f"wrote {path.relative_to(ROOT)} ({outputs[path].count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
