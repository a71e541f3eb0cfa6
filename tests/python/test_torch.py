"""PyTorch integration: the torch custom ops (flashattn::fwd, fwd_varlen, fwd_kvcache), their fake
implementations, and torch.compile(fullgraph=True) of a model calling flash_attn_func,
flash_attn_varlen_func and flash_attn_with_kvcache: no graph break, the eager results, the cache
append visible in the caller's tensors; on CPU tensors, and on CUDA tensors (incl. CUDA graphs
through mode="reduce-overhead") where CUDA is available.

Skipped where torch is missing. Each torch.compile with the inductor backend costs tens of
seconds on a small machine; the other checks use the "aot_eager" backend or a graph-capturing
backend.
"""
import functools
import subprocess
import sys

import numpy as np
import pytest

import flashattn

torch = pytest.importorskip("torch")
import flashattn._torch_ops  # noqa: E402  registers the ops (else done by the first torch call)

OPS = ("fwd", "fwd_varlen", "fwd_kvcache")


def cuda_ready():
    return torch.cuda.is_available() and flashattn.cuda_available()


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# ---- problems ---------------------------------------------------------------------------------

def make_inputs(device="cpu", dtype=torch.float32, seed=0):
    """Inputs of Attend below: dense, varlen (two sequences of 3 and 5 rows) and a KV cache
    (b = 2, 16 rows, 4 and 9 held) with 3 new rows appended."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    h, hk, d = 4, 2, 64
    return dict(
        q=randn(2, 3, h, d), k=randn(2, 7, hk, d), v=randn(2, 7, hk, d),
        q_packed=randn(8, h, d), k_packed=randn(8, hk, d), v_packed=randn(8, hk, d),
        cu_seqlens=torch.tensor([0, 3, 8], dtype=torch.int32, device=device),
        k_cache=randn(2, 16, hk, d), v_cache=randn(2, 16, hk, d),
        k_new=randn(2, 3, hk, d), v_new=randn(2, 3, hk, d),
        cache_seqlens=torch.tensor([4, 9], dtype=torch.int32, device=device))


class Attend(torch.nn.Module):
    """The three calls with a few options; the KV cache is a pair of buffers (static addresses,
    as CUDA graphs need for a mutated input), appended to in place."""

    def __init__(self, k_cache, v_cache):
        super().__init__()
        self.register_buffer("k_cache", k_cache.clone())
        self.register_buffer("v_cache", v_cache.clone())
        for cache in (self.k_cache, self.v_cache):  # as transformers' StaticCache does
            torch._dynamo.mark_static_address(cache)

    def forward(self, q, k, v, q_packed, k_packed, v_packed, cu_seqlens, k_new, v_new,
                cache_seqlens):
        dense = flashattn.flash_attn_func(q, k, v, causal=True)
        windowed, lse, probs = flashattn.flash_attn_func(
            q * 0.5, k, v, window_size=(2, 1), softcap=3.0, return_attn_probs=True)
        assert probs is None
        packed = flashattn.flash_attn_varlen_func(q_packed, k_packed, v_packed, cu_seqlens,
                                                  cu_seqlens, 5, 5, causal=True)
        cached, cached_lse = flashattn.flash_attn_with_kvcache(
            q, self.k_cache, self.v_cache, k_new, v_new, cache_seqlens=cache_seqlens,
            causal=True, return_softmax_lse=True)
        return dense + windowed, lse, packed * 2, cached, cached_lse


def model_args(x):
    return (x["q"], x["k"], x["v"], x["q_packed"], x["k_packed"], x["v_packed"], x["cu_seqlens"],
            x["k_new"], x["v_new"], x["cache_seqlens"])


def assert_same(got, want, atol=0.0, rtol=0.0):
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, f"output {i}"
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol, msg=lambda m: f"output {i}: {m}")


def run_compiled_and_eager(x, compile_kwargs, steps=1, atol=0.0, rtol=0.0):
    """Eager and compiled models on the same inputs: same outputs and same caches after each
    step (cache_seqlens advanced by the 3 appended rows between steps)."""
    eager = Attend(x["k_cache"], x["v_cache"])
    compiled_module = Attend(x["k_cache"], x["v_cache"])
    compiled = torch.compile(compiled_module, fullgraph=True, **compile_kwargs)
    seqlens = x["cache_seqlens"].clone()
    for step in range(steps):
        args = model_args({**x, "cache_seqlens": seqlens})
        with torch.no_grad():
            want = eager(*args)
            got = [t.clone() for t in compiled(*args)]  # CUDA graph outputs are reused
        assert_same(got, want, atol, rtol)
        assert torch.equal(compiled_module.k_cache, eager.k_cache), f"k_cache, step {step}"
        assert torch.equal(compiled_module.v_cache, eager.v_cache), f"v_cache, step {step}"
        seqlens = seqlens + 3 if step % 2 == 0 else seqlens - 3  # stay inside 16 rows
    assert not torch.equal(eager.k_cache, x["k_cache"]), "the append wrote nothing"


# ---- import, registration, fake implementations ------------------------------------------------

def test_import_does_not_import_torch():
    code = ("import sys, flashattn, numpy as np; assert 'torch' not in sys.modules; "
            "q = np.ones((1, 2, 1, 8), np.float32); flashattn.flash_attn_func(q, q, q); "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_ops_registered_after_import_in_either_order():
    ops = "; ".join(f"torch.ops.flashattn.{op}.default" for op in OPS)
    for code in ("import torch, flashattn; " + ops,  # registered at import
                 "import flashattn, torch; q = torch.ones(1, 2, 1, 8); "  # at the first call
                 "flashattn.flash_attn_func(q, q, q); " + ops):
        subprocess.run([sys.executable, "-c", code], check=True)


def test_opcheck():
    """torch.library.opcheck: schema (mutations declared), fake implementation against the real
    one, AOT dispatch with dynamic shapes."""
    x = make_inputs()
    for return_lse in (False, True):
        no_descales = (None, None, None)  # q_descale, k_descale, v_descale
        torch.library.opcheck(torch.ops.flashattn.fwd.default,
                              (x["q"], x["k"], x["v"], None, *no_descales, None, True, -1, -1,
                               0.0, return_lse))
        torch.library.opcheck(torch.ops.flashattn.fwd_varlen.default,
                              (x["q_packed"], x["k_packed"], x["v_packed"], x["cu_seqlens"],
                               x["cu_seqlens"], 5, 5, None, None, None, None, *no_descales, 0.3,
                               True, -1, -1, 0.0, return_lse))
        for k_new, v_new in ((None, None), (x["k_new"], x["v_new"])):
            torch.library.opcheck(torch.ops.flashattn.fwd_kvcache.default,
                                  (x["q"], x["k_cache"].clone(), x["v_cache"].clone(), k_new,
                                   v_new, None, None, x["cache_seqlens"], None, None, None,
                                   None, *no_descales, None, True, -1, -1, 0.0, True, 0,
                                   return_lse, None))


def test_fake_shapes():
    """Under FakeTensorMode the calls give the eager shapes and dtypes without running."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = make_inputs(dtype=torch.bfloat16)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        f = {name: mode.from_tensor(t) for name, t in x.items()}
        out, lse, _ = flashattn.flash_attn_func(f["q"], f["k"], f["v"], return_attn_probs=True)
        assert out.shape == (2, 3, 4, 64) and out.dtype == torch.bfloat16
        assert lse.shape == (2, 4, 3) and lse.dtype == torch.float32
        out, lse, _ = flashattn.flash_attn_varlen_func(
            f["q_packed"], f["k_packed"], f["v_packed"], f["cu_seqlens"], f["cu_seqlens"], 5, 5,
            return_attn_probs=True)
        assert out.shape == (8, 4, 64) and lse.shape == (4, 8)
        out, lse = flashattn.flash_attn_with_kvcache(
            f["q"], f["k_cache"], f["v_cache"][..., :32], f["k_new"], f["v_new"][..., :32],
            cache_seqlens=3, return_softmax_lse=True)
        assert out.shape == (2, 3, 4, 32) and lse.shape == (2, 4, 3)


