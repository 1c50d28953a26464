// The host side of a launch, shared by every op family: launch_kernel (with
// programmatic dependent launch), the GPU classes the launch tables are
// measured on, and the grid plans they choose from.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>
#include <cuda_runtime.h>

#include "device.cuh"
#include "tuning.h"

namespace ltx {

// Whether launch_kernel's callers ask for programmatic dependent launch:
// always, unless a development build turns it off (tuning.h) to compare.
inline bool dependent_launch_enabled() { return tuning::override_of(tuning::Knob::kDependentLaunch) != 0; }

template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                          bool pdl, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// How a kernel that walks row groups (or words) with a grid stride spreads
// them over blocks.
enum class GridPlan {
  kPersistent,     // as many blocks as are resident at once (occupancy x SMs)
  kBalancedPersistent,  // at most that many, so that every block takes the same number of row groups (+-1)
  kFourPerBlock,   // persistent, unless that leaves > 8 row groups per block: then ~4 per block
  kTwoPerBlock,    // the same with ~2 per block
  kLargeOnePerBlock,  // the same with one per block
  kLargeTwiceResident,  // persistent, unless that leaves > 12 row groups per block: then twice the resident blocks
  kOnePerBlock,    // one block per row group: the hardware balances the load
};

// Row groups per block of the kFour/kTwo/kLargeOnePerBlock plans on large inputs.
constexpr int64_t groups_per_block(GridPlan plan) {
  return plan == GridPlan::kFourPerBlock ? 4 : plan == GridPlan::kTwoPerBlock ? 2 : 1;
}

// Whether the current GPU's peak memory bandwidth (memory clock x bus width)
// is at least 4.5 TB/s: the H200 (4.8) yes, every H100 (2.0-3.9) no. False on
// a CUDA error (the launch that follows reports it). Cached per device: the
// memory clock query costs ~0.7 ms of host time, which every launch paid when
// it was asked each time (tests/test_launch_overhead_gpu.py).
inline bool high_bandwidth_device() {
  constexpr int kCachedDevices = 64;
  static std::atomic<signed char> known[kCachedDevices];  // per device: 0 not yet asked, 1 no, 2 yes
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  std::atomic<signed char>* slot = device >= 0 && device < kCachedDevices ? &known[device] : nullptr;
  if (slot != nullptr) {
    if (const signed char k = slot->load(std::memory_order_relaxed); k != 0) return k == 2;
  }
  int clock_khz = 0, bus_bits = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) return false;
  const double peak = 2.0 * double(clock_khz) * 1e3 * double(bus_bits) / 8.0;  // bytes/s, double data rate
  const bool high = peak >= 4.5e12;
  if (slot != nullptr) slot->store(high ? 2 : 1, std::memory_order_relaxed);
  return high;
}

// The launch tables (kernel_src/<family>/<family>_config.h) have one rung per
// GPU class where the best choice differs: grid plans and occupancy targets
// were measured on one H100 and one H200 (docs/performance.md).
enum class GpuClass { kH100, kH200 };
inline GpuClass gpu_class() { return high_bandwidth_device() ? GpuClass::kH200 : GpuClass::kH100; }

// Blocks of `kernel` resident at once on the current GPU (at least one per
// SM); -1 on a CUDA error.
template <typename Kernel> int64_t resident_blocks(Kernel kernel, int block_threads, size_t smem = 0) {
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return -1;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return -1;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block_threads, smem) != cudaSuccess) return -1;
  return int64_t(sms) * (per_sm > 0 ? per_sm : 1);
}

// Blocks for `kernel` under `plan`, at most `needed`; -1 on a CUDA error.
// `known_resident` > 0: resident_blocks(kernel, block_threads, smem) as the
// caller has asked it already.
template <typename Kernel>
int64_t plan_grid(Kernel kernel, int block_threads, int64_t needed, GridPlan plan, size_t smem = 0,
                  int64_t known_resident = 0) {
  if (plan == GridPlan::kOnePerBlock) return needed;  // no occupancy query on the launch path
  const int64_t resident = known_resident > 0 ? known_resident : resident_blocks(kernel, block_threads, smem);
  if (resident < 0) return -1;
  int64_t grid = resident;
  if (plan == GridPlan::kBalancedPersistent) {
    // e.g. 5376 row groups on 528 resident blocks: 489 blocks of 11 (not 10.2 passes, the last 18% full)
    if (needed > resident) grid = ceil_div(needed, ceil_div(needed, resident));
  } else if (plan == GridPlan::kLargeTwiceResident) {
    if (needed > 12 * resident) grid = 2 * resident;
  } else if (plan != GridPlan::kPersistent && needed > 8 * resident) {
    grid = ceil_div(needed, groups_per_block(plan));
  }
  grid = grid > 0 ? grid : 1;
  return needed < grid ? needed : grid;
}

// plan_grid for a grid-stride kernel over `items` (one per thread and step), capped at the
// grid's x limit (the stride covers the rest); -1 on a CUDA error.
template <typename Kernel>
int64_t plan_stride_grid(Kernel kernel, int block_threads, int64_t items, GridPlan plan) {
  constexpr int64_t kMaxGridX = (int64_t(1) << 31) - 1;
  const int64_t grid = plan_grid(kernel, block_threads, ceil_div(items, int64_t(block_threads)), plan);
  return grid < kMaxGridX ? grid : kMaxGridX;
}

}  // namespace ltx
