// A thread's private ring of upcoming rows in shared memory, filled by cp.async: a row kernel that walks a
// chain of rows keeps S - 1 rows' loads in flight without holding them in registers (a register
// prefetch costs 4 registers per word and row, and registers bound these kernels' occupancy). Each
// thread copies and later reads only its own words, and cp.async.wait_group makes a thread's completed
// copies visible to that thread, so the ring needs no barrier.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>
#include <type_traits>

#include "device.cuh"

namespace ltx {

__device__ __forceinline__ void copy_word_async(uint4* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(uint32_t(__cvta_generic_to_shared(smem))),
               "l"(gmem)
               : "memory");
}
__device__ __forceinline__ void commit_async() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most PENDING of this thread's committed groups are still in flight.
template <int PENDING> __device__ __forceinline__ void wait_async() {
  asm volatile("cp.async.wait_group %0;" ::"n"(PENDING) : "memory");
}

// f(k, i, src) for each of this thread's words of the rows present (rows[k] not null): word
// v = threadIdx.x + i * TPR (i < VPT, v < nvec) of rows[k], at src.
template <int K, int VPT, int TPR, typename F>
__device__ __forceinline__ void for_each_word(const void* const (&rows)[K], int64_t nvec, F&& f) {
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (rows[k] == nullptr) continue;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t v = threadIdx.x + int64_t(i) * TPR;
      if (v < nvec) f(k, i, static_cast<const uint4*>(rows[k]) + v);
    }
  }
}

// S stages of K row tensors' words, for a block of TPR threads on a row: a thread's words
// v = threadIdx.x + i * TPR (i < VPT) of each. Word (stage, k, i) of thread t sits at
// ((stage * K + k) * VPT + i) * TPR + t: consecutive threads read consecutive 16-byte words (no bank
// conflict).
template <int S, int K, int VPT, int TPR>
struct RowRing {
  static_assert(S >= 2, "one stage being read and at least one being filled");
  static constexpr size_t kBytes = size_t(S) * K * VPT * TPR * sizeof(uint4);
  uint4* base;  // the kernel's dynamic shared memory, kBytes
  __device__ explicit RowRing(uint4* smem) : base(smem) {}

  // One commit group: stage `stage` <- the words of rows[k] (null: tensor k not read for this row).
  __device__ __forceinline__ void fill(int stage, const void* const (&rows)[K], int64_t nvec) const {
    for_each_word<K, VPT, TPR>(rows, nvec,
                               [&](int k, int i, const uint4* src) { copy_word_async(slot(stage, k, i), src); });
    commit_async();
  }
  // An empty group (no row left to fill), so that every iteration commits one and wait_async counts rows.
  __device__ __forceinline__ static void skip() { commit_async(); }
  __device__ __forceinline__ uint4 word(int stage, int k, int i) const { return *slot(stage, k, i); }
  __device__ __forceinline__ uint4* slot(int stage, int k, int i) const {
    return base + ((stage * K + k) * VPT + i) * TPR + threadIdx.x;
  }
};

// S = 1 in place of a ring: this row's words and the next row's in registers (8 registers per word and
// tensor), no shared memory. fill() loads the next row, advance() makes it the current one; stages are ignored.
template <int K, int VPT, int TPR>
struct RowRegisters {
  static constexpr size_t kBytes = 0;
  uint4 cur[K][VPT], next[K][VPT];
  __device__ explicit RowRegisters(uint4*) {}
  __device__ __forceinline__ void fill(int, const void* const (&rows)[K], int64_t nvec) {
    for_each_word<K, VPT, TPR>(rows, nvec, [&](int k, int i, const uint4* src) { next[k][i] = load_word(src, 0); });
  }
  __device__ __forceinline__ static void skip() {}
  __device__ __forceinline__ void advance() {
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
      for (int i = 0; i < VPT; ++i) cur[k][i] = next[k][i];
  }
  __device__ __forceinline__ uint4 word(int, int k, int i) const { return cur[k][i]; }
};

// A row kernel's source of upcoming rows: the shared-memory ring of S stages, or registers at S = 1.
template <int S, int K, int VPT, int TPR>
using RowSource = std::conditional_t<S == 1, RowRegisters<K, VPT, TPR>, RowRing<S, K, VPT, TPR>>;

// The ring bytes a kernel may take without opting in: the default 48 KB of shared memory holds the
// kernel's static shared memory too (the row sums' few hundred bytes; a 48 KB ring failed to launch).
constexpr size_t kRingDefaultBytes = 40 * 1024;

// A larger ring (wide rows) needs the kernel's opt-in; asked at each such launch (one attribute call), so
// that it holds on every device.
template <typename Kernel> inline cudaError_t allow_ring_bytes(Kernel kernel, size_t bytes) {
  if (bytes <= kRingDefaultBytes) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
}

}  // namespace ltx
