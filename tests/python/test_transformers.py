"""Hugging Face transformers: attn_implementation="flashattn" (flashattn.integrations.transformers)
against transformers' own SDPA (or eager, for softcap) attention, on tiny random-weight models
built from a config (no download): prefill logits of a padded batch (left and right padding),
greedy generate(), a padding-free packed batch, and sliding window + softcap (Gemma-2 shaped).
CPU in float32; CUDA in bfloat16 (marker gpu, skipped without CUDA).

Skipped where torch or transformers (with AttentionInterface) is missing. Tested with
transformers 5.17 and 5.24.
"""
import copy

import pytest

import flashattn

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not all(hasattr(transformers, name)
           for name in ("AttentionInterface", "AttentionMaskInterface")):
    pytest.skip(f"transformers {transformers.__version__} has no AttentionInterface / "
                "AttentionMaskInterface", allow_module_level=True)
from flashattn.integrations import transformers as fa_hf  # noqa: E402  registers "flashattn"

B, S, NEW_TOKENS = 3, 9, 6


def cuda_ready():
    return torch.cuda.is_available() and flashattn.cuda_available()


DEVICES = [
    pytest.param("cpu", torch.float32, id="cpu-fp32"),
    pytest.param("cuda", torch.bfloat16, id="cuda-bf16", marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not cuda_ready(), reason="needs torch CUDA and flashattn CUDA")]),
]


def llama_config():
    # initializer_range 0.2 (not 0.02): attention then moves the logits by O(1), so a wrong mask
    # or a wrong row cannot hide below float noise.
    return transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                    pad_token_id=0, initializer_range=0.2)


def gemma2_config():
    """Layer 0 sliding window (4 keys), layer 1 full; attention logits softcapped at 2."""
    return transformers.Gemma2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     vocab_size=128, sliding_window=4, attn_logit_softcapping=2.0,
                                     final_logit_softcapping=None, query_pre_attn_scalar=16,
                                     pad_token_id=0, initializer_range=0.2)


def models(config, reference, device, dtype):
    """(reference model, flashattn model), same random weights; each has its own config copy
    (from_config writes the implementation into the config)."""
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config),
                                                        attn_implementation=reference)
    ours = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config),
                                                         attn_implementation="flashattn")
    ours.load_state_dict(ref.state_dict())
    assert ours.config._attn_implementation == "flashattn"
    return (ref.to(device, dtype).eval(), ours.to(device, dtype).eval())


def batch(padding, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 128, (B, S), generator=g)
    mask = torch.ones(B, S, dtype=torch.long)
    if padding == "left":
        mask[1, :4] = 0
        mask[2, :1] = 0
    elif padding == "right":
        mask[1, 5:] = 0
        mask[2, 8:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    return ids.to(device), mask.to(device)


@pytest.fixture
def calls(monkeypatch):
    """Counts the flashattn calls the integration makes."""
    seen = {"flash_attn_func": 0, "flash_attn_varlen_func": 0}
    for name in seen:
        real = getattr(flashattn.interface, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            seen[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(flashattn.interface, name, spy)
    return seen


def logits(model, ids, mask, **kwargs):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, **kwargs).logits.float()


def assert_logits_close(ours, ref, exact, valid, dtype):
    """float32: ours ~ ref to rounding. Low precision: the repo's pass rule against a float32
    run of the reference, max|ours - exact| <= 2 max|ref - exact| + floor, over real tokens."""
    ours, ref, exact = ours[valid], ref[valid], exact[valid]
    scale = exact.abs().max().item()
    if dtype == torch.float32:
        err = (ours - ref).abs().max().item()
        assert err <= 1e-5 * scale, \
            f"max |flashattn - reference| {err:.3g} (logits up to {scale:.3g})"
        return
    err, ref_err = ((x - exact).abs().max().item() for x in (ours, ref))
    bound = 2 * ref_err + 1e-2 * scale
    assert err <= bound, f"error {err:.3g} > bound {bound:.3g} (reference error {ref_err:.3g})"


def exact_logits(config, reference, device, ids, mask):
    ref, _ = models(config, reference, device, torch.float32)
    return logits(ref, ids, mask)


# ---- registration ------------------------------------------------------------------------------

def test_registered():
    assert transformers.AttentionInterface()["flashattn"] is fa_hf.attention_forward
    assert "flashattn" in transformers.AttentionMaskInterface()
    fa_hf.register()  # again: no change
    assert transformers.AttentionInterface()["flashattn"] is fa_hf.attention_forward


# ---- prefill and generate against SDPA ----------------------------------------------------------

@pytest.mark.parametrize("device,dtype", DEVICES)
@pytest.mark.parametrize("padding", ["left", "right", "none"])
def test_prefill_matches_sdpa(device, dtype, padding, calls):
    config = llama_config()
    ref, ours = models(config, "sdpa", device, dtype)
    ids, mask = batch(padding, device)
    got = logits(ours, ids, mask)
    # the padded batch goes through varlen (unpadded rows), the unpadded one through the dense call
    layers = config.num_hidden_layers
    want_calls = ({"flash_attn_func": layers, "flash_attn_varlen_func": 0} if padding == "none"
                  else {"flash_attn_func": 0, "flash_attn_varlen_func": layers})
    assert calls == want_calls
    valid = mask.bool()
    exact = exact_logits(config, "sdpa", device, ids, mask)
    assert_logits_close(got, logits(ref, ids, mask), exact, valid, dtype)
    if padding != "none":  # padded query rows: zeros before o_proj (as flash_attention_2)
        assert torch.isfinite(got).all()


def greedy(model, ids, mask, **kwargs):
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                             do_sample=False, output_scores=True, return_dict_in_generate=True,
                             **kwargs)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.scores, dim=1).float()


