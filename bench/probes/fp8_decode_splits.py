"""FP8-cache decode at forced split counts against the heuristic's, with the bf16 cache's
automatic choice beside it (issue 29): which split count each point would want.

    python3 bench/probes/fp8_decode_splits.py --points 128x1024,32x4096 --splits 0,1,2,3,4

Prints, per point, the plan (kernel, splits) and the best of two rounds of medians (us) of each
split count; pages of --page-size rows where given. Shapes as bench.py decode-fp8 (32/8 heads,
d 128, bf16 q, every sequence full)."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import flashattn  # noqa: E402
from bench import best_of_rounds, median_ms, paged_kv, quantized  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default="1x1024,1x4096,8x16384,32x4096,128x1024,128x4096")
    ap.add_argument("--splits", default="0,1,2,3,4")
    ap.add_argument("--page-size", type=int, default=0)
    a = ap.parse_args()
    h, hk, d = 32, 8, 128
    for point in a.points.split(","):
        b, ctx = (int(x) for x in point.split("x"))
        q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, ctx, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        (k8, kd), (v8, vd) = quantized(k), quantized(v)
        seqlens = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
        kw, kw8 = dict(cache_seqlens=seqlens), dict(cache_seqlens=seqlens, k_descale=kd, v_descale=vd)
        if a.page_size:
            k, v, kw["block_table"] = paged_kv(k, v, a.page_size)
            k8, v8, kw8["block_table"] = paged_kv(k8.view(torch.uint8), v8.view(torch.uint8), a.page_size)
            k8, v8 = k8.view(torch.float8_e4m3fn), v8.view(torch.float8_e4m3fn)
        timed = {"bf16": lambda: median_ms(lambda: flashattn.flash_attn_with_kvcache(q, k, v, **kw))}
        plans = {"bf16": flashattn.plan_kvcache(q, k, v, **kw)}
        for s in (int(x) for x in a.splits.split(",")):
            timed[f"fp8 s={s}"] = (lambda s=s: median_ms(
                lambda: flashattn.flash_attn_with_kvcache(q, k8, v8, num_splits=s, **kw8)))
            plans[f"fp8 s={s}"] = flashattn.plan_kvcache(q, k8, v8, num_splits=s, **kw8)
        best = best_of_rounds(timed, 2)
        for name, ms in best.items():
            p = plans[name]
            print(f"{b:4d} x {ctx:6d} page {a.page_size:3d}  {name:9s} {ms * 1e3:8.1f} us  "
                  f"{p.kernel} splits={p.num_splits}  bf16/this={best['bf16'] / ms:.2f}", flush=True)
        del q, k, v, k8, v8
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
