// GELU-tanh, GELU, SiLU, their gated (GLU) forms and LTX-2's per-head sigmoid
// gate (formulas in activation.h). Memory-bound elementwise kernels: 16-byte
// words when every row starts 16-byte aligned, a scalar kernel otherwise. The
// gated kernel gives each thread one word of each half: block (x, y) takes 128
// consecutive words of row y, so no per-word division is needed.
#include "../common/launch.cuh"
#include "activation.h"
#include "activation_config.h"
#include "activation_math.cuh"

namespace ltx {
namespace {

using namespace activation_math;

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

// --- head gate ---------------------------------------------------------------------------

// One 16-byte word of the flat x per thread and grid step. A row of x holds heads * head_dim elements and a
// row of logits heads, so flat word w (inside one head: head_dim is whole words) takes flat logit
// w / words_per_head: the threads of a head load the same logit (one broadcast transaction per warp and
// head), both loads are issued before any math. `narrow`: every word index fits 32 bits, and the division
// is DivU32's multiply-shift.
template <typename T, bool kExact>
__global__ void head_gate_vectorized(HeadGateArgs p, int64_t words, int64_t words_per_head, DivU32 div,
                                     bool narrow) {
  const T* x = static_cast<const T*>(p.x);
  const T* logits = static_cast<const T*>(p.logits);
  uint4* out = static_cast<uint4*>(p.out);
  pdl_wait_and_release();
  for (int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; w < words; w += int64_t(gridDim.x) * blockDim.x) {
    const int64_t head = narrow ? int64_t(div.div(uint32_t(w))) : w / words_per_head;
    const T logit = logits[head];
    const uint4 v = load_word(x, w);
    out[w] = scaled_word<T>(v, head_gate_factor<T, kExact>(to_float(logit), p.scale));
  }
}

// Any head_dim and alignment: one element per thread and grid step, its logit at flat index e / head_dim.
template <typename T, bool kExact> __global__ void head_gate_scalar(HeadGateArgs p, int64_t n) {
  const T* x = static_cast<const T*>(p.x);
  const T* logits = static_cast<const T*>(p.logits);
  T* out = static_cast<T*>(p.out);
  pdl_wait_and_release();
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const float g = head_gate_factor<T, kExact>(to_float(logits[e / p.head_dim]), p.scale);
    out[e] = from_float<T>(__fmul_rn(to_float(x[e]), g));
  }
}

template <typename T, bool kExact> cudaError_t launch_head_gate(const HeadGateArgs& a, cudaStream_t stream) {
  namespace config = activation_config;
  const bool pdl = dependent_launch_enabled();
  const int64_t n = a.rows * a.heads * a.head_dim;
  if (head_gate_path(a) == ActivationPath::kScalarFallback) {
    const int64_t needed = ceil_div(n, config::kHeadGateScalarThreads);
    const int64_t blocks = needed < config::kHeadGateScalarMaxBlocks ? needed : config::kHeadGateScalarMaxBlocks;
    return launch_kernel(head_gate_scalar<T, kExact>, dim3(unsigned(blocks)), dim3(config::kHeadGateScalarThreads),
                         0, stream, pdl, a, n);
  }
  constexpr int64_t kPerWord = 16 / int64_t(sizeof(T));
  const int64_t words = n / kPerWord, words_per_head = a.head_dim / kPerWord;
  auto kernel = head_gate_vectorized<T, kExact>;
  const int64_t grid = plan_stride_grid(kernel, config::kHeadGateThreads, words, config::kHeadGateGridPlan);
  if (grid < 0) return cudaGetLastError();
  const bool narrow = words <= int64_t(UINT32_MAX);
  return launch_kernel(kernel, dim3(unsigned(grid)), dim3(config::kHeadGateThreads), 0, stream, pdl, a, words,
                       words_per_head, DivU32::of(uint64_t(words_per_head)), narrow);
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
    return visit_activation(a.activation, [&](auto act) { return launch<T, decltype(act)::value>(a, stream); });
  });
}

ActivationPath head_gate_path(const HeadGateArgs& a) {
  const int64_t n = 16 / dtype_size(a.dtype);
  const bool ok = a.head_dim % n == 0 && is_aligned16(a.x) && is_aligned16(a.out);
  return ok ? ActivationPath::kVectorized : ActivationPath::kScalarFallback;
}

cudaError_t head_gate(const HeadGateArgs& a, cudaStream_t stream) {
  if (a.rows == 0 || a.heads == 0 || a.head_dim == 0) return cudaSuccess;
  return visit_dtype(a.dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    return a.exact ? launch_head_gate<T, true>(a, stream) : launch_head_gate<T, false>(a, stream);
  });
}

}  // namespace ltx