def fp8_inputs():
    """make_inputs in float8_e4m3fn (q, k, v, the caches) with per-(batch, KV head) descales, the
    new rows in bf16 (out's dtype)."""
    x = make_inputs()
    f8 = {name: t.to(torch.float8_e4m3fn) for name, t in x.items()
          if name in ("q", "k", "v", "q_packed", "k_packed", "v_packed", "k_cache", "v_cache")}
    descales = {name: torch.full((2, 2), 0.5) for name in ("q_descale", "k_descale", "v_descale")}
    return {**x, **f8, **descales, "k_new": x["k_new"].bfloat16(), "v_new": x["v_new"].bfloat16()}


def test_fp8_opcheck_and_fake_dtypes():
    """FP8 through the ops: opcheck with e4m3 inputs and descales (fake implementation: out bf16;
    its schema test is left out: it does arithmetic torch has no float8 CPU kernel for),
    FakeTensorMode dtypes, and a compiled (aot_eager) call equal to the eager one."""
    x = fp8_inputs()
    d = (x["q_descale"], x["k_descale"], x["v_descale"])
    opcheck = functools.partial(torch.library.opcheck,
                                test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))
    opcheck(torch.ops.flashattn.fwd.default,
            (x["q"], x["k"], x["v"], None, *d, None, True, -1, -1, 0.0, True))
    opcheck(torch.ops.flashattn.fwd_varlen.default,
            (x["q_packed"], x["k_packed"], x["v_packed"], x["cu_seqlens"], x["cu_seqlens"], 5, 5,
             None, None, None, None, d[0], d[1][0, :1], d[2][0, 0], None, True, -1, -1,
             0.0, False))
    opcheck(torch.ops.flashattn.fwd_kvcache.default,
            (x["q"].bfloat16(), x["k_cache"].clone(), x["v_cache"].clone(), x["k_new"],
             x["v_new"], None, None, x["cache_seqlens"], None, None, None, None, None, *d[1:],
             None, True, -1, -1, 0.0, True, 0, True, None))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        f = {name: mode.from_tensor(t) for name, t in x.items()}
        out = flashattn.flash_attn_func(f["q"], f["k"], f["v"], q_descale=f["q_descale"])
        assert out.shape == (2, 3, 4, 64) and out.dtype == torch.bfloat16
        out = flashattn.flash_attn_with_kvcache(f["q"], f["k_cache"], f["v_cache"], f["k_new"],
                                                f["v_new"], cache_seqlens=3)
        assert out.dtype == torch.bfloat16

    def fn(q, k, v, qd, kd, vd):
        return flashattn.flash_attn_func(q, k, v, causal=True, q_descale=qd, k_descale=kd,
                                         v_descale=vd)

    with torch.no_grad():
        want = fn(x["q"], x["k"], x["v"], *d)
        got = torch.compile(fn, fullgraph=True, backend="aot_eager")(x["q"], x["k"], x["v"], *d)
    assert want.dtype == torch.bfloat16 and torch.equal(got, want)


