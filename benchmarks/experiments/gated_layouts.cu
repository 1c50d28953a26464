// Experiment: thread layouts of the exact bf16 GEGLU/SwiGLU kernel, standalone (no torch,
// no ltx headers), driven by gated_layouts.py. Variants: glu_launch's switch.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

namespace {
__device__ __forceinline__ float act(float x, int kind) {
  if (kind == 0) {
    constexpr float kBeta = float(M_SQRT2 * M_2_SQRTPI * 0.5);
    constexpr float kKappa = 0.044715f;
    const float cube = x * x * x;
    const float inner = kBeta * (x + kKappa * cube);
    return 0.5f * x * (1.f + tanhf(inner));
  }
  return x / (1.f + expf(-x));
}
__device__ __forceinline__ float rt(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

template <bool kAsm> __device__ __forceinline__ uint4 ld(const uint4* p) {
  if constexpr (kAsm) {
    uint4 r;
    asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
  } else {
    return *p;
  }
}
template <int KIND> __device__ __forceinline__ uint4 glu_word(uint4 a, uint4 b) {
  const uint32_t ua[4] = {a.x, a.y, a.z, a.w}, ub[4] = {b.x, b.y, b.z, b.w};
  uint32_t o[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float a0 = __uint_as_float(ua[k] << 16), a1 = __uint_as_float(ua[k] & 0xffff0000u);
    const float b0 = __uint_as_float(ub[k] << 16), b1 = __uint_as_float(ub[k] & 0xffff0000u);
    const float y0 = __fmul_rn(rt(act(a0, KIND)), b0), y1 = __fmul_rn(rt(act(a1, KIND)), b1);
    __nv_bfloat162 h = __floats2bfloat162_rn(y0, y1);
    o[k] = *reinterpret_cast<uint32_t*>(&h);
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// Row loop: blocks walk rows with a grid stride, threads walk the row's words.
template <int KIND, bool kAsm> __global__ void rowloop(const uint4* in, uint4* out, int64_t rows, int64_t words, int act_first) {
  const int64_t ao = act_first ? 0 : words, bo = act_first ? words : 0;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const uint4* row = in + r * 2 * words;
    for (int64_t w = threadIdx.x; w < words; w += blockDim.x) {
      const uint4 a = ld<kAsm>(row + ao + w), b = ld<kAsm>(row + bo + w);
      out[r * words + w] = glu_word<KIND>(a, b);
    }
  }
}

// Flat 2-D grid: block (x, y) takes WPT * blockDim.x consecutive words of row y.
template <int KIND, bool kAsm, int WPT> __global__ void flat2d(const uint4* in, uint4* out, int64_t rows, int64_t words, int act_first) {
  const int64_t r = blockIdx.y;
  const int64_t ao = act_first ? 0 : words, bo = act_first ? words : 0;
  const uint4* row = in + r * 2 * words;
  const int64_t w0 = int64_t(blockIdx.x) * blockDim.x * WPT + threadIdx.x;
  uint4 a[WPT], b[WPT];
#pragma unroll
  for (int i = 0; i < WPT; ++i) {
    const int64_t w = w0 + i * blockDim.x;
    if (w < words) { a[i] = ld<kAsm>(row + ao + w); b[i] = ld<kAsm>(row + bo + w); }
  }
#pragma unroll
  for (int i = 0; i < WPT; ++i) {
    const int64_t w = w0 + i * blockDim.x;
    if (w < words) out[r * words + w] = glu_word<KIND>(a[i], b[i]);
  }
}
}  // namespace

extern "C" int glu_launch(int variant, int kind, const void* in, void* out, long rows, long words, int act_first, cudaStream_t s) {
  auto i = static_cast<const uint4*>(in);
  auto o = static_cast<uint4*>(out);
  const unsigned rb = unsigned(rows < 65535 * 8 ? rows : 65535 * 8);
#define K(kind_) if (kind == kind_) {                                                                       \
  switch (variant) {                                                                                        \
    case 0: rowloop<kind_, false><<<rb, 256, 0, s>>>(i, o, rows, words, act_first); break;                  \
    case 1: rowloop<kind_, true><<<rb, 256, 0, s>>>(i, o, rows, words, act_first); break;                   \
    case 2: rowloop<kind_, false><<<rb, 128, 0, s>>>(i, o, rows, words, act_first); break;                  \
    case 3: flat2d<kind_, false, 1><<<dim3((words + 127) / 128, rows), 128, 0, s>>>(i, o, rows, words, act_first); break; \
    case 4: flat2d<kind_, true, 1><<<dim3((words + 127) / 128, rows), 128, 0, s>>>(i, o, rows, words, act_first); break;  \
    case 5: flat2d<kind_, false, 1><<<dim3((words + 255) / 256, rows), 256, 0, s>>>(i, o, rows, words, act_first); break; \
    case 6: flat2d<kind_, true, 2><<<dim3((words + 255) / 256, rows), 128, 0, s>>>(i, o, rows, words, act_first); break;  \
    case 7: flat2d<kind_, false, 1><<<dim3((words + 1023) / 1024, rows), 1024, 0, s>>>(i, o, rows, words, act_first); break; \
    case 8: flat2d<kind_, true, 1><<<dim3((words + 511) / 512, rows), 512, 0, s>>>(i, o, rows, words, act_first); break; \
    default: return -1;                                                                                     \
  } }
  K(0) K(1)
#undef K
  return int(cudaGetLastError());
}
