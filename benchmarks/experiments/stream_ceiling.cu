// Experiment: how close a plain streaming kernel gets to the copy rate at the sizes where the
// library's rows sit below 85% on the H200 (44 MB and 88 MB moved per call), and which launch shape
// gets there. One op, bf16: out[b, c, s] = T(x[b, c, s] + y[c]) over 16-byte words of x (the
// per-channel broadcast add of inplace_add; out == x is the in-place form). Knobs:
//   block        threads per block (128 .. 1024; .. 512 at 8 words)
//   W            words per thread per step, all loads issued before the first store
//   per_sm       0: one step per thread, a grid covering every word; k > 0: a persistent grid of
//                k blocks per SM walking the words in steps of grid * block * W
//   cs_store     stores with st.global.cs (evict-first) instead of plain stores
//   spread       P > 1 (one step only): block b takes tile (b % P) * ceil(tiles / P) + b / P, so
//                the blocks resident at once read P regions far apart instead of one run of the
//                tensor (pixel_norm's blocks read 512 channel planes at once; its 95% of copy at
//                44 MB on the H100 suggested it, but that was its reused output buffer: H100,
//                spreading gained nothing)
// No torch; the library's device helpers (kernel_src/common.cuh), driven by stream_ceiling.py
// through ctypes.
#include <cstdint>

#include "../../kernel_src/common.cuh"

namespace {

using ltx::DivU32;

struct Args {
  uint4* out;
  const uint4* x;
  const __nv_bfloat16* y;
  uint32_t words;
  DivU32 per_plane, channels;  // words per [b, c] plane; C
  uint32_t num_channels;
  uint32_t spread, tiles_per_part;  // block order (spread 1: linear)
};

__device__ __forceinline__ uint4 add_to_word(uint4 v, float yc) {
  float x[8];
  ltx::unpack_word<__nv_bfloat16>(v, x);
#pragma unroll
  for (int j = 0; j < 8; ++j) x[j] += yc;
  return ltx::pack_word<__nv_bfloat16>(x);
}

template <int W, bool kCs>
__device__ __forceinline__ void step(const Args& a, uint32_t first) {
  uint4 v[W];
  float yc[W];
#pragma unroll
  for (int k = 0; k < W; ++k) {
    const uint32_t w = first + uint32_t(k) * blockDim.x;
    if (w < a.words) {
      v[k] = a.x[w];
      const uint32_t plane = a.per_plane.div(w);
      yc[k] = __bfloat162float(a.y[plane - a.channels.div(plane) * a.num_channels]);
    }
  }
#pragma unroll
  for (int k = 0; k < W; ++k) {
    const uint32_t w = first + uint32_t(k) * blockDim.x;
    if (w >= a.words) continue;
    const uint4 r = add_to_word(v[k], yc[k]);
    if constexpr (kCs) __stcs(a.out + w, r);
    else a.out[w] = r;
  }
}

// 8 words per thread need more than the 64 registers a 1024-thread bound leaves.
template <int W, bool kCs, bool kPersistent>
__global__ void __launch_bounds__(W >= 8 ? 512 : 1024) stream_add(Args a) {
  const uint32_t chunk = blockDim.x * W;
  if constexpr (kPersistent) {
    for (uint32_t first = blockIdx.x * chunk + threadIdx.x; first < a.words; first += gridDim.x * chunk)
      step<W, kCs>(a, first);
  } else {
    const uint32_t tile = (blockIdx.x % a.spread) * a.tiles_per_part + blockIdx.x / a.spread;
    step<W, kCs>(a, tile * chunk + threadIdx.x);
  }
}

template <int W, bool kCs, bool kPersistent> int launch(const Args& a, int block, int per_sm, cudaStream_t stream) {
  const auto kernel = stream_add<W, kCs, kPersistent>;
  unsigned grid = unsigned((uint64_t(a.words) + uint64_t(block) * W - 1) / (uint64_t(block) * W));  // tiles
  Args args = a;
  args.tiles_per_part = (grid + a.spread - 1) / a.spread;
  if (!kPersistent) grid = args.tiles_per_part * a.spread;  // the tiles past the end return at once
  if (kPersistent) {
    int device = 0, sms = 0, fit = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, block, 0);
    const unsigned persistent = unsigned(sms * (per_sm < fit ? per_sm : fit));
    if (persistent < grid) grid = persistent;
  }
  kernel<<<grid, block, 0, stream>>>(args);
  return int(cudaGetLastError());
}

template <int W> int with_flags(const Args& a, int block, int per_sm, int cs, cudaStream_t stream) {
  if (cs) return per_sm ? launch<W, true, true>(a, block, per_sm, stream) : launch<W, true, false>(a, block, 0, stream);
  return per_sm ? launch<W, false, true>(a, block, per_sm, stream) : launch<W, false, false>(a, block, 0, stream);
}

}  // namespace

// Returns a cudaError_t (0: launched); -1 for knobs out of range.
extern "C" int stream_add_launch(int block, int words_per_thread, int per_sm, int cs_store, int spread, void* out,
                                 const void* x, const void* y, unsigned long long words,
                                 unsigned long long words_per_plane, unsigned channels, cudaStream_t stream) {
  if (block < 32 || block > 1024 || block % 32 || words > 0xffffffffull || words_per_plane == 0 || channels == 0 ||
      spread < 1 || (spread > 1 && per_sm > 0))
    return -1;
  Args a{static_cast<uint4*>(out), static_cast<const uint4*>(x), static_cast<const __nv_bfloat16*>(y),
         uint32_t(words), DivU32::of(words_per_plane), DivU32::of(channels), channels, uint32_t(spread), 0};
  switch (words_per_thread) {
    case 1: return with_flags<1>(a, block, per_sm, cs_store, stream);
    case 2: return with_flags<2>(a, block, per_sm, cs_store, stream);
    case 4: return with_flags<4>(a, block, per_sm, cs_store, stream);
    case 8: return with_flags<8>(a, block, per_sm, cs_store, stream);
  }
  return -1;
}
