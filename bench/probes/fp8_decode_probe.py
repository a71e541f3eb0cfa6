"""One decode call over an e4m3 cache and its bf16 twin, for Nsight Compute (issue 29, D-66).

    ncu --profile-from-start off -k regex:splitkeys python3 bench/probes/fp8_decode_probe.py --batch 32 --context 4096
profiles one call of each after a warm-up (cudaProfilerStart/Stop around them)."""
import argparse

import torch

import flashattn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page-size", type=int, default=0)
    a = ap.parse_args()
    b, s, h, hk, d = a.batch, a.context, a.heads, a.kv_heads, a.head_dim
    q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.full((b,), s, dtype=torch.int32, device="cuda")
    calls = {}
    for name, dtype in (("e4m3", torch.float8_e4m3fn), ("bf16", torch.bfloat16)):
        kw = {}
        if a.page_size:
            pages = b * s // a.page_size
            shape = (pages, a.page_size, hk, d)
            kw["block_table"] = torch.randperm(pages, device="cuda", dtype=torch.int32).reshape(b, -1)
        else:
            shape = (b, s, hk, d)
        kc = torch.randn(shape, device="cuda").to(dtype)
        vc = torch.randn(shape, device="cuda").to(dtype)
        if dtype != torch.bfloat16:
            kw["k_descale"] = torch.ones(b, hk, device="cuda")
            kw["v_descale"] = torch.ones(b, hk, device="cuda")
        calls[name] = (kc, vc, kw)
    for _ in range(3):
        for kc, vc, kw in calls.values():
            flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, **kw)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for kc, vc, kw in calls.values():
        flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, **kw)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(flashattn.plan_kvcache(q, calls["e4m3"][0], calls["e4m3"][1], cache_seqlens=seqlens, **calls["e4m3"][2]))


if __name__ == "__main__":
    main()
