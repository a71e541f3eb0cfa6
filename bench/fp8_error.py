#!/usr/bin/env python3
"""FP8 quantization error against full-precision inputs (issue 29), on the GPU when there is one,
else on the CPU backend (both compute the same result, docs/DECISIONS.md D-64):

    python3 bench/fp8_error.py --out bench/results/fp8-error.json

Inputs are float32 N(0, 1). The reference is float64 attention of those inputs. Each point records
the error of our bf16 call (inputs rounded to bf16) and of our FP8 call (inputs quantized to
float8_e4m3fn with one descale per tensor, amax / 448, as serving engines do), both relative to
max|ref| (max_rel) and as RMS error over RMS ref (rms_rel). Prefill quantizes q, k and v; decode
keeps a bf16 q over an e4m3 cache.
"""
import argparse
import json

import torch
import torch.nn.functional as F

import flashattn

E4M3_MAX = 448.0


def quantized(x, heads_k):
    """x (b, s, heads, d) as float8_e4m3fn and its per-tensor descale as a (b, heads_k) tensor."""
    descale = (x.abs().amax() / E4M3_MAX).clamp(min=1e-12)
    return (x / descale).to(torch.float8_e4m3fn), descale.expand(x.shape[0], heads_k).contiguous()


def reference(q, k, v, causal):
    """float64 attention of (b, s, heads, d) tensors, GQA by head groups, causal bottom-right."""
    q, k, v = (x.double().transpose(1, 2) for x in (q, k, v))
    sq, sk = q.shape[2], k.shape[2]
    mask = None
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        mask = j <= i + sk - sq
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return out.transpose(1, 2)


def errors(out, ref):
    diff = (out.double() - ref).abs()
    return dict(max_rel=(diff.max() / ref.abs().max()).item(),
                rms_rel=(diff.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item())


def prefill_point(device, d, causal, b=1, s=1024, h=8, hk=2):
    gen = torch.Generator(device="cpu").manual_seed(d + causal)
    q = torch.randn(b, s, h, d, generator=gen).to(device)
    k, v = (torch.randn(b, s, hk, d, generator=gen).to(device) for _ in range(2))
    ref = reference(q, k, v, causal)
    bf16 = flashattn.flash_attn_func(*(x.bfloat16() for x in (q, k, v)), causal=causal)
    (q8, qd), (k8, kd), (v8, vd) = quantized(q, hk), quantized(k, hk), quantized(v, hk)
    fp8 = flashattn.flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)
    return dict(kind="fp8-error", call="prefill", d=d, b=b, s=s, h=h, hk=hk, causal=causal,
                bf16=errors(bf16, ref), fp8=errors(fp8, ref))


def decode_point(device, context, b=4, h=32, hk=8, d=128):
    gen = torch.Generator(device="cpu").manual_seed(context)
    q = torch.randn(b, 1, h, d, generator=gen).to(device)
    k, v = (torch.randn(b, context, hk, d, generator=gen).to(device) for _ in range(2))
    ref = reference(q, k, v, False)
    seqlens = torch.full((b,), context, dtype=torch.int32, device=device)
    bf16 = flashattn.flash_attn_with_kvcache(q.bfloat16(), k.bfloat16(), v.bfloat16(), cache_seqlens=seqlens)
    (k8, kd), (v8, vd) = quantized(k, hk), quantized(v, hk)
    fp8 = flashattn.flash_attn_with_kvcache(q.bfloat16(), k8, v8, cache_seqlens=seqlens, k_descale=kd, v_descale=vd)
    return dict(kind="fp8-error", call="decode", d=d, b=b, s=context, h=h, hk=hk, causal=False,
                bf16=errors(bf16, ref), fp8=errors(fp8, ref))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="JSON file for the records")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = [prefill_point(device, d, c) for d in (64, 128, 256) for c in (False, True)]
    rows += [decode_point(device, ctx) for ctx in (1024, 8192)]
    flat = [dict({k: v for k, v in r.items() if k not in ("bf16", "fp8")},
                 bf16_max_rel=r["bf16"]["max_rel"], bf16_rms_rel=r["bf16"]["rms_rel"],
                 fp8_max_rel=r["fp8"]["max_rel"], fp8_rms_rel=r["fp8"]["rms_rel"]) for r in rows]
    for r in flat:
        print(" ".join(f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
    if args.out:
        name = torch.cuda.get_device_name() if device == "cuda" else "CPU backend"
        with open(args.out, "w") as f:
            json.dump(dict(device=name, torch=torch.__version__, rows=flat), f, indent=1)


if __name__ == "__main__":
    main()
