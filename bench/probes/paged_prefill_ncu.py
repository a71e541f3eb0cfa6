"""One chunked-prefill call for Nsight Compute (issue 27: where paged time goes): chunk 512 over
8192 cached keys, 32/8 heads, d 128, causal, bf16, as bench.py chunked times it; the cache
contiguous or in pages of the given size taken in order (the same bytes at the same addresses as
contiguous, bench.py paged_kv shuffled=False). The call runs twice; profile the second:

    ncu --kernel-name regex:warpspec --launch-skip 1 --launch-count 1 --section SpeedOfLight \\
        --section WarpStateStats --section InstructionStats python3 bench/probes/paged_prefill_ncu.py 256
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import flashattn  # noqa: E402
from bench import CHUNK_HEAD_DIM, CHUNK_HEADS, CHUNK_KV_HEADS, paged_kv  # noqa: E402


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "contiguous"  # contiguous, or a page size
    chunk, cached = 512, 8192
    total = cached + chunk
    rows = -(-total // 256) * 256  # whole pages of every size up to 256
    q = torch.randn(1, chunk, CHUNK_HEADS, CHUNK_HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, rows, CHUNK_KV_HEADS, CHUNK_HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    seqlens = torch.tensor([total], device="cuda", dtype=torch.int32)
    kc, vc, table = (k, v, None) if mode == "contiguous" else paged_kv(k, v, int(mode), shuffled=False)
    for _ in range(2):
        flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table, causal=True)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