def test_graph_workspace_has_the_planned_size():
    """The scratch the kvcache op takes from torch while a CUDA graph is captured (that branch
    runs only on CUDA; its sizing is checked here)."""
    x = make_inputs()
    args = (x["q"], x["k_cache"], x["v_cache"], x["k_new"], x["v_new"], None, None,
            x["cache_seqlens"], None, None, None, None, None, None, None, None, True, -1, -1,
            0.0, True, 4)
    ws = flashattn._torch_ops._graph_workspace(*args)
    plan = flashattn.plan_kvcache(x["q"], x["k_cache"], x["v_cache"], x["k_new"], x["v_new"],
                                  cache_seqlens=x["cache_seqlens"], causal=True, num_splits=4)
    assert ws.dtype == torch.uint8 and ws.numel() == plan.workspace_bytes


# ---- eager torch path -------------------------------------------------------------------------

def test_eager_matches_numpy_path():
    """torch CPU tensors give exactly what the NumPy path gives (same backend), for every call,
    out=, an int cache_seqlens and the packed variants."""
    x = make_inputs()
    n = {name: t.numpy() for name, t in x.items()}
    out, lse, _ = flashattn.flash_attn_func(x["q"], x["k"], x["v"], causal=True,
                                            return_attn_probs=True)
    ref, ref_lse, _ = flashattn.flash_attn_func(n["q"], n["k"], n["v"], causal=True,
                                                return_attn_probs=True)
    np.testing.assert_array_equal(out.numpy(), ref)
    np.testing.assert_array_equal(lse.numpy(), ref_lse)

    buf = torch.full_like(x["q_packed"], float("nan"))
    got = flashattn.flash_attn_varlen_func(x["q_packed"], x["k_packed"], x["v_packed"],
                                           x["cu_seqlens"], x["cu_seqlens"], 5, 5, out=buf)
    assert got is buf
    ref = flashattn.flash_attn_varlen_func(n["q_packed"], n["k_packed"], n["v_packed"],
                                           n["cu_seqlens"], n["cu_seqlens"], 5, 5)
    np.testing.assert_array_equal(buf.numpy(), ref)

    k_cache, v_cache = x["k_cache"].clone(), x["v_cache"].clone()
    nk_cache, nv_cache = n["k_cache"].copy(), n["v_cache"].copy()
    got = flashattn.flash_attn_with_kvcache(x["q"], k_cache, v_cache, x["k_new"], x["v_new"],
                                            cache_seqlens=5, causal=True)
    ref = flashattn.flash_attn_with_kvcache(n["q"], nk_cache, nv_cache, n["k_new"], n["v_new"],
                                           cache_seqlens=5, causal=True)
    np.testing.assert_array_equal(got.numpy(), ref)
    np.testing.assert_array_equal(k_cache.numpy(), nk_cache)
    np.testing.assert_array_equal(v_cache.numpy(), nv_cache)

    qkv = torch.stack([x["q"], x["q"] * 0.5, x["q"] * 2], dim=2)
    got = flashattn.flash_attn_qkvpacked_func(qkv, causal=True)
    ref = flashattn.flash_attn_func(qkv.numpy()[:, :, 0], qkv.numpy()[:, :, 1],
                                    qkv.numpy()[:, :, 2], causal=True)
    np.testing.assert_array_equal(got.numpy(), ref)


