// Warp roles of a warp-specialised CTA (sm_90): one producer warpgroup that only issues the
// TMA loads, and two consumer warpgroups that compute. The register file moves from the
// producer to the consumers (setmaxnreg), and the consumers take turns at the tensor cores
// (ping-pong): one warpgroup issues its products while the other runs its softmax.
#pragma once

#include <cstdint>

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

namespace flashattn {
namespace cuda {
namespace fwd {

constexpr int kWarpgroupThreads = 128;
constexpr int kProducerWarpgroup = 0;  // warpgroup 0 produces, 1 and 2 consume
constexpr int kConsumerWarpgroups = 2;
constexpr int kConsumerThreads = kConsumerWarpgroups * kWarpgroupThreads;
constexpr int kWarpSpecThreads = kConsumerThreads + kWarpgroupThreads;
// Registers per thread after the move: 128 x 24 + 256 x 240 = 64,512 of the SM's 65,536 (the
// producer needs few; each consumer holds its S and O accumulators).
constexpr int kProducerRegisters = 24;
// With FP8 products (WarpSpecFp8Traits) warps 1-3 of the producer warpgroup transpose V while
// warp 0 issues the loads; 128 x 32 + 256 x 232 = 63,488. With 24 the transposing loop spilled
// its stage counters inside the loop; with 232 the consumers spill 5 words once per query tile
// (ptxas, d = 128; D-75).
constexpr int kTransposingProducerRegisters = 32;
constexpr int kTransposingConsumerRegisters = 232;
constexpr int kVTransposeWarps = 3;
constexpr int kVTransposeThreads = kVTransposeWarps * 32;
constexpr int kConsumerRegisters = 240;

// Named barriers of the warp-specialised kernel (ids past CUTLASS's reserved ones).
enum class WarpSpecBarrier : uint32_t {
  consumers = 0,  // both consumer warpgroups (a V stage's zeroed rows, D-79)
  turn_of_first = 1,
  turn_of_second = 2,
  transposers = 3,  // FP8 products: the V-transposing warps (a V stage's zeroed rows)
  own_rows_first = 4,  // one consumer warpgroup (4, 5): the epilogue of its own 64 rows
};

__device__ __forceinline__ int warpgroup_index() {
  return __shfl_sync(0xffffffff, int(threadIdx.x) / kWarpgroupThreads, 0);  // warp-uniform
}

__device__ __forceinline__ void consumers_sync() {
  cutlass::arch::NamedBarrier::sync(kConsumerThreads, uint32_t(WarpSpecBarrier::consumers));
}

// The 128 threads of consumer warpgroup `consumer` (0 or 1).
__device__ __forceinline__ void consumer_warpgroup_sync(int consumer) {
  cutlass::arch::NamedBarrier::sync(kWarpgroupThreads, uint32_t(WarpSpecBarrier::own_rows_first) + uint32_t(consumer));
}

__device__ __forceinline__ void transposers_sync() {
  cutlass::arch::NamedBarrier::sync(kVTransposeThreads, uint32_t(WarpSpecBarrier::transposers));
}

// The two consumer warpgroups' turns at the tensor cores. A turn is: take(), issue this
// warpgroup's products of the step, pass(). Both warpgroups take the same number of turns (the
// CTA's key tiles); the first starts. Every wait on a turn barrier is matched by one arrival of
// the other warpgroup, so the barriers are empty when the CTA ends: the second warpgroup's
// final pass arrives nowhere (the first has no turn left).
class TensorCoreTurns {
 public:
  __device__ __forceinline__ TensorCoreTurns(int consumer, int turns) : consumer_(consumer), left_(turns) {
    if (consumer_ == 1 && left_ > 0) arrive(WarpSpecBarrier::turn_of_first);
  }
  __device__ __forceinline__ void take() const {
    cutlass::arch::NamedBarrier::sync(kConsumerThreads, uint32_t(consumer_ == 0 ? WarpSpecBarrier::turn_of_first
                                                                                 : WarpSpecBarrier::turn_of_second));
  }
  __device__ __forceinline__ void pass() {
    --left_;
    if (consumer_ == 0) {
      arrive(WarpSpecBarrier::turn_of_second);
    } else if (left_ > 0) {
      arrive(WarpSpecBarrier::turn_of_first);
    }
  }

 private:
  __device__ __forceinline__ static void arrive(WarpSpecBarrier b) {
    cutlass::arch::NamedBarrier::arrive(kConsumerThreads, uint32_t(b));
  }
  int consumer_;  // 0 or 1
  int left_;
};

}  // namespace fwd
}  // namespace cuda
}  // namespace flashattn
