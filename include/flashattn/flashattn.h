// flashattn: exact attention the FlashAttention-2 way, forward/inference path.
//
// Public C++ API. Every entry point validates all of its arguments before it touches any
// output; a failed check throws flashattn::Error whose message names the argument, the rule
// and the value seen. Semantics follow FlashAttention-2 (see README.md, "Semantics").
// Sizes (and sums such as seqlen_q + seqlen_k) must stay below 2^31, and a view's bytes within
// the address space and below 2^62 from its lowest to its highest element. A tensor the call writes
// (out, softmax_lse, k_cache/v_cache when appending, the workspace) must not share memory with
// another argument or with itself. Values inside index tensors are checked when they are in
// host memory; in device memory they are not read on the host (no synchronisation): the kernels
// check them instead (check_device_status, AttentionOptions::checked).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>

// FLASHATTN_API marks what libflashattn.so exports: everything else in the library (its own
// internals, and the static CUDA runtime and any static C++ runtime linked into it) is hidden
// (-fvisibility=hidden plus the linker version script cmake/flashattn.map), so that no symbol of
// the library interposes on, or is interposed by, another copy of those runtimes in the same
// process (docs/DECISIONS.md D-46).
#if defined(_WIN32)
#define FLASHATTN_API
#else
#define FLASHATTN_API __attribute__((visibility("default")))
#endif

namespace flashattn {

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

// Thrown on invalid input (kind = invalid_argument / type_error) and on backend failures
// (kind = runtime: a CUDA error, a CPU worker thread that could not be started). Python maps
// invalid_argument -> ValueError, type_error -> TypeError.
class FLASHATTN_API Error : public std::runtime_error {
 public:
  enum class Kind { invalid_argument, type_error, unsupported, runtime };
  Error(Kind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

// ---------------------------------------------------------------------------------------------
// Tensor: a non-owning strided view. Strides are in elements. An undefined (default) Tensor
// stands for "not given" wherever an argument is optional.
// ---------------------------------------------------------------------------------------------

// e4m3: FP8 (float8_e4m3fn: 1 sign, 4 exponent, 3 mantissa bits, max 448, no infinities), a
// storage type only: q, k, v or a KV cache in e4m3 are scaled by their descale factors
// (AttentionOptions) and computed in bf16/fp16 (docs/DECISIONS.md D-64).
enum class DType { f16, bf16, f32, i32, e4m3 };
enum class Device { cpu, cuda };

constexpr int kMaxDims = 4;

struct FLASHATTN_API Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int device_index = 0;
  int ndim = 0;
  int64_t shape[kMaxDims] = {0, 0, 0, 0};
  int64_t stride[kMaxDims] = {0, 0, 0, 0};

  bool defined() const { return ndim > 0 || data != nullptr; }
  int64_t numel() const;
  int64_t size(int dim) const { return shape[dim < 0 ? dim + ndim : dim]; }
  bool is_contiguous() const;

  // A row-major contiguous view of `data` with the given shape (1 to 4 dims).
  static Tensor contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                           Device device = Device::cpu, int device_index = 0);
  // A view with explicit strides (elements).
  static Tensor strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                        std::initializer_list<int64_t> strides, Device device = Device::cpu,
                        int device_index = 0);
};

FLASHATTN_API const char* dtype_name(DType dtype);
FLASHATTN_API const char* device_name(Device device);
FLASHATTN_API size_t dtype_size(DType dtype);
FLASHATTN_API std::string describe(const Tensor& t);  // "bf16 cuda:0 (2, 128, 8, 64) strides (…)"

// ---------------------------------------------------------------------------------------------
// Options shared by every forward call
// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// Kernels. Planning chooses the kernel of a call (Plan::kernel, docs/ARCHITECTURE.md has the
// table); tests and timing can force one through AttentionOptions::kernel_override or the
// environment variable FLASHATTN_KERNEL (read once; see kernel_override_from_env).
// ---------------------------------------------------------------------------------------------

