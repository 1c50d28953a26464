// GELU-tanh, GELU, SiLU and their gated (GLU) forms (formulas in
// activation.h). Memory-bound elementwise kernels: 16-byte words when every
// row starts 16-byte aligned, a scalar kernel otherwise. The gated kernel
// gives each thread one word of each half: block (x, y) takes 128 consecutive
// words of row y, so no per-word division is needed.
#include "../common/launch.cuh"
#include "activation.h"
#include "activation_config.h"

namespace ltx {
namespace {

// PyTorch's float formulas (aten/src/ATen/native/cuda/ActivationGeluKernel.cu,
// ActivationSiluKernel.cu), in the same operation order.
template <Activation A> __device__ __forceinline__ float activate(float x) {
  if constexpr (A == Activation::kGeluTanh) {
    constexpr float kBeta = float(M_SQRT2 * M_2_SQRTPI * 0.5);
    constexpr float kKappa = 0.044715f;
    const float cube = x * x * x;
    const float inner = kBeta * (x + kKappa * cube);
    return 0.5f * x * (1.f + tanhf(inner));
  } else if constexpr (A == Activation::kGeluTanhFast) {
    // 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)): no cancellation where tanh(u)
    // is near -1, so with approximate exp and division the relative error
    // stays below 5e-5 (the rounding of exp's argument).
    constexpr float kTwoBeta = float(M_SQRT2 * M_2_SQRTPI);
    constexpr float kKappa = 0.044715f;
    const float u2 = kTwoBeta * fmaf(kKappa * x, x * x, x);
    return __fdividef(x, 1.f + __expf(-u2));
  } else if constexpr (A == Activation::kGeluErf) {
    return x * 0.5f * (1.f + erff(x * float(M_SQRT1_2)));
  } else if constexpr (A == Activation::kSiluFast) {
    return __fdividef(x, 1.f + __expf(-x));
  } else {
    return x / (1.f + expf(-x));
  }
}

template <typename T, Activation A> __device__ __forceinline__ float gated(float a, float b) {
  return __fmul_rn(round_through<T>(activate<A>(a)), b);
}

template <typename T, Activation A> __global__ void plain_vectorized(ActivationArgs p, int64_t words) {
  constexpr int N = 16 / sizeof(T);
  const T* in = static_cast<const T*>(p.input);
  T* out = static_cast<T*>(p.out);
  pdl_wait_and_release();
  for (int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; w < words; w += int64_t(gridDim.x) * blockDim.x) {
    float v[N];
    load_vec<T, N>(in + w * N, v);
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = activate<A>(v[j]);
    store_vec<T, N>(out + w * N, v);
  }
}

// gated() over one word of each half, unpacked a pair at a time: unpacking both
// words first kept 16 floats live beside the division's slow path (SiLU bf16: 35
// registers, 32 this way, which is full occupancy).
template <typename T, Activation A> __device__ __forceinline__ uint4 gated_word(const uint4& a, const uint4& b) {
  if constexpr (sizeof(T) == 4) {
    float x[4], y[4];
    unpack_word<T>(a, x);
    unpack_word<T>(b, y);
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j] = gated<T, A>(x[j], y[j]);
    return pack_word<T>(x);
  } else {
    const uint32_t ua[4] = {a.x, a.y, a.z, a.w}, ub[4] = {b.x, b.y, b.z, b.w};
    uint32_t out[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 fa = unpack_pair<T>(ua[k]), fb = unpack_pair<T>(ub[k]);
      out[k] = pack_pair<T>(gated<T, A>(fa.x, fb.x), gated<T, A>(fa.y, fb.y));
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
  }
}

// One word of each half per thread, both loads issued before any math, in short
// blocks taken in memory order (x: the word chunk of a row, y: the row, strided
// past the grid's 65535 rows). A block walking a whole row (4 words per thread
// in sequence) ran 4-9% slower: exposed load latency (docs/performance.md).
template <typename T, Activation A> __global__ void gated_vectorized(ActivationArgs p) {
  constexpr int N = 16 / sizeof(T);
  const int64_t words = p.width / N;
  const int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (w >= words) return;
  const int64_t a_off = p.act_first ? 0 : p.width, b_off = p.act_first ? p.width : 0;
  pdl_wait_and_release();
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const T* in = static_cast<const T*>(p.input) + r * 2 * p.width;
    const uint4 a = load_word(in + a_off, w), b = load_word(in + b_off, w);
    reinterpret_cast<uint4*>(static_cast<T*>(p.out) + r * p.width)[w] = gated_word<T, A>(a, b);
  }
}

template <typename T, Activation A> __global__ void any_scalar(ActivationArgs p) {
  const T* in = static_cast<const T*>(p.input);
  T* out = static_cast<T*>(p.out);
  const int64_t a_off = p.act_first ? 0 : p.width, b_off = p.act_first ? p.width : 0;
  pdl_wait_and_release();
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x)
    for (int64_t c = threadIdx.x; c < p.width; c += blockDim.x) {
      float y;
      if (p.gated) {
        const T* row = in + r * 2 * p.width;
        y = gated<T, A>(to_float(row[a_off + c]), to_float(row[b_off + c]));
      } else {
        y = activate<A>(to_float(in[r * p.width + c]));
      }
      out[r * p.width + c] = from_float<T>(y);
    }
}