def assert_same_tokens(got, want, want_scores, tie):
    """Greedy tokens equal; where they first differ, the reference's two best scores must be
    within `tie` of each other (a near tie that rounding may flip), and later steps are not
    compared (the sequences have diverged)."""
    for row in range(want.shape[0]):
        differ = (got[row] != want[row]).nonzero()
        if len(differ) == 0:
            continue
        step = int(differ[0])
        top2 = want_scores[row, step].topk(2).values
        gap = (top2[0] - top2[1]).item()
        assert gap <= tie, (f"sequence {row} differs at step {step}: {got[row].tolist()} vs "
                            f"{want[row].tolist()}, reference margin {gap:.3g} > {tie}")


@pytest.mark.parametrize("device,dtype", DEVICES)
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_matches_sdpa(device, dtype, cache):
    ref, ours = models(llama_config(), "sdpa", device, dtype)
    ids, mask = batch("left", device)
    # transformers compiles the forward of a static-cache generate on CUDA: not here (below)
    kwargs = ({"cache_implementation": "static", "disable_compile": True} if cache == "static"
              else {})
    want, want_scores = greedy(ref, ids, mask, **kwargs)
    got, _ = greedy(ours, ids, mask, **kwargs)
    assert_same_tokens(got, want, want_scores, tie=1e-4 if dtype == torch.float32 else 0.1)
    if dtype == torch.float32:
        assert torch.equal(got, want)


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_generate_compiled(device, dtype):
    """A static-cache generate() with transformers' compiled forward (its default on CUDA,
    forced on CPU): the flashattn ops inside the compiled model; the unpadding breaks the graph
    there, as it does for flash_attention_2."""
    from torch._dynamo.utils import counters

    ref, ours = models(llama_config(), "sdpa", device, dtype)
    ids, mask = batch("left", device)
    want, want_scores = greedy(ref, ids, mask, cache_implementation="static", disable_compile=True)
    torch._dynamo.reset()
    counters.clear()
    compile_config = transformers.CompileConfig()
    compile_config._compile_all_devices = True
    try:
        got, _ = greedy(ours, ids, mask, cache_implementation="static",
                        compile_config=compile_config)
    finally:
        torch._dynamo.reset()
    assert counters["stats"]["unique_graphs"] > 0, "generate() did not compile the forward"
    assert_same_tokens(got, want, want_scores, tie=1e-4 if dtype == torch.float32 else 0.1)


# ---- packed (padding-free) batch, sliding window and softcap ------------------------------------

@pytest.mark.parametrize("device,dtype", DEVICES)
def test_packed_sequences(device, dtype):
    """Two sequences concatenated in one row with cu_seq_lens: each attends only to itself, as
    the same sequences run one by one."""
    config = llama_config()
    ref, ours = models(config, "sdpa", device, dtype)
    ids, _ = batch("none", device)
    first, second = ids[0, :5], ids[1, :7]
    packed = torch.cat([first, second])[None]
    positions = torch.cat([torch.arange(5), torch.arange(7)])[None].to(device)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32, device=device)
    with torch.no_grad():
        got = ours(input_ids=packed, position_ids=positions, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                   max_length_q=7, max_length_k=7).logits.float()[0]
    want = torch.cat([logits(ref, x[None], None)[0] for x in (first, second)])
    exact = torch.cat([exact_logits(config, "sdpa", device, x[None], None)[0]
                       for x in (first, second)])
    assert_logits_close(got, want, exact, torch.ones(12, dtype=torch.bool, device=device), dtype)


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_sliding_window_and_softcap(device, dtype):
    """Gemma-2 shaped: a sliding-window layer and a full layer, softcapped logits, left padding;
    against transformers' eager attention (SDPA has no softcap)."""
    config = gemma2_config()
    ref, ours = models(config, "eager", device, dtype)
    ids, mask = batch("left", device)
    assert_logits_close(logits(ours, ids, mask), logits(ref, ids, mask),
                        exact_logits(config, "eager", device, ids, mask), mask.bool(), dtype)
    want, want_scores = greedy(ref, ids, mask)
    got, _ = greedy(ours, ids, mask)
    assert_same_tokens(got, want, want_scores, tie=1e-4 if dtype == torch.float32 else 0.1)
