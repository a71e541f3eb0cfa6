"""Chunked prefill over a paged cache: where paged time goes (issue 27).

    python3 bench/probes/paged_prefill_probe.py --points 512x8192,2048x32768 --pages 16,64,256

Times bench.py chunked's call (one sequence, 32/8 heads, d 128, causal, bf16) with the cache
contiguous and in pages of each size, the pages in shuffled order ("random", as the benchmark)
and in order ("ordered": page i of the table is page i of the cache, the same bytes at the same
addresses as contiguous). Ordered against contiguous is the cost of loading by pages; random
against ordered is the cost of where the pages lie. Best of two rounds of medians, each call
taking turns; the outputs are compared with contiguous bit for bit."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import flashattn  # noqa: E402
from bench import (CHUNK_HEAD_DIM, CHUNK_HEADS, CHUNK_KV_HEADS, best_of_rounds, chunk_flops,  # noqa: E402
                   median_ms, paged_kv)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default="512x8192,512x32768,2048x8192,2048x32768")
    ap.add_argument("--pages", default="16,64,256")
    a = ap.parse_args()
    for point in a.points.split(","):
        chunk, cached = (int(x) for x in point.split("x"))
        total = cached + chunk
        rows = -(-total // 256) * 256  # whole pages of every size probed
        q = torch.randn(1, chunk, CHUNK_HEADS, CHUNK_HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, rows, CHUNK_KV_HEADS, CHUNK_HEAD_DIM, device="cuda", dtype=torch.bfloat16)
                for _ in range(2))
        seqlens = torch.tensor([total], device="cuda", dtype=torch.int32)
        call = lambda kc, vc, bt=None: flashattn.flash_attn_with_kvcache(
            q, kc, vc, cache_seqlens=seqlens, block_table=bt, causal=True)
        caches = {"contiguous": (k, v, None)}
        for page in (int(x) for x in a.pages.split(",")):
            caches[f"page {page} random"] = paged_kv(k, v, page)
            caches[f"page {page} ordered"] = paged_kv(k, v, page, shuffled=False)
        reference = call(k, v)
        timed = {name: (lambda c=c: median_ms(lambda: call(*c))) for name, c in caches.items()}
        best = best_of_rounds(timed, 2)
        flops = chunk_flops(chunk, cached)
        for name, ms in best.items():
            same = torch.equal(call(*caches[name]), reference)
            print(f"chunk {chunk:5d} over {cached:6d}  {name:18s} {ms * 1e3:8.1f} us  "
                  f"{flops / (ms * 1e-3) / 1e12:6.1f} TFLOP/s  vs contiguous {best['contiguous'] / ms:.3f}"
                  f"  same output: {same}", flush=True)
        del q, k, v, caches
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