template <typename T, Activation A> cudaError_t launch(const ActivationArgs& a, cudaStream_t stream) {
  namespace config = activation_config;
  const bool pdl = dependent_launch_enabled();
  if (activation_path(a) == ActivationPath::kScalarFallback) {
    const int64_t row_blocks = a.rows < config::kScalarMaxBlocks ? a.rows : config::kScalarMaxBlocks;
    return launch_kernel(any_scalar<T, A>, dim3(unsigned(row_blocks)), dim3(config::kScalarThreads), 0, stream, pdl,
                         a);
  }
  if (a.gated) {
    const int64_t words = a.width / (16 / int64_t(sizeof(T)));
    const int threads = config::gated_threads(words);
    const dim3 grid(unsigned(ceil_div(words, threads)), unsigned(a.rows < 65535 ? a.rows : 65535));
    return launch_kernel(gated_vectorized<T, A>, grid, dim3(threads), 0, stream, pdl, a);
  }
  const int64_t words = a.rows * a.width / (16 / int64_t(sizeof(T)));
  auto kernel = plain_vectorized<T, A>;
  const int64_t grid = plan_grid(kernel, config::kPlainThreads, ceil_div(words, config::kPlainThreads),
                                 config::plain_grid_plan(gpu_class(), A));
  if (grid < 0) return cudaGetLastError();
  return launch_kernel(kernel, dim3(unsigned(grid)), dim3(config::kPlainThreads), 0, stream, pdl, a, words);
}

}  // namespace

ActivationPath activation_path(const ActivationArgs& a) {
  const int64_t n = 16 / dtype_size(a.dtype);
  // Plain: the flat buffer must be whole words; gated: every row half must start on a word.
  const bool sizes_ok = a.gated ? a.width % n == 0 : (a.rows * a.width) % n == 0;
  const bool ok = sizes_ok && is_aligned16(a.input) && is_aligned16(a.out);
  return ok ? ActivationPath::kVectorized : ActivationPath::kScalarFallback;
}

cudaError_t activation(const ActivationArgs& a, cudaStream_t stream) {
  if (a.rows == 0 || a.width == 0) return cudaSuccess;
  return visit_dtype(a.dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    switch (a.activation) {
      case Activation::kGeluTanh: return launch<T, Activation::kGeluTanh>(a, stream);
      case Activation::kGeluErf: return launch<T, Activation::kGeluErf>(a, stream);
      case Activation::kSilu: return launch<T, Activation::kSilu>(a, stream);
      case Activation::kGeluTanhFast: return launch<T, Activation::kGeluTanhFast>(a, stream);
      case Activation::kSiluFast: return launch<T, Activation::kSiluFast>(a, stream);
    }
    return cudaErrorInvalidValue;
  });
}

}  // namespace ltx