enum class Kernel {
  automatic,   // (override only) the library's choice
  cpu,         // the CPU backend
  mma,         // CUDA prefill, mma.sync (sm_80 and newer; split-KV prefill)
  wgmma,       // CUDA prefill, warpgroup MMAs (sm_90)
  warpspec,    // CUDA prefill, warp-specialised: TMA producer, two ping-pong consumers (sm_90, dense)
  splitkeys,   // CUDA decode: the four warps split each K/V tile's keys
  deep,        // CUDA decode: splitkeys on the deep K/V pipeline (sm_90, few units)
  dims,        // CUDA decode: the warps split the head dim (short split walks)
  persistent,  // CUDA decode: splitkeys on a persistent grid
  heads,       // CUDA decode: each warp computes one KV head whole
};
FLASHATTN_API const char* kernel_name(Kernel kernel);  // "wgmma", ...; "automatic"

enum class WgmmaTile { automatic, wide, narrow, narrow96 };
enum class CpuKernels { automatic, portable, neon, avx2, avx512, avx512bf16, amx };  // the CPU backend's highest kernel set
enum class TileOrder { automatic, per_unit, heavy_first };

// For tests and timing. A forced kernel runs every call it serves; a call it does not serve
// (a decode kernel for prefill, a kernel not compiled for the head dim, ...) takes the
// automatic choice. Results never depend on the override beyond rounding.
struct KernelOverride {
  Kernel kernel = Kernel::automatic;
  WgmmaTile wgmma_tile = WgmmaTile::automatic;  // where that tile is compiled for the head dim
  TileOrder tile_order = TileOrder::automatic;  // order of the prefill query tiles
  // The warpspec kernel's grid: 0 one CTA per SM, each taking query tiles in turn (persistent);
  // n > 0 at most n such CTAs (tests); -1 one CTA per query tile.
  int prefill_ctas = 0;
  bool cluster_combine = true;       // false: split decode merges in the combine kernel
  bool programmatic_launch = true;   // false: no programmatic dependent launches (sm_90)
  // Tests only, read from FLASHATTN_KERNEL alone: CPU calls run on the zero-padded copies that
  // CUDA calls whose tensors the kernels cannot read in place use (src/api/staging.h).
  bool stage_on_cpu = false;
  // Tests only, read from FLASHATTN_KERNEL alone: caps the CPU backend's kernel set (src/cpu/kernels.h).
  CpuKernels cpu_kernels = CpuKernels::automatic;
  // Read from FLASHATTN_KERNEL alone (",checked=on"): every call runs as with
  // AttentionOptions::checked, whatever its options say.
  bool checked = false;
};

// FLASHATTN_KERNEL=<kernel>[,tile=wide|narrow|narrow96][,order=per_unit|heavy_first][,grid=persistent|tiles|<n>]
// [,combine=kernel][,pdl=off][,stage=cpu][,cpu=portable|neon|avx2|avx512|avx512bf16|amx][,checked=on], read once per
// process; unset or empty: the default override.
// Throws Error(invalid_argument) naming the variable for a value it cannot parse.
FLASHATTN_API const KernelOverride& kernel_override_from_env();

