"""Bad index values in device memory, through the Python API on CUDA tensors (issue 31, marker
gpu; docs/DECISIONS.md D-61; tests/gpu/test_index_faults.cpp holds the same contract for the C++
API).

Each case gives one sequence (BAD) of a call one bad value in one index tensor: a block_table
entry past the pages or negative, cache_seqlens past the cache (paged or not) or negative,
cache_batch_idx out of range, cache_leftpad past cache_seqlens or negative, seqused_k,
cu_seqlens_k, cu_seqlens_q, leftpad_k out of range. The host cannot read these without a
synchronisation, so the kernels check them. The contract:

* nothing is read or written outside the tensors (scripts/device_check.sh `fuzz` runs this file
  under compute-sanitizer memcheck, with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so that every tensor
  is an allocation of its own);
* the sequence at fault gets output 0 and LSE -inf (a bad block_table entry: the keys of its page
  read as zeros, checked against the CPU backend on a cache with a zero page there; cu_seqlens_q:
  its rows are not computed); every other sequence matches the CPU backend on the good inputs;
* a KV-cache call writes the cache rows of the other sequences as the CPU backend does, and
  those of the sequence at fault either not at all or as the CPU backend does;
* flashattn.check_device_status() raises ValueError naming the argument (and, where one sequence
  is at fault, the sequence and the value), once: the next check passes.

Each case is two calls (CUDA, CPU), so that the whole file runs in reasonable time under memcheck.
"""

import numpy as np
import pytest

import flashattn

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.cuda is not available"),
    pytest.mark.skipif(not flashattn.cuda_available(), reason="flashattn built without CUDA"),
]

H, HK, D = 4, 2, 64
BAD = 1  # the sequence given the bad value
E4M3 = getattr(torch, "float8_e4m3fn", None)
# |CUDA - CPU| on outputs of magnitude ~1 (the two round differently), and on the LSE (fp32)
OUT_TOL = {torch.float16: 5e-3, torch.bfloat16: 2e-2}
LSE_TOL = 2e-3


def randn(gen, *shape, dtype=torch.float16):
    return torch.from_numpy(gen.standard_normal(shape).astype(np.float32)).to(dtype)


def i32(values):
    return torch.tensor(values, dtype=torch.int32)


def with_zero_page(inputs, names, row, column):
    """The inputs with an all-zero page appended to the caches (or paged K/V) `names`, and
    block_table[row, column] pointing at it: what a bad entry there reads as."""
    x = dict(inputs)
    for name in names:  # through same-size integers (float8 has no cat on every torch)
        bits = x[name].view(torch.uint8 if x[name].element_size() == 1 else torch.int16)
        x[name] = torch.cat([bits, torch.zeros_like(bits[:1])]).view(x[name].dtype)
    x["block_table"] = x["block_table"].clone()
    x["block_table"][row, column] = x[names[0]].shape[0] - 1
    return x


def with_value(inputs, name, index, value):
    x = dict(inputs)
    x[name] = x[name].clone()
    x[name][index] = value
    return x


def run(fn, inputs, device, **options):
    """fn on copies of the inputs on device: (out, lse, inputs as called), on the host."""
    args = {n: (t.to(device, copy=True) if torch.is_tensor(t) else t) for n, t in inputs.items()}
    res = fn(**args, **options)
    out, lse = res[0].cpu(), res[1].cpu()
    return out, lse, {n: (t.cpu() if torch.is_tensor(t) else t) for n, t in args.items()}


def clear_device_status():
    try:
        flashattn.check_device_status()
    except ValueError:
        pass


def expect_fault(argument, sequence=None, value=None):
    """check_device_status() raises once, naming the argument (sequence and value where one
    sequence is at fault), then passes."""
    pattern = rf"^{argument}: a value read on the device at sequence "
    if sequence is not None:
        pattern += rf"{sequence} is out of range: "
        if value is not None:
            pattern += rf"{value} "
    with pytest.raises(ValueError, match=pattern):
        flashattn.check_device_status(torch.cuda.current_stream())
    flashattn.check_device_status()


def assert_empty(out, lse, what):
    assert torch.all(out == 0), f"{what}: output not 0"
    assert torch.all(torch.isneginf(lse)), f"{what}: LSE not -inf"


