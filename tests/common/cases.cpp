// The case lists of the sweeps. Sizes are awkward on purpose (seqlens 1, 3, 17, 113, 339, 799,
// a few 4097; sq > sk; head dims that are not powers of two; GQA ratios 1, 2, 7; zero-length
// sequences). The CPU lists add fp32 and an odd head dim; both lists stay small enough for the
// float64 oracle: the whole CPU suite runs in a few minutes on 2 cores.
#include <cstdlib>
#include <algorithm>
#include <random>
#include <tuple>

#include "sweeps.h"

namespace fa_test {

namespace {

Features causal() {
  Features f;
  f.causal = true;
  return f;
}
Features window(int left, int right) {
  Features f;
  f.window_left = left;
  f.window_right = right;
  return f;
}
Features causal_window(int left) {
  Features f = causal();
  f.window_left = left;
  return f;
}
Features with_alibi(Features f, Alibi a) {
  f.alibi = a;
  return f;
}
Features with_softcap(Features f, float cap) {
  f.softcap = cap;
  return f;
}

// ---- seeded random combinations -----------------------------------------------------------
// Each sweep ends with combinations of every feature drawn from a fixed seed (so the list and
// the test names are the same on every run), within a work budget that keeps the oracle fast.
constexpr uint64_t kCombinationSeed = 20261130;
constexpr int kDenseCombinations = 96, kVarlenCombinations = 48, kKVCombinations = 72;
constexpr double kDenseWorkBudget = 6e7;  // b * h * sq * sk * d of one combination

template <class T>
const T& pick(std::mt19937_64& rng, const std::vector<T>& v) {
  return v[size_t(rng() % v.size())];
}
bool chance(std::mt19937_64& rng, int percent) { return int(rng() % 100) < percent; }

Features random_features(std::mt19937_64& rng) {
  Features f;
  f.causal = chance(rng, 35);
  if (chance(rng, 40)) {
    const std::vector<int> sizes = {0, 1, 7, 64, 200};
    f.window_left = chance(rng, 25) ? -1 : pick(rng, sizes);
    f.window_right = f.causal ? 0 : (chance(rng, 30) ? -1 : pick(rng, sizes));
  }
  if (chance(rng, 25)) f.softcap = pick(rng, std::vector<float>{5.0f, 30.0f});
  if (chance(rng, 30)) f.alibi = chance(rng, 50) ? Alibi::per_head : Alibi::per_batch_head;
  if (chance(rng, 10)) f.scale = 0.3f;
  f.lse = !chance(rng, 10);
  return f;
}

std::pair<int, int> random_heads(std::mt19937_64& rng) {
  return pick(rng, std::vector<std::pair<int, int>>{{1, 1}, {2, 1}, {4, 2}, {7, 1}, {6, 3}, {4, 4}});
}

// Head dims of the sweeps: multiples of 8 everywhere, plus an odd one on the CPU.
std::vector<int> head_dims(Device device) {
  std::vector<int> dims = {32, 40, 64, 72, 96, 128, 160, 192, 256};
  if (device == Device::cpu) dims.insert(dims.begin() + 2, 59);
  return dims;
}

// Issue 28's head dims: every head dim from 1 to 256 is served on both devices; on CUDA those
// that are not multiples of 8 run on staged, zero-padded copies (src/api/staging.h).
const std::vector<int> kAnyHeadDims = {1, 8, 59, 80, 111, 200, 256};

// An even rotary dim <= d (0 when d < 2): about half of d, or all of it.
int rotary_dim_for(int d, bool whole) {
  if (d < 2) return 0;
  return whole ? d / 2 * 2 : std::max(2, d / 4 * 2);
}

std::vector<DType> dtypes(Device device) {
  if (device == Device::cpu) return {DType::bf16, DType::f16, DType::f32};
  return {DType::bf16, DType::f16};
}

}  // namespace

// ---------------------------------------------------------------------------------------------

std::vector<DenseCase> dense_cases(Device device) {
  std::vector<DenseCase> v;
  auto add = [&](DType dt, int b, int sq, int sk, int h, int hk, int d, Features f,
                 Layout layout = Layout::contiguous) {
    DenseCase c;
    c.device = device;
    c.dtype = dt;
    c.b = b, c.sq = sq, c.sk = sk, c.h = h, c.hk = hk, c.d = d;
    c.f = f;
    c.layout = layout;
    v.push_back(c);
  };
  // every head dim in both 16-bit types, one of them causal
  for (int d : head_dims(device)) {
    add(DType::bf16, 2, 113, 339, 4, 2, d, Features{});
    add(DType::f16, 2, 113, 339, 4, 2, d, causal());
  }
  // sequence-length pairs (sq > sk included) x masks
  const std::vector<std::pair<int, int>> lengths = {{1, 1},     {1, 339},  {3, 17},   {17, 3},
                                                    {113, 113}, {113, 799}, {799, 113}, {339, 799}};
  const std::vector<Features> masks = {Features{}, causal(),      window(32, 0),
                                       window(-1, 5), window(7, 9), window(0, 0), causal_window(16)};
  int round = 0;
  for (const auto& [sq, sk] : lengths) {
    for (const Features& f : masks) {
      const DType dt = (round++ % 2) ? DType::f16 : DType::bf16;
      add(dt, sq * sk > 50000 ? 1 : 2, sq, sk, 2, 1, 64, f);
    }
  }
  // GQA / MQA ratios 1, 2, 7
  for (auto [h, hk] : std::vector<std::pair<int, int>>{{1, 1}, {2, 2}, {4, 2}, {7, 1}, {14, 2}}) {
    add(DType::f16, 2, 17, 113, h, hk, 128, causal());
    add(DType::bf16, 1, 113, 17, h, hk, 96, window(8, 3));
  }
  // ALiBi (h) and (b, h), with and without masks
  for (Alibi a : {Alibi::per_head, Alibi::per_batch_head}) {
    add(DType::bf16, 2, 113, 339, 4, 2, 64, with_alibi(Features{}, a));
    add(DType::f16, 2, 339, 113, 4, 2, 128, with_alibi(causal(), a));
    add(DType::bf16, 2, 17, 339, 7, 1, 64, with_alibi(window(64, 0), a));
  }
  // softcap, alone and with the other score terms
  add(DType::bf16, 2, 113, 339, 2, 1, 64, with_softcap(Features{}, 30.0f));
  add(DType::f16, 2, 113, 113, 2, 1, 128, with_softcap(causal(), 5.0f));
  add(DType::bf16, 2, 17, 339, 4, 2, 64, with_softcap(with_alibi(window(40, 0), Alibi::per_batch_head), 10.0f));
  // scale, no lse
  {
    Features f = causal();
    f.scale = 0.5f;
    add(DType::bf16, 2, 113, 113, 2, 2, 64, f);
    Features g;
    g.lse = false;
    add(DType::f16, 2, 17, 113, 2, 2, 64, g);
  }
  // non-contiguous strides: padded views, q/k/v slices of a packed qkv buffer
  for (DType dt : dtypes(device)) {
    add(dt, 2, 113, 339, 4, 2, 64, causal(), Layout::padded);
    add(dt, 2, 113, 113, 4, 2, 128, Features{}, Layout::qkv_packed);
    add(dt, 2, 17, 17, 7, 1, 96, causal(), Layout::qkv_packed);
  }
  // fp32 (CPU only), odd head dims included
  if (device == Device::cpu) {
    for (int d : {32, 59, 128, 256}) add(DType::f32, 2, 113, 339, 4, 2, d, causal());
    add(DType::f32, 1, 339, 113, 7, 1, 64, with_softcap(with_alibi(window(16, 4), Alibi::per_head), 20.0f));
  }
  // empty problems: no keys (every row: out 0, lse -inf); no queries
  add(DType::bf16, 2, 3, 0, 2, 1, 64, Features{});
  add(DType::bf16, 2, 0, 17, 2, 1, 64, causal());
  // a few long sequences with small batch and heads
  add(DType::bf16, 1, 4097, 4097, 1, 1, 64, causal());
  add(DType::f16, 2, 1, 4097, 4, 1, 128, Features{});
  add(DType::bf16, 1, 4097, 17, 2, 1, 32, window(8, 8));
  add(DType::f16, 1, 17, 4097, 2, 2, 256, with_alibi(Features{}, Alibi::per_head));
  // any head dim: contiguous, padded strides, packed qkv (strides not multiples of 8 on CUDA)
  for (int d : kAnyHeadDims) {
    add(DType::bf16, 2, 113, 339, 4, 2, d, Features{});
    add(DType::f16, 2, 17, 113, 7, 1, d, with_alibi(causal(), Alibi::per_head), Layout::padded);
    add(DType::bf16, 1, 65, 65, 2, 2, d, window(16, 0), Layout::qkv_packed);
  }
  // seeded combinations
  std::mt19937_64 rng(kCombinationSeed);
  const std::vector<int> lens = {1, 3, 17, 113, 339, 799};
  for (int n = 0; n < kDenseCombinations;) {
    const DType dt = pick(rng, dtypes(device));
    const int d = pick(rng, head_dims(device));
    const auto [h, hk] = random_heads(rng);
    const int b = 1 + int(rng() % 3), sq = pick(rng, lens), sk = pick(rng, lens);
    const Features f = random_features(rng);
    const Layout layout = sq == sk && chance(rng, 30) ? Layout::qkv_packed
                                                      : (chance(rng, 25) ? Layout::padded : Layout::contiguous);
    if (double(b) * h * sq * sk * d > kDenseWorkBudget) continue;
    add(dt, b, sq, sk, h, hk, d, f, layout);
    ++n;
  }
  // FP8 (e4m3 q, k, v; bf16 out): both descale kinds, the masks, GQA, staged and strided layouts;
  // at d = 128 and 256 (the warpspec kernel's FP8 products, D-75) several query tiles, partial
  // key tiles, sq > sk and the score rules too
  for (const auto& [fp8, d, f, layout, sq, sk] : std::vector<std::tuple<Fp8, int, Features, Layout, int, int>>{
           {Fp8::per_head, 64, Features{}, Layout::contiguous, 113, 339},
           {Fp8::per_head, 128, causal(), Layout::contiguous, 113, 339},
           {Fp8::per_tensor, 256, window(32, 0), Layout::contiguous, 113, 339},
           {Fp8::per_head, 96, with_softcap(with_alibi(Features{}, Alibi::per_head), 15.0f), Layout::padded, 113, 339},
           {Fp8::per_tensor, 128, causal(), Layout::qkv_packed, 113, 113},
           {Fp8::per_head, 59, causal(), Layout::contiguous, 113, 339},
           {Fp8::per_head, 128, Features{}, Layout::contiguous, 300, 517},
           {Fp8::per_tensor, 256, causal(), Layout::contiguous, 260, 200},
           {Fp8::per_head, 128, with_softcap(with_alibi(Features{}, Alibi::per_head), 15.0f), Layout::padded, 129, 260},
           {Fp8::per_head, 256, Features{}, Layout::contiguous, 64, 1000},
           {Fp8::per_tensor, 128, window(40, 17), Layout::contiguous, 385, 385}}) {
    DenseCase c;
    c.device = device;
    c.dtype = DType::bf16;
    c.b = 2, c.sq = sq, c.sk = sk, c.h = 4, c.hk = 2, c.d = d;
    c.f = f;
    c.layout = layout;
    c.fp8 = fp8;
    v.push_back(c);
  }
  return v;
}

// ---------------------------------------------------------------------------------------------

std::vector<VarlenCase> varlen_cases(Device device) {
  std::vector<VarlenCase> v;
  const std::vector<std::pair<std::vector<int>, std::vector<int>>> sets = {
      {{1, 3, 17, 113, 0, 339}, {1, 17, 113, 3, 5, 339}},  // mixed, sq > sk, an empty query set
      {{1, 1, 1, 1, 1}, {799, 0, 17, 256, 1}},             // decode-like, an empty key set
      {{113, 17, 339}, {113, 339, 339}},                    // prefill
      {{0, 5, 3}, {4, 0, 9}},                               // tiny, zero lengths on both sides
  };
  const std::vector<Features> features = {Features{},
                                          causal(),
                                          window(16, 0),
                                          with_alibi(causal(), Alibi::per_batch_head),
                                          with_softcap(window(-1, 3), 15.0f),
                                          with_alibi(Features{}, Alibi::per_head),
                                          causal_window(5)};
  const std::vector<std::pair<int, int>> heads = {{4, 1}, {2, 2}, {7, 1}, {4, 2}};
  const std::vector<int> dims = {64, 128, 40, 96, 256};
  int i = 0;
  for (const auto& [sq, sk] : sets) {
    for (int page : {0, 1, 16, 256}) {
      for (bool trimmed : {false, true}) {
        VarlenCase c;
        c.device = device;
        c.dtype = (i % 2) ? DType::f16 : DType::bf16;
        c.seqlens_q = sq;
        c.seqlens_k = sk;
        c.h = heads[size_t(i) % heads.size()].first;
        c.hk = heads[size_t(i) % heads.size()].second;
        c.d = dims[size_t(i) % dims.size()];
        c.f = features[size_t(i) % features.size()];
        c.seqused_k = trimmed;
        c.leftpad_k = trimmed && (i % 3 != 0);
        c.page_size = page;
        c.layout = (i % 5 == 2) ? Layout::padded : Layout::contiguous;
        v.push_back(c);
        ++i;
      }
    }
  }
  if (device == Device::cpu) {
    VarlenCase c;
    c.device = device;
    c.dtype = DType::f32;
    c.seqlens_q = {17, 1, 113};
    c.seqlens_k = {339, 3, 113};
    c.h = 7, c.hk = 1, c.d = 59;
    c.f = causal();
    c.seqused_k = c.leftpad_k = true;
    c.page_size = 16;
    v.push_back(c);
  }
  // any head dim: packed and paged keys, seqused_k and leftpad_k
  for (int d : kAnyHeadDims) {
    for (int page : {0, 16}) {
      VarlenCase c;
      c.device = device;
      c.dtype = page ? DType::f16 : DType::bf16;
      c.seqlens_q = {17, 1, 0, 113};
      c.seqlens_k = {339, 3, 17, 113};
      c.h = 4, c.hk = 2, c.d = d;
      c.f = page ? causal() : with_softcap(Features{}, 10.0f);
      c.seqused_k = c.leftpad_k = page > 0;
      c.page_size = page;
      c.layout = page ? Layout::contiguous : Layout::padded;
      v.push_back(c);
    }
  }
  // seeded combinations
  std::mt19937_64 rng(kCombinationSeed + 1);
  const std::vector<int> lens = {0, 1, 3, 17, 113, 339};
  for (int n = 0; n < kVarlenCombinations; ++n) {
    VarlenCase c;
    c.device = device;
    c.dtype = pick(rng, dtypes(device));
    const int batch = 1 + int(rng() % 5);
    for (int b = 0; b < batch; ++b) {
      c.seqlens_q.push_back(pick(rng, lens));
      c.seqlens_k.push_back(pick(rng, lens));
    }
    std::tie(c.h, c.hk) = random_heads(rng);
    c.d = pick(rng, head_dims(device));
    c.f = random_features(rng);
    c.seqused_k = chance(rng, 40);
    c.leftpad_k = chance(rng, 40);
    c.page_size = pick(rng, std::vector<int>{0, 0, 1, 16, 256});
    c.layout = chance(rng, 30) ? Layout::padded : Layout::contiguous;
    v.push_back(c);
  }
  // FP8: e4m3 q, k, v, packed (also trimmed: NaN rows past the keys) or paged; paged K/V in
  // e4m3 under a bf16 q (chunked prefill over an FP8 cache)
  for (const auto& [fp8, page, kv_only, trimmed] : std::vector<std::tuple<Fp8, int, bool, bool>>{
           {Fp8::per_head, 0, false, false}, {Fp8::per_tensor, 16, false, true},
           {Fp8::per_head, 16, true, false}, {Fp8::per_tensor, 1, true, true},
           {Fp8::per_tensor, 0, false, true}}) {
    VarlenCase c;
    c.device = device;
    c.dtype = DType::bf16;
    c.seqlens_q = {1, 17, 113, 0, 64};
    c.seqlens_k = {339, 17, 113, 5, 200};
    c.h = 4, c.hk = 2, c.d = 128;
    c.f = causal();
    c.seqused_k = trimmed;
    c.leftpad_k = trimmed;
    c.page_size = page;
    c.fp8 = fp8;
    c.fp8_kv_only = kv_only;
    v.push_back(c);
  }
  return v;
}

// ---------------------------------------------------------------------------------------------

namespace {
KVCase decode(Device device, DType dt, int b, int h, int hk, int d, int capacity, int s_new) {
  KVCase c;
  c.device = device;
  c.dtype = dt;
  c.b = b, c.sq = 1, c.h = h, c.hk = hk, c.d = d;
  c.capacity = capacity;
  c.s_new = s_new;
  return c;
}
}  // namespace

std::vector<KVCase> kvcache_cases(Device device) {
  std::vector<KVCase> v;
  auto add = [&](KVCase c) {
    c.seed = uint64_t(v.size()) + 1;
    v.push_back(c);
  };
  const DType bf = DType::bf16, fp = DType::f16;
  // decode, with and without append, every indexing feature
  add(decode(device, bf, 3, 4, 2, 64, 113, 0));
  {
    KVCase c = decode(device, fp, 4, 7, 1, 128, 339, 1);
    add(c);
    c.batch_idx = true;
    add(c);
    c.leftpad = true;
    add(c);
    c.batch_idx = false;
    c.dtype = bf;
    add(c);
  }
  // paged caches: page sizes 1, 16, 256, shuffled and in order
  for (int page : {1, 16, 256}) {
    KVCase c = decode(device, page == 16 ? fp : bf, 3, 4, 1, 64, page == 256 ? 799 : 339, 1);
    c.page_size = page;
    c.leftpad = page != 1;
    add(c);
  }
  {
    KVCase c = decode(device, bf, 2, 2, 2, 128, 113, 0);
    c.page_size = 16;
    c.shuffled_pages = false;
    add(c);
  }
  // rotary: interleaved and GPT-NeoX, rotary_dim < d and == d, per-row and shared q positions
  {
    KVCase c = decode(device, bf, 2, 4, 2, 64, 339, 3);
    c.sq = 3;
    c.rotary = Rotary::interleaved;
    c.rotary_dim = 32;
    c.f = causal();
    add(c);
    c.rotary_dim = 64;
    c.f = Features{};  // non-causal: every query rotated at cache_seqlens
    add(c);
    c.rotary = Rotary::neox;
    c.rotary_dim = 32;
    c.dtype = fp;
    add(c);
  }
  {
    KVCase c = decode(device, fp, 3, 7, 1, 72, 113, 2);
    c.sq = 5;  // sq > s_new
    c.rotary = Rotary::neox;
    c.rotary_dim = 40;
    c.f = window(8, 0);
    c.leftpad = true;
    add(c);
    c.page_size = 16;
    c.leftpad = false;
    c.rotary = Rotary::interleaved;
    c.f = causal();
    add(c);
  }
  {
    KVCase c = decode(device, bf, 2, 4, 1, 128, 339, 17);
    c.sq = 17;
    c.page_size = 16;
    c.rotary = Rotary::neox;
    c.rotary_dim = 64;
    c.f = causal();
    add(c);
  }
  // q, k_new, v_new as slices of one packed qkv buffer
  {
    KVCase c = decode(device, bf, 2, 4, 2, 64, 113, 3);
    c.sq = 3;
    c.layout = Layout::qkv_packed;
    c.rotary = Rotary::neox;
    c.rotary_dim = 64;
    c.f = causal();
    add(c);
    c.rotary = Rotary::none;
    c.dtype = fp;
    c.batch_idx = true;
    add(c);
  }
  // a full cache without cache_seqlens
  {
    KVCase c = decode(device, bf, 2, 4, 2, 64, 256, 0);
    c.with_seqlens = false;
    c.sq = 17;
    c.f = causal();
    add(c);
    c.leftpad = true;
    c.page_size = 16;
    c.f = Features{};
    add(c);
  }
  // masks and score terms
  {
    KVCase c = decode(device, fp, 3, 4, 2, 64, 113, 0);
    c.sq = 17;  // sequence 1 has no keys: causal rows see nothing
    c.f = with_alibi(causal(), Alibi::per_batch_head);
    add(c);
    c.f = with_softcap(Features{}, 20.0f);
    c.s_new = 1;
    c.sq = 1;
    add(c);
    c = decode(device, bf, 2, 2, 1, 128, 799, 1);
    c.f = window(32, 0);
    add(c);
    c.sq = 17;
    c.s_new = 17;
    c.f = window(-1, 2);
    add(c);
    c.f = with_alibi(causal_window(40), Alibi::per_head);
    c.leftpad = true;
    add(c);
  }
  // GQA packing on (sq <= 64) and off (sq > 64)
  {
    KVCase c = decode(device, bf, 2, 14, 2, 64, 339, 0);
    c.sq = 113;
    c.f = causal();
    add(c);
    c.sq = 3;
    add(c);
  }
  // split counts and caller-owned workspace
  for (int splits : {1, 3, 7}) {
    KVCase c = decode(device, fp, 2, 4, 1, 128, 799, 1);
    c.num_splits = splits;
    c.caller_workspace = splits == 3;
    add(c);
  }
  {
    KVCase c = decode(device, bf, 2, 4, 1, 64, 339, 1);
    c.rotary = Rotary::interleaved;
    c.rotary_dim = 32;
    c.num_splits = 3;
    c.caller_workspace = true;
    add(c);
  }
  // head dims
  for (int d : head_dims(device)) {
    KVCase c = decode(device, (d % 3) ? bf : fp, 2, 4, 2, d, 113, 1);
    add(c);
  }
  // fp32 (CPU only)
  if (device == Device::cpu) {
    KVCase c = decode(device, DType::f32, 3, 7, 1, 59, 113, 2);
    c.sq = 2;
    c.rotary = Rotary::neox;
    c.rotary_dim = 20;
    c.f = causal();
    c.leftpad = true;
    c.page_size = 16;
    add(c);
    c.page_size = 0;
    c.batch_idx = true;
    c.rotary = Rotary::interleaved;
    c.num_splits = 3;
    add(c);
  }
  // a long cache
  {
    KVCase c = decode(device, bf, 1, 2, 1, 128, 4097, 1);
    add(c);
    c.page_size = 256;
    c.dtype = fp;
    c.f = causal();
    c.sq = 4;
    c.s_new = 4;
    add(c);
  }
  // the deep decode pipeline on sm_90 (make_plan: few units, split walks of at least
  // kDeepDecodeMinTiles tiles): 8 units in 15 splits of 9 tiles (the warps split the keys) and
  // 6 units in 16 splits of 3 tiles (the warps split the head dim)
  add(decode(device, bf, 2, 8, 4, 128, 8191, 1));
  add(decode(device, fp, 3, 4, 2, 128, 3000, 0));
  // the heads-split decode kernel (the GPU sweep forced onto Kernel::heads;
  // CUDA launch_splitheads): unsplit, contiguous, the units of a sequence whole groups of four,
  // each with its own KV head: packed GQA (one query) and MHA (several queries)
  {
    KVCase c = decode(device, bf, 3, 16, 4, 128, 339, 1);
    c.num_splits = 1;
    c.leftpad = true;
    c.batch_idx = true;
    c.f = with_alibi(causal(), Alibi::per_batch_head);
    add(c);
    c = decode(device, fp, 2, 8, 8, 64, 799, 5);
    c.num_splits = 1;
    c.sq = 5;
    c.f = window(30, 0);
    c.rotary = Rotary::neox;
    c.rotary_dim = 64;
    add(c);
    c = decode(device, bf, 4, 32, 8, 96, 113, 0);
    c.num_splits = 1;
    c.f = with_softcap(Features{}, 20.0f);
    add(c);
    c = decode(device, fp, 2, 16, 4, 128, 64, 0);
    c.num_splits = 1;
    c.with_seqlens = false;
    c.f = window(5, 0);
    add(c);
  }
  // any head dim: append with rotary into a paged cache (split), into a contiguous cache
  // through cache_batch_idx and leftpad, and q/k_new/v_new slices of one packed buffer
  for (int d : kAnyHeadDims) {
    KVCase c = decode(device, bf, 3, 4, 2, d, 339, 1);
    c.page_size = 16;
    c.rotary = d >= 2 ? Rotary::neox : Rotary::none;
    c.rotary_dim = rotary_dim_for(d, false);
    c.num_splits = 3;
    c.caller_workspace = true;
    c.f = causal();
    add(c);
    c = decode(device, fp, 2, 7, 1, d, 113, 3);
    c.sq = 3;
    c.page_size = 0;
    c.batch_idx = true;
    c.leftpad = true;
    c.rotary = d >= 2 ? Rotary::interleaved : Rotary::none;
    c.rotary_dim = rotary_dim_for(d, true);
    c.f = with_alibi(causal(), Alibi::per_batch_head);
    add(c);
    c = decode(device, bf, 2, 4, 2, d, 113, 2);
    c.sq = 2;
    c.layout = Layout::qkv_packed;
    c.f = window(8, 0);
    add(c);
  }
  // seeded combinations
  std::mt19937_64 rng(kCombinationSeed + 2);
  for (int n = 0; n < kKVCombinations; ++n) {
    KVCase c;
    c.device = device;
    c.dtype = pick(rng, dtypes(device));
    c.b = 1 + int(rng() % 4);
    c.sq = pick(rng, std::vector<int>{1, 1, 2, 3, 17});
    std::tie(c.h, c.hk) = random_heads(rng);
    c.d = pick(rng, head_dims(device));
    c.capacity = pick(rng, std::vector<int>{17, 113, 339, 799});
    c.with_seqlens = !chance(rng, 10);
    c.s_new = c.with_seqlens ? pick(rng, std::vector<int>{0, 1, c.sq}) : 0;
    c.leftpad = chance(rng, 35);
    c.page_size = pick(rng, std::vector<int>{0, 0, 1, 16, 256});
    if (!c.with_seqlens && c.page_size > 0 && c.capacity % c.page_size != 0) c.page_size = 0;
    c.batch_idx = c.page_size == 0 && chance(rng, 35);
    if (c.with_seqlens && chance(rng, 45)) {
      c.rotary = chance(rng, 50) ? Rotary::interleaved : Rotary::neox;
      c.rotary_dim = std::max(2, int(rng() % (c.d / 2 + 1)) * 2);  // any even size <= d
    }
    c.num_splits = pick(rng, std::vector<int>{0, 0, 1, 2, 3, 5});
    c.caller_workspace = chance(rng, 20);
    c.layout = (c.s_new == c.sq && chance(rng, 30)) ? Layout::qkv_packed : Layout::contiguous;
    c.f = random_features(rng);
    add(c);
  }
  // FP8 caches: bf16 and fp16 q, e4m3 q; contiguous and paged; append (with rotary) quantizes
  for (int i = 0; i < 8; ++i) {
    KVCase c = decode(device, i % 3 == 1 ? fp : bf, 3, 8, 2, i % 2 ? 64 : 128, 339, i % 4 == 3 ? 0 : 1);
    c.fp8_cache = i % 2 ? Fp8::per_tensor : Fp8::per_head;
    c.fp8_q = i % 3 == 2;
    c.page_size = std::vector<int>{0, 16, 1, 0, 256, 16, 0, 3}[size_t(i)];
    c.leftpad = i == 4;
    c.batch_idx = i == 6;
    if (i == 5 || i == 7) c.sq = 4, c.s_new = c.s_new ? 4 : 0, c.f = causal();
    if (!c.fp8_q && (i == 1 || i == 5)) c.rotary = Rotary::neox, c.rotary_dim = 32;
    if (i == 0) c.f = with_softcap(with_alibi(Features{}, Alibi::per_head), 30.0f);
    c.num_splits = i == 3 ? 5 : 0;
    add(c);
  }
  // FP8 caches on each head dim's CUDA decode pipeline (launch_template.h run_fwd_fp8): the fp8
  // pipeline at d = 32 and 256 (64 and 128 above), the standard one at 96 and 192, and at 120,
  // whose 120-byte rows are not 16-byte aligned.
  for (int d : {32, 96, 120, 192, 256}) {
    KVCase c = decode(device, DType::bf16, 2, 8, 2, d, 339, d == 32);
    c.fp8_cache = Fp8::per_head;
    c.page_size = d == 256 ? 16 : 0;
    c.num_splits = d == 32 ? 3 : 0;
    add(c);
  }
  // FP8 caches under GQA packing of other sizes: 8 heads of one query (8 rows), 3 causal queries
  // of 2 heads (6 rows; paged, split), 3 queries of 3 heads (9 rows).
  for (const auto& [h, sq, page] : std::vector<std::tuple<int, int, int>>{{16, 1, 0}, {4, 3, 16}, {6, 3, 0}}) {
    KVCase c = decode(device, DType::bf16, 2, h, 2, 128, 339, sq);
    c.sq = sq;
    if (sq > 1) c.f = causal();
    c.fp8_cache = Fp8::per_head;
    c.page_size = page;
    c.num_splits = h == 4 ? 3 : 0;
    add(c);
  }
  return v;
}

std::vector<KVCase> kvcache_split_cases(Device device) {
  std::vector<KVCase> v;
  auto add = [&](KVCase c) {
    c.seed = 100 + uint64_t(v.size());
    v.push_back(c);
  };
  add(decode(device, DType::bf16, 2, 4, 1, 64, 799, 1));
  {
    KVCase c = decode(device, DType::f16, 1, 1, 1, 128, 4097, 0);
    c.f = window(300, 0);
    add(c);
  }
  {
    KVCase c = decode(device, DType::bf16, 2, 4, 2, 96, 339, 17);
    c.sq = 17;
    c.f = causal();
    c.page_size = 16;
    c.leftpad = true;
    c.rotary = Rotary::neox;
    c.rotary_dim = 32;
    add(c);
  }
  {
    KVCase c = decode(device, DType::f16, 3, 7, 1, 64, 339, 1);
    c.f = with_softcap(with_alibi(Features{}, Alibi::per_batch_head), 12.0f);
    c.batch_idx = true;
    add(c);
  }
  if (device == Device::cpu) {
    KVCase c = decode(device, DType::f32, 2, 2, 1, 59, 339, 1);
    add(c);
  }
  for (int d : {59, 111}) {  // staged on CUDA (head dim not a multiple of 8)
    KVCase c = decode(device, DType::bf16, 2, 4, 1, d, 799, 1);
    c.f = causal();
    add(c);
  }
  {
    KVCase c = decode(device, DType::bf16, 2, 8, 2, 128, 799, 1);  // FP8 cache
    c.fp8_cache = Fp8::per_head;
    c.page_size = 16;
    add(c);
  }
  if (device == Device::cpu) {  // the CPU decode walk (D-72): GQA groups of 4, 5, 3 and 8 heads
    add(decode(device, DType::bf16, 3, 32, 8, 128, 1001, 1));
    KVCase f32 = decode(device, DType::f32, 2, 10, 2, 64, 777, 0);
    f32.leftpad = true;
    add(f32);
    KVCase local = decode(device, DType::f16, 2, 6, 2, 96, 913, 1);
    local.f = window(100, 0);
    add(local);
    KVCase gather = decode(device, DType::bf16, 3, 8, 1, 128, 517, 2);
    gather.batch_idx = true;
    add(gather);
  }
  return v;
}

std::vector<KVCase> kvcache_paging_cases(Device device) {
  std::vector<KVCase> v;
  auto add = [&](KVCase c) {
    c.seed = 200 + uint64_t(v.size());
    v.push_back(c);
  };
  add(decode(device, DType::bf16, 3, 4, 1, 64, 339, 1));
  {
    KVCase c = decode(device, DType::f16, 2, 4, 2, 128, 113, 3);
    c.sq = 3;
    c.f = causal();
    c.leftpad = true;
    c.rotary = Rotary::interleaved;
    c.rotary_dim = 64;
    add(c);
  }
  {
    KVCase c = decode(device, DType::bf16, 2, 7, 1, 64, 512, 0);
    c.with_seqlens = false;  // capacity a multiple of every page size
    c.sq = 17;
    c.f = window(20, 0);
    add(c);
  }
  {
    KVCase c = decode(device, DType::bf16, 2, 2, 2, 64, 339, 1);
    c.num_splits = 3;
    c.f = with_alibi(Features{}, Alibi::per_head);
    add(c);
  }
  // The benchmark's batch 1 x 4k decode (h 32, hk 8, d 128): 32 split-dims CTAs per KV head
  // paged, the deep pipeline on sm_90 contiguous.
  add(decode(device, DType::bf16, 1, 32, 8, 128, 4096, 1));
  {
    KVCase c = decode(device, DType::f16, 2, 4, 2, 59, 339, 2);  // staged on CUDA
    c.sq = 2;
    c.f = causal();
    c.rotary = Rotary::neox;
    c.rotary_dim = 58;
    add(c);
  }
  {
    KVCase c = decode(device, DType::bf16, 2, 8, 2, 128, 339, 1);  // FP8 cache
    c.fp8_cache = Fp8::per_head;
    add(c);
  }
  if (device == Device::cpu) {  // the CPU decode walk (D-72): pages cut its key blocks
    add(decode(device, DType::bf16, 2, 12, 3, 128, 517, 1));
    KVCase mha = decode(device, DType::f32, 3, 8, 8, 64, 203, 0);
    mha.num_splits = 2;
    add(mha);
    KVCase half = decode(device, DType::f16, 2, 20, 4, 80, 389, 1);
    half.f = window(70, 0);
    add(half);
  }
  return v;
}

// Chunked prefill: a chunk of queries (more than a decode tile, so prefill kernels serve it)
// over a contiguous or paged cache; the warpspec kernel's TMA loads of caches and pages (D-81).
std::vector<KVCase> kvcache_chunked_cases(Device device) {
  std::vector<KVCase> v;
  auto add = [&](KVCase c) {
    c.seed = 300 + uint64_t(v.size());
    v.push_back(c);
  };
  auto chunk = [&](DType dt, int b, int sq, int h, int hk, int d, int capacity, int s_new, Features f) {
    KVCase c = decode(device, dt, b, h, hk, d, capacity, s_new);
    c.sq = sq;
    c.f = f;
    return c;
  };
  {
    KVCase c = chunk(DType::bf16, 2, 100, 4, 2, 128, 339, 0, causal());  // pages of 16, shuffled
    c.page_size = 16;
    add(c);
    c.fp8_cache = Fp8::per_head;  // e4m3 q, k and v: warpspec's FP8 products
    c.fp8_q = true;
    add(c);
  }
  {
    KVCase c = chunk(DType::f16, 2, 130, 2, 2, 128, 339, 30, causal());  // appended chunk, contiguous
    c.batch_idx = true;
    add(c);
  }
  {
    KVCase c = chunk(DType::bf16, 1, 80, 4, 1, 256, 339, 0, window(40, 0));
    c.page_size = 32;
    add(c);
  }
  {
    KVCase c = chunk(DType::bf16, 2, 70, 2, 2, 128, 512, 0, with_alibi(Features{}, Alibi::per_head));
    c.with_seqlens = false;  // every row full
    c.page_size = 256;
    c.shuffled_pages = false;
    add(c);
  }
  {
    KVCase c = chunk(DType::bf16, 2, 96, 4, 2, 128, 339, 0, causal());
    c.page_size = 16;
    c.leftpad = true;  // keys off the 16-row slabs: the gathering kernels
    add(c);
  }
  {
    KVCase c = chunk(DType::bf16, 2, 100, 2, 1, 64, 339, 0, with_softcap(causal(), 30.0f));
    c.page_size = 48;
    add(c);
  }
  return v;
}

}  // namespace fa_test