def test_eager_strided_last_dim():
    """torch inputs whose last dimension is strided are copied (as flash_attn does), in each call;
    a cache the call appends to is not copied but refused by name, untouched."""
    x = make_inputs()

    def strided(t):  # the same values, last-dim stride 2
        return torch.stack([t, torch.full_like(t, float("nan"))], dim=-1)[..., 0]

    q, k, v, k_new = (strided(x[n]) for n in ("q", "k", "v", "k_new"))
    assert q.stride(-1) == 2
    assert torch.equal(flashattn.flash_attn_func(q, k, v, causal=True),
                       flashattn.flash_attn_func(x["q"], x["k"], x["v"], causal=True))
    packed = [strided(x[n]) for n in ("q_packed", "k_packed", "v_packed")]
    assert torch.equal(
        flashattn.flash_attn_varlen_func(*packed, x["cu_seqlens"], x["cu_seqlens"], 5, 5),
        flashattn.flash_attn_varlen_func(x["q_packed"], x["k_packed"], x["v_packed"],
                                         x["cu_seqlens"], x["cu_seqlens"], 5, 5))
    caches = [x["k_cache"].clone(), x["v_cache"].clone()]
    expect_caches = [x["k_cache"].clone(), x["v_cache"].clone()]
    got = flashattn.flash_attn_with_kvcache(q, *caches, k_new, x["v_new"], cache_seqlens=5)
    expect = flashattn.flash_attn_with_kvcache(x["q"], *expect_caches, x["k_new"], x["v_new"],
                                               cache_seqlens=5)
    assert torch.equal(got, expect) and torch.equal(caches[0], expect_caches[0])
    k_cache = strided(x["k_cache"])
    before = k_cache.clone()
    with pytest.raises(ValueError, match="k_cache: must have a contiguous last dimension"):
        flashattn.flash_attn_with_kvcache(x["q"], k_cache, x["v_cache"], x["k_new"], x["v_new"],
                                          cache_seqlens=5)
    assert torch.equal(k_cache, before)


