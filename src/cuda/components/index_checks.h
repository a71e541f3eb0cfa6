// Index checks on the device (common/index_faults.h): the lengths of a sequence are checked once
// per CTA where its geometry is read (rules.h seq_info_read), a block_table entry where its page
// is looked up. The first fault of the device is recorded in the DeviceStatus the host passed
// (AttnParams::status, cuda/device_status.cu) with one atomicCAS, so that later faults, and
// every other thread that sees the same one, leave it alone. Nothing here runs on the path of
// valid values but the comparisons.
#pragma once

#include "common/index_faults.h"
#include "common/params.h"
#include "common/rules.h"

namespace flashattn {
namespace cuda {

__device__ __forceinline__ void record_index_fault(DeviceStatus* status, const IndexFault& fault) {
  if (status == nullptr) return;
  if (atomicCAS(&status->claimed, 0, 1) == 0) status->first = fault;
}

// rules.h seq_info with its faults recorded, by thread 0 (every thread of the CTA reads the same
// lengths and gets the same, emptied, sequence).
__device__ __forceinline__ SeqInfo seq_info_checked(const AttnParams& p, int b) {
  return seq_info_read(
      p, b, [](const int* array, int i) { return array[i]; },
      [&](const IndexFault& fault) {
        if (threadIdx.x == 0) record_index_fault(p.status, fault);
      });
}

// Whether block_table entry `page` of sequence b names a page of the cache (rules.h valid_page);
// else the fault is recorded and the caller reads nothing through it.
__device__ __forceinline__ bool checked_page(const AttnParams& p, int b, int page) {
  if (valid_page(p, page)) return true;
  record_index_fault(p.status, index_fault(IndexArg::block_table, b, page, 0, p.num_pages - 1));
  return false;
}

}  // namespace cuda
}  // namespace flashattn
