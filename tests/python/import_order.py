"""Imports flashattn together with other frameworks in a given order, in this (fresh) process,
then makes calls that cross the library boundary: results, and a library error caught as
ValueError. A process that crashes (issue 28: "free(): invalid pointer" when torch followed
flashattn built against a prebuilt library) exits non-zero.

    python import_order.py flashattn,torch         # import flashattn, then torch
    python import_order.py torch,flashattn

Driven by test_import_order.py (the pip-installed package) and by the ctest
python_prebuilt_import_order (the extension built against a `cmake --install` prefix).
"""
import importlib
import sys


def numpy_call(flashattn):
    import numpy as np

    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 5, 2, 59)).astype(np.float32)
    k = rng.standard_normal((1, 7, 2, 59)).astype(np.float32)
    out = flashattn.flash_attn_func(q, k, k, causal=True)
    assert out.shape == q.shape and np.isfinite(out).all()
    try:
        flashattn.flash_attn_func(q, k[:, :, :0], k[:, :, :0])  # no key heads: refused
    except ValueError as e:
        assert "k" in str(e)
    else:
        raise AssertionError("a bad call did not raise ValueError")


def torch_calls(flashattn, torch):
    q = torch.randn(2, 9, 4, 40)
    k, v = torch.randn(2, 11, 2, 40), torch.randn(2, 11, 2, 40)
    out = flashattn.flash_attn_func(q, k, v)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.repeat_interleave(2, 2).transpose(1, 2),
        v.repeat_interleave(2, 2).transpose(1, 2)).transpose(1, 2)
    assert (out - ref).abs().max().item() < 1e-4
    if torch.cuda.is_available() and flashattn.cuda_available():
        for dtype in (torch.float16, torch.bfloat16):
            qc, kc, vc = (x.to("cuda", dtype) for x in (q, k, v))
            outc = flashattn.flash_attn_func(qc, kc, vc)
            torch.cuda.synchronize()
            assert (outc.float().cpu() - ref).abs().max().item() < 3e-2, dtype


def main(order):
    modules = {}
    for name in order:
        modules[name] = importlib.import_module(name)
    flashattn = modules["flashattn"]
    numpy_call(flashattn)
    if "torch" in modules:
        torch_calls(flashattn, modules["torch"])
    print("imported " + " -> ".join(order) + ": calls ok")


if __name__ == "__main__":
    main(sys.argv[1].split(","))