struct AttentionOptions {
  // Multiplies q·k before softmax. Unset: 1/sqrt(head_dim).
  std::optional<float> softmax_scale;
  // Causal mask aligned to the bottom-right corner: query i sees key j iff j <= i + sk - sq.
  bool causal = false;
  // Local (sliding window) attention; -1 = unbounded on that side, as is a left side >=
  // seqlen_k or a right side >= seqlen_q. With causal, the right side is forced to 0 (as in
  // FlashAttention-2).
  int window_left = -1;
  int window_right = -1;
  // > 0: scores become softcap * tanh(score * scale / softcap), before masking.
  float softcap = 0.0f;
  // fp32 slopes, shape (h) or (b, h): score -= slope * |i + sk - sq - j| (after scaling).
  Tensor alibi_slopes;
  // Optional fp32 output of the natural-log sum-exp per row: (b, h, sq) for dense and
  // kv-cache calls, (h, total_q) for varlen. A row that sees no key gets -inf (output 0).
  Tensor softmax_lse;
  // cudaStream_t for the CUDA backend (nullptr = the legacy default stream). Ignored on CPU.
  void* stream = nullptr;
  // CPU backend threads; 0 = all hardware threads.
  int num_threads = 0;
  // Forces a kernel (tests, timing); unset: kernel_override_from_env().
  std::optional<KernelOverride> kernel_override;
  // CUDA: after its launches the call waits for the stream and throws the first index fault its
  // kernels met (check_device_status). Off by default: the default path never synchronises. Also
  // on for every call with FLASHATTN_KERNEL=...,checked=on.
  bool checked = false;
  // FP8 (e4m3) tensors: the real value of a stored element x is descale * x. fp32, a scalar
  // (shape () or (1)) or one factor per (batch, KV head): shape (b, hk). Unset: 1. q_descale is
  // given only with an e4m3 q, k_descale / v_descale only with e4m3 k / v (or caches). With an
  // e4m3 KV cache, k_new / v_new (q's dtype) are quantized into it with these factors:
  // stored = e4m3(x / descale), rounded to nearest even, saturated at +-448.
  Tensor q_descale;
  Tensor k_descale;
  Tensor v_descale;
};

// FP8 dtypes of a call:
//   prefill (forward, forward_varlen): q, k, v all e4m3, out bf16;
//   kv cache: k_cache / v_cache e4m3 with q bf16 or fp16 (out q's dtype) or q e4m3 (out bf16);
//   k_new / v_new have out's dtype. softmax_lse stays fp32.

// ---------------------------------------------------------------------------------------------
// Dense: q (b, sq, h, d); k, v (b, sk, hk, d); out (b, sq, h, d). h % hk == 0.
// ---------------------------------------------------------------------------------------------

FLASHATTN_API void forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                           const AttentionOptions& options = {});

// ---------------------------------------------------------------------------------------------
// Variable length: q (total_q, h, d) packed by cu_seqlens_q (b + 1, int32).
// k, v (total_k, hk, d) packed by cu_seqlens_k, or, with block_table, a paged cache
// (num_pages, page_size, hk, d) where cu_seqlens_k gives only the lengths.
// ---------------------------------------------------------------------------------------------

struct VarlenArgs {
  Tensor cu_seqlens_q;  // (b + 1) int32, required; from 0 up to total_q (every row of q used)
  Tensor cu_seqlens_k;  // (b + 1) int32, required
  int max_seqlen_q = 0;  // upper bound of the per-sequence query lengths
  int max_seqlen_k = 0;  // upper bound of the per-sequence key lengths
  Tensor seqused_k;     // (b) int32: only the first seqused_k[b] keys of sequence b are used
  Tensor leftpad_k;     // (b) int32: keys [0, leftpad_k[b]) of sequence b are ignored
  Tensor block_table;   // (b, max_pages) int32: paged K/V
};

FLASHATTN_API void forward_varlen(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const VarlenArgs& args,
                                  const AttentionOptions& options = {});

// ---------------------------------------------------------------------------------------------
// KV cache: q (b, sq, h, d); k_cache, v_cache (b_cache, max_sk, hk, d), or with block_table
// (num_pages, page_size, hk, d). Keys [cache_leftpad[b], cache_seqlens[b]) of the cache row are
// valid; k_new/v_new (b, s_new, hk, d) are first written into the cache at rows
// cache_seqlens[b] ... cache_seqlens[b] + s_new - 1 (rotated when rotary is given), then
// attention runs over the keys [cache_leftpad[b], cache_seqlens[b] + s_new).
// ---------------------------------------------------------------------------------------------