def assert_close(out, lse, ref_out, ref_lse, dtype, what):
    err = (out.double() - ref_out.double()).abs().max().item() if out.numel() else 0.0
    assert err <= OUT_TOL[dtype], f"{what}: output differs from the CPU backend's by {err:.3g}"
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), f"{what}: -inf rows differ"
    fin = torch.isfinite(ref_lse)
    if fin.any():
        err = (lse[fin] - ref_lse[fin]).abs().max().item()
        assert err <= LSE_TOL, f"{what}: LSE differs from the CPU backend's by {err:.3g}"


# ---- kv cache -----------------------------------------------------------------------------------

B, SQ = 3, 2
PAGE, PAGES_PER_SEQ = 16, 6
CAPACITY = PAGE * PAGES_PER_SEQ  # 96 keys a sequence can hold, paged or not
NUM_PAGES = B * PAGES_PER_SEQ + 2
SEQLENS = [40, 70, 25]


def kv_inputs(paged, *, num_splits=0, s_new=1, batch_idx=False, leftpad=False, rotary=False,
              q_dtype=torch.float16, cache_dtype=None):
    """q (B, SQ), s_new rows appended; paged: sequence b's pages 2 + b + j * B (pages 0, 1
    unused); contiguous with cache_batch_idx: rows 4, 0, 2 of 5."""
    gen = np.random.default_rng(7)
    x = dict(q=randn(gen, B, SQ, H, D, dtype=q_dtype), cache_seqlens=i32(SEQLENS),
             num_splits=num_splits)
    if paged:
        x["block_table"] = i32([[2 + b + j * B for j in range(PAGES_PER_SEQ)] for b in range(B)])
        shape = (NUM_PAGES, PAGE, HK, D)
    else:
        shape = (B + 2 if batch_idx else B, CAPACITY, HK, D)
        if batch_idx:
            x["cache_batch_idx"] = i32([4, 0, 2])
    x["k_cache"] = randn(gen, *shape).to(cache_dtype or q_dtype)
    x["v_cache"] = randn(gen, *shape).to(cache_dtype or q_dtype)
    if s_new:
        x["k"] = randn(gen, B, s_new, HK, D, dtype=q_dtype)
        x["v"] = randn(gen, B, s_new, HK, D, dtype=q_dtype)
    if leftpad:
        x["cache_leftpad"] = i32([3, 5, 0])
    if rotary:
        angles = torch.from_numpy(gen.uniform(0.0, 6.3, (CAPACITY + SQ, D // 4)))
        x["rotary_cos"], x["rotary_sin"] = angles.cos().to(q_dtype), angles.sin().to(q_dtype)
    return x


def run_kv(inputs, device):
    return run(flashattn.flash_attn_with_kvcache, inputs, device, causal=True,
               return_softmax_lse=True)


def owned_rows(inputs):
    """Which cache rows (contiguous) or pages (paged) are sequence BAD's in the good inputs."""
    owned = torch.zeros(inputs["k_cache"].shape[0], dtype=torch.bool)
    if "block_table" in inputs:
        owned[inputs["block_table"][BAD].long()] = True
    else:
        owned[int(inputs["cache_batch_idx"][BAD]) if "cache_batch_idx" in inputs else BAD] = True
    return owned


def check_kv_fault(good, bad, argument, value, *, bad_output="empty", cpu_inputs=None):
    """bad on CUDA, cpu_inputs (default good) on the CPU backend. bad_output: "empty" (output 0,
    LSE -inf), "cpu" (as the CPU backend's on cpu_inputs), "finite"."""
    clear_device_status()
    out, lse, called = run_kv(bad, "cuda")
    expect_fault(argument, BAD, value)
    ref_out, ref_lse, ref_called = run_kv(cpu_inputs or good, "cpu")
    dtype = out.dtype
    for b in range(B):
        what = f"{argument} = {value}: sequence {b}"
        if b == BAD and bad_output == "empty":
            assert_empty(out[b], lse[b], what)
        elif b == BAD and bad_output == "finite":
            assert torch.isfinite(out[b]).all(), f"{what}: non-finite output"
        else:
            assert_close(out[b], lse[b], ref_out[b], ref_lse[b], dtype, what)
    owned = owned_rows(good)
    rotated = "rotary_cos" in good
    for name in ("k_cache", "v_cache"):
        got, before = called[name].double(), good[name].double()
        ref = ref_called[name][:got.shape[0]].double()  # less a zero page added for the CPU
        rtol, atol = (2 ** -9, 1e-6) if rotated and name == "k_cache" else (0.0, 0.0)
        same = (got - ref).abs() <= rtol * ref.abs() + atol  # rotated keys: a 16-bit step
        assert same[~owned].all(), f"{argument} = {value}: {name} rows of good sequences differ"
        assert (same | (got == before))[owned].all(), \
            f"{argument} = {value}: {name} rows of the bad sequence neither kept nor as appended"


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("value", [CAPACITY, 2**31 - 1, -1])
def test_cache_seqlens_out_of_range(paged, num_splits, value):
    """Past the cache (with the appended row: CAPACITY - 1 is the last start), or negative."""
    good = kv_inputs(paged, num_splits=num_splits)
    check_kv_fault(good, with_value(good, "cache_seqlens", BAD, value), "cache_seqlens", value)


@pytest.mark.parametrize("paged", [False, True])
def test_cache_seqlens_past_capacity_without_append(paged):
    good = kv_inputs(paged, s_new=0)
    bad = with_value(good, "cache_seqlens", BAD, CAPACITY + 1)
    check_kv_fault(good, bad, "cache_seqlens", CAPACITY + 1)


def test_cache_seqlens_past_the_rotary_table():
    """Causal q rows at cache_seqlens + i: row 1 of sequence 1 at position CAPACITY, past a
    rotary table of CAPACITY rows (the CPU backend gets a longer table: the same appends)."""
    good = with_value(kv_inputs(False, rotary=True), "cache_seqlens", BAD, CAPACITY - 1)
    bad = dict(good, rotary_cos=good["rotary_cos"][:CAPACITY], rotary_sin=good["rotary_sin"][:CAPACITY])
    check_kv_fault(good, bad, "cache_seqlens", CAPACITY - 1, bad_output="finite")


@pytest.mark.parametrize("value", [B + 2, 2**31 - 1, -1])
def test_cache_batch_idx_out_of_range(value):
    good = kv_inputs(False, batch_idx=True, rotary=True)
    check_kv_fault(good, with_value(good, "cache_batch_idx", BAD, value), "cache_batch_idx", value)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("value", [SEQLENS[BAD] + 2, -2])
def test_cache_leftpad_out_of_range(paged, value):
    """Past cache_seqlens + the appended row, or negative."""
    good = kv_inputs(paged, leftpad=True)
    check_kv_fault(good, with_value(good, "cache_leftpad", BAD, value), "cache_leftpad", value)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("value", [NUM_PAGES, NUM_PAGES + 5, 2**31 - 1])
def test_block_table_entry_past_the_pages(num_splits, value):
    """A page the sequence reads (keys 16..31 of 70): read as zero keys."""
    good = kv_inputs(True, num_splits=num_splits)
    bad = with_value(good, "block_table", (BAD, 1), value)
    check_kv_fault(good, bad, "block_table", value, bad_output="cpu",
                   cpu_inputs=with_zero_page(good, ["k_cache", "v_cache"], BAD, 1))


def test_negative_block_table_entry_on_the_appended_page():
    """The page receiving the appended row (key 70): not written, its keys read as zeros."""
    good = kv_inputs(True, rotary=True)
    bad = with_value(good, "block_table", (BAD, SEQLENS[BAD] // PAGE), -3)
    check_kv_fault(good, bad, "block_table", -3, bad_output="finite")


@pytest.mark.skipif(E4M3 is None, reason="torch without float8_e4m3fn")
@pytest.mark.parametrize("fault", ["cache_seqlens", "block_table"])
def test_e4m3_cache(fault):
    """The FP8 path (e4m3 cache under a bf16 q, rows quantized on append)."""
    good = kv_inputs(True, q_dtype=torch.bfloat16, cache_dtype=E4M3, num_splits=3)
    if fault == "cache_seqlens":
        check_kv_fault(good, with_value(good, "cache_seqlens", BAD, CAPACITY), fault, CAPACITY)
    else:
        bad = with_value(good, "block_table", (BAD, 1), NUM_PAGES)
        check_kv_fault(good, bad, fault, NUM_PAGES, bad_output="cpu",
                       cpu_inputs=with_zero_page(good, ["k_cache", "v_cache"], BAD, 1))


# ---- varlen -------------------------------------------------------------------------------------

CU_Q, CU_K = [0, 3, 5, 9, 10], [0, 20, 45, 60, 90]  # 4 sequences; K lengths 20, 25, 15, 30
SEQS = len(CU_Q) - 1
VARLEN_PAGES = 2 * SEQS + 1  # sequence b: pages 1 + 2b, 2 + 2b (page 0 unused)


def varlen_inputs(paged, *, used=False, leftpad=False):
    gen = np.random.default_rng(8)
    x = dict(q=randn(gen, CU_Q[-1], H, D), cu_seqlens_q=i32(CU_Q), cu_seqlens_k=i32(CU_K),
             max_seqlen_q=4, max_seqlen_k=30)
    shape = (VARLEN_PAGES, PAGE, HK, D) if paged else (CU_K[-1], HK, D)
    x["k"], x["v"] = randn(gen, *shape), randn(gen, *shape)
    if paged:
        x["block_table"] = i32([[1 + 2 * b, 2 + 2 * b] for b in range(SEQS)])
    if used:
        x["seqused_k"] = i32([20, 20, 15, 30])
    if leftpad:
        x["leftpad_k"] = i32([3, 5, 0, 2])
    return x


def run_varlen(inputs, device):
    return run(flashattn.flash_attn_varlen_func, inputs, device, return_attn_probs=True)


def check_varlen_fault(good, bad, argument, value=None, *, empty=(BAD,), skipped=(), cpu_inputs=None,
                       sequence=BAD):
    """bad on CUDA, cpu_inputs (default good) on the CPU backend: the sequences in empty get output
    0 and LSE -inf, those in skipped (rows unknown) are not looked at, the others match. sequence:
    the one the fault names (None: two are at fault, either may be named)."""
    clear_device_status()
    out, lse, _ = run_varlen(bad, "cuda")
    expect_fault(argument, sequence, value)
    ref_out, ref_lse, _ = run_varlen(cpu_inputs or good, "cpu")
    for b in range(SEQS):
        rows = slice(CU_Q[b], CU_Q[b + 1])
        what = f"{argument} = {value}: sequence {b}"
        if b in skipped:
            continue
        if b in empty:
            assert_empty(out[rows], lse[:, rows], what)
        else:
            assert_close(out[rows], lse[:, rows], ref_out[rows], ref_lse[:, rows], torch.float16, what)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("value", [26, -4])
def test_seqused_k_out_of_range(paged, value):
    """Past sequence 1's 25 keys, or negative."""
    good = varlen_inputs(paged, used=True)
    check_varlen_fault(good, with_value(good, "seqused_k", BAD, value), "seqused_k", value)


@pytest.mark.parametrize("value", [6, -1])
def test_leftpad_k_out_of_range(value):
    """Past seqused_k (5 of sequence 1's 25 keys are used here), or negative."""
    good = varlen_inputs(False, used=True, leftpad=True)
    good = with_value(good, "seqused_k", BAD, 5)
    check_varlen_fault(good, with_value(good, "leftpad_k", BAD, value), "leftpad_k", value)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("value", [1000, -7])
def test_cu_seqlens_k_out_of_range(paged, value):
    """cu_seqlens_k[2] past the keys or negative: sequences 1 (ends there) and 2 (starts there)."""
    good = varlen_inputs(paged)
    check_varlen_fault(good, with_value(good, "cu_seqlens_k", 2, value), "cu_seqlens_k",
                       empty=(1, 2), sequence=None)


def test_cu_seqlens_k_decreasing():
    """cu_seqlens_k[2] = 10: sequence 1 ends before it starts (sequence 2, keys 10..60, is in
    bounds: a different result, not a fault)."""
    good = varlen_inputs(False)
    check_varlen_fault(good, with_value(good, "cu_seqlens_k", 2, 10), "cu_seqlens_k", 10,
                       skipped=(2,))


@pytest.mark.parametrize("value", [500, -3])
def test_cu_seqlens_q_out_of_range(value):
    """cu_seqlens_q[2] past the rows or negative: sequences 1 and 2 are not computed."""
    good = varlen_inputs(False)
    check_varlen_fault(good, with_value(good, "cu_seqlens_q", 2, value), "cu_seqlens_q",
                       empty=(), skipped=(1, 2), sequence=None)


def test_varlen_block_table_entry_past_the_pages():
    """A page of sequence 1 (keys 16..24) past the pages: read as zero keys."""
    good = varlen_inputs(True)
    bad = with_value(good, "block_table", (BAD, 1), VARLEN_PAGES + 3)
    check_varlen_fault(good, bad, "block_table", VARLEN_PAGES + 3, empty=(),
                       cpu_inputs=with_zero_page(good, ["k", "v"], BAD, 1))
