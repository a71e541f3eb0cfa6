"""Our prefill at chosen points of the FA2 grid, bf16 and FP8 (issues 27 and 29): for timing
library variants against each other (device_check.sh prefix_ab runs it once per carried
library), without the SDPA calls of bench.py prefill.

    python3 bench/probes/prefill_points.py --points 128x4096,128x16384,128x2048c --dtypes bf16,e4m3

A point is DxS (head dim x seqlen; a trailing "c" is causal), shaped as bench.py prefill: 16,384
tokens (batch = 16384 / S), hidden 2048 (heads = 2048 / D). e4m3 is bench.py prefill-fp8's call
(q, k and v quantized per tensor, descales given). Prints the best of two rounds of medians,
TFLOP/s counted as bench.py does, and for S <= 2048 the max error against fp32 SDPA on the
inputs the call saw (dequantized for e4m3): a wrong variant shows there, not only in its time."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import flashattn  # noqa: E402
from bench import HIDDEN, TOKENS, best_of_rounds, dequantized, max_err, median_ms, quantized  # noqa: E402

CHECK_MAX_SEQLEN = 2048


def parse_point(text):
    causal = text.endswith("c")
    d, s = (int(x) for x in text.rstrip("c").split("x"))
    return d, s, causal


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default="128x512c,128x2048c,128x4096,128x16384,128x16384c,256x8192")
    ap.add_argument("--dtypes", default="bf16,e4m3")
    a = ap.parse_args()
    for d, s, causal in map(parse_point, a.points.split(",")):
        b, h = TOKENS // s, HIDDEN // d
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        (q8, qd), (k8, kd), (v8, vd) = quantized(q), quantized(k), quantized(v)
        calls = {
            "bf16": lambda: flashattn.flash_attn_func(q, k, v, causal=causal),
            "e4m3": lambda: flashattn.flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd,
                                                      v_descale=vd),
        }
        inputs = {"bf16": (q, k, v), "e4m3": (dequantized(q8, qd), dequantized(k8, kd), dequantized(v8, vd))}
        dtypes = a.dtypes.split(",")
        best = best_of_rounds({t: (lambda t=t: median_ms(calls[t])) for t in dtypes}, 2)
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        for t in dtypes:
            err = max_err(calls[t](), *inputs[t], causal) if s <= CHECK_MAX_SEQLEN else float("nan")
            print(f"d {d:3d}  {b:2d} x {s:5d}  {'causal' if causal else 'full  '}  {t:4s}  {best[t] * 1e3:9.1f} us"
                  f"  {flops / (best[t] * 1e-3) / 1e12:6.1f} TFLOP/s  max_err {err:.4f}", flush=True)
        del q, k, v, q8, k8, v8, inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