struct KVCacheArgs {
  Tensor cache_seqlens;    // (b) int32; unset: every row holds max_sk keys
  Tensor cache_batch_idx;  // (b) int32: batch b uses cache row cache_batch_idx[b]; distinct
                           // entries when k_new/v_new are appended
  Tensor cache_leftpad;    // (b) int32
  Tensor block_table;      // (b, max_pages) int32: paged cache. Only the entries of pages in
                           // use are read (padding past them, e.g. -1, is fine); a page receives
                           // appended rows from one sequence, through one entry (checked
                           // on host memory only: on CUDA colliding appends race).
  Tensor k_new;            // (b, s_new, hk, d)
  Tensor v_new;            // (b, s_new, hk, d)
  Tensor rotary_cos;       // (max_position, rotary_dim / 2), q's dtype; a row for every cache
                           // position and every rotary position of q
  Tensor rotary_sin;       // (max_position, rotary_dim / 2)
  bool rotary_interleaved = true;  // pairs (0,1),(2,3)… ; false: GPT-NeoX (i, i + rotary_dim/2)
  int num_splits = 0;      // 0: heuristic; 1: no split; n: up to kMaxSplits
  // Optional caller-owned device/host scratch of at least plan_kvcache(...).workspace_bytes,
  // 256-byte aligned. When not given, CUDA calls use a scratch buffer kept per stream (as large
  // as the largest call on that stream needed; kept until the process ends), or while the
  // stream is being captured into a CUDA graph, memory allocated and freed around the call;
  // CPU calls allocate their own. A CUDA call whose head dim is not a multiple of 8 (or whose
  // q, caches or out the kernels cannot read in place) also allocates its staged copies per
  // call, stream-ordered, workspace or not (docs/DECISIONS.md D-45).
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

constexpr int kMaxSplits = 128;
constexpr int kMaxHeadDim = 256;  // head dims 1..kMaxHeadDim are served

// What a forward_kvcache call will do: a host function of the shapes, the options and the
// device's properties.
struct Plan {
  int num_splits = 1;          // split-KV count used (1 = no combine step)
  bool pack_gqa = false;       // query heads sharing a KV head are packed into one tile
  size_t workspace_bytes = 0;  // scratch the call needs (split partials, rotated q)
  bool deep_decode = false;    // CUDA sm_90: the decode kernel runs the deep K/V pipeline
  Kernel kernel = Kernel::cpu;  // the kernel that runs the call (kernel_name(plan.kernel))
};

FLASHATTN_API Plan plan_kvcache(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                const KVCacheArgs& args, const AttentionOptions& options = {});

FLASHATTN_API void forward_kvcache(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                   const Tensor& out, const KVCacheArgs& args,
                                   const AttentionOptions& options = {});

// ---------------------------------------------------------------------------------------------
// Index values in device memory (cu_seqlens, seqused_k, cache_seqlens, cache_leftpad,
// cache_batch_idx, block_table) are checked by the kernels as they read them: a value out of
// range is never used to address memory. Its sequence runs with no keys (output 0, LSE -inf),
// or with no query rows (cu_seqlens_q: nothing written); a block_table entry out of range reads
// its keys as zeros. The first such fault on a device is kept in a status word there.
// ---------------------------------------------------------------------------------------------

// Waits for `stream` (cudaStream_t; nullptr: every stream of the current device), reads and
// clears the current device's status word, and throws Error(invalid_argument) naming the
// argument, the sequence and the value of the first fault recorded since the last check.
// Returns without error when there was none, and in a build without CUDA.
FLASHATTN_API void check_device_status(void* stream = nullptr);

// ---------------------------------------------------------------------------------------------
// Build information
// ---------------------------------------------------------------------------------------------

FLASHATTN_API bool cuda_available();     // built with CUDA and a device is visible
FLASHATTN_API std::string build_info();  // version, backends, compiled head dims and dtypes

}  // namespace flashattn