def test_eager_refuses_grad():
    x = make_inputs()
    q = x["q"].clone().requires_grad_(True)
    with pytest.raises(NotImplementedError, match="backward"):
        flashattn.flash_attn_with_kvcache(q, x["k_cache"], x["v_cache"], cache_seqlens=4)
    with torch.no_grad():
        flashattn.flash_attn_with_kvcache(q, x["k_cache"], x["v_cache"], cache_seqlens=4)


# ---- torch.compile on CPU -----------------------------------------------------------------------

def test_compile_graph_holds_the_ops():
    """fullgraph=True traces the three calls into one graph whose nodes are the custom ops."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x = make_inputs()
    model = Attend(x["k_cache"], x["v_cache"])
    with torch.no_grad():
        torch.compile(model, fullgraph=True, backend=capture)(*model_args(x))
    assert len(graphs) == 1
    targets = [node.target for node in graphs[0].graph.nodes]
    ops = torch.ops.flashattn
    assert targets.count(ops.fwd.default) == 2, targets
    assert targets.count(ops.fwd_varlen.default) == 1, targets
    assert targets.count(ops.fwd_kvcache.default) == 1, targets


def test_compile_aot_eager_dynamic():
    """Functionalized (AOT) graph with dynamic shapes: the cache mutation survives, and a second
    sequence length runs without recompiling."""
    x = make_inputs()
    run_compiled_and_eager(x, dict(backend="aot_eager", dynamic=True), steps=2)
    y = make_inputs(seed=1)
    y["q"], y["k"], y["v"] = y["q"][:, :2], y["k"][:, :5], y["v"][:, :5]
    y["k_new"], y["v_new"] = y["k_new"][:, :2], y["v_new"][:, :2]
    run_compiled_and_eager(y, dict(backend="aot_eager", dynamic=True))


def test_compile_inductor_cpu():
    run_compiled_and_eager(make_inputs(), {}, steps=2)


def test_compile_out_argument():
    """out= inside a compiled function is filled with the op's result."""
    x = make_inputs()

    def fn(q, k, v, out):
        flashattn.flash_attn_func(q, k, v, causal=True, out=out)
        return out * 1

    out = torch.full_like(x["q"], float("nan"))
    with torch.no_grad():
        got = torch.compile(fn, fullgraph=True, backend="aot_eager")(x["q"], x["k"], x["v"], out)
    want = flashattn.flash_attn_func(x["q"], x["k"], x["v"], causal=True)
    assert torch.equal(out, want) and torch.equal(got, want)


# ---- CUDA ---------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_compile_cuda(mode, dtype):
    """Same as on CPU, on CUDA tensors; "reduce-overhead" replays CUDA graphs (checked: no
    cudagraph skips), several steps so that replays, not only the capture, are compared."""
    if not cuda_ready():
        pytest.skip("needs torch with CUDA and flashattn built with CUDA")
    from test_gpu import require_instance
    from torch._dynamo.utils import counters

    require_instance(dtype, 64)
    counters.clear()
    x = make_inputs(device="cuda", dtype=dtype)
    # torch's default tolerances for the dtype (inductor may round the elementwise work fused
    # around the ops differently); the caches are still compared exactly
    run_compiled_and_eager(x, {} if mode is None else dict(mode=mode), steps=4, atol=None,
                           rtol=None)
    if mode == "reduce-overhead":
        assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])

