// Backward of the activations and the head gate (formulas in activation.h): elementwise kernels that
// recompute from the saved input, with the forward's access pattern (16-byte words when every buffer
// is aligned, a scalar kernel otherwise). The head gate's logits grad sums each head's D products inside
// one warp (shuffles in a fixed order): no atomics, no cross-row reduction, deterministic.
#include "../common/launch.cuh"
#include "activation.h"
#include "activation_config.h"
#include "activation_math.cuh"

namespace ltx {
namespace {

using namespace activation_math;

// dx for one word each of dy and x.
template <typename T, Activation A> __device__ __forceinline__ uint4 plain_bwd_word(const uint4& dy, const uint4& x) {
  if constexpr (sizeof(T) == 4) {
    float g[4], v[4];
    unpack_word<T>(dy, g);
    unpack_word<T>(x, v);
#pragma unroll
    for (int j = 0; j < 4; ++j) g[j] = activate_backward<A>(g[j], v[j]);
    return pack_word<T>(g);
  } else {
    const uint32_t ug[4] = {dy.x, dy.y, dy.z, dy.w}, ux[4] = {x.x, x.y, x.z, x.w};
    uint32_t out[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // a pair at a time, as the forward (fewer live registers)
      const float2 g = unpack_pair<T>(ug[k]), v = unpack_pair<T>(ux[k]);
      out[k] = pack_pair<T>(activate_backward<A>(g.x, v.x), activate_backward<A>(g.y, v.y));
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
  }
}

template <typename T, Activation A> __global__ void plain_bwd_vectorized(ActivationBwdArgs p, int64_t words) {
  const T* dy = static_cast<const T*>(p.grad_out);
  const T* x = static_cast<const T*>(p.input);
  uint4* dx = static_cast<uint4*>(p.grad_input);
  pdl_wait_and_release();
  for (int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; w < words; w += int64_t(gridDim.x) * blockDim.x) {
    const uint4 g = load_word(dy, w), v = load_word(x, w);
    dx[w] = plain_bwd_word<T, A>(g, v);
  }
}

// da and db words for one word each of dy, a and b.
template <typename T, Activation A>
__device__ __forceinline__ void gated_bwd_word(const uint4& dy, const uint4& a, const uint4& b, uint4& da, uint4& db) {
  if constexpr (sizeof(T) == 4) {
    float g[4], va[4], vb[4];
    unpack_word<T>(dy, g);
    unpack_word<T>(a, va);
    unpack_word<T>(b, vb);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 r = gated_backward<T, A>(g[j], va[j], vb[j]);
      va[j] = r.x;
      vb[j] = r.y;
    }
    da = pack_word<T>(va);
    db = pack_word<T>(vb);
  } else {
    const uint32_t ug[4] = {dy.x, dy.y, dy.z, dy.w}, ua[4] = {a.x, a.y, a.z, a.w}, ub[4] = {b.x, b.y, b.z, b.w};
    uint32_t oa[4], ob[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 g = unpack_pair<T>(ug[k]), fa = unpack_pair<T>(ua[k]), fb = unpack_pair<T>(ub[k]);
      const float2 lo = gated_backward<T, A>(g.x, fa.x, fb.x), hi = gated_backward<T, A>(g.y, fa.y, fb.y);
      oa[k] = pack_pair<T>(lo.x, hi.x);
      ob[k] = pack_pair<T>(lo.y, hi.y);
    }
    da = make_uint4(oa[0], oa[1], oa[2], oa[3]);
    db = make_uint4(ob[0], ob[1], ob[2], ob[3]);
  }
}

// The forward's layout: block (x, y) takes 128 consecutive words of row y (strided past 65535 rows); each
// thread loads its word of dy and of both halves before any math, and stores both grad halves.
template <typename T, Activation A> __global__ void gated_bwd_vectorized(ActivationBwdArgs p) {
  constexpr int N = 16 / sizeof(T);
  const int64_t words = p.width / N;
  const int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (w >= words) return;
  const int64_t a_off = p.act_first ? 0 : p.width, b_off = p.act_first ? p.width : 0;
  pdl_wait_and_release();
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const T* in = static_cast<const T*>(p.input) + r * 2 * p.width;
    const uint4 g = load_word(static_cast<const T*>(p.grad_out) + r * p.width, w);
    const uint4 a = load_word(in + a_off, w), b = load_word(in + b_off, w);
    uint4 da, db;
    gated_bwd_word<T, A>(g, a, b, da, db);
    T* dx = static_cast<T*>(p.grad_input) + r * 2 * p.width;
    reinterpret_cast<uint4*>(dx + a_off)[w] = da;
    reinterpret_cast<uint4*>(dx + b_off)[w] = db;
  }
}

template <typename T, Activation A> __global__ void any_bwd_scalar(ActivationBwdArgs p) {
  const T* dy = static_cast<const T*>(p.grad_out);
  const T* x = static_cast<const T*>(p.input);
  T* dx = static_cast<T*>(p.grad_input);
  const int64_t a_off = p.act_first ? 0 : p.width, b_off = p.act_first ? p.width : 0;
  pdl_wait_and_release();
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x)
    for (int64_t c = threadIdx.x; c < p.width; c += blockDim.x) {
      const float g = to_float(dy[r * p.width + c]);
      if (p.gated) {
        const T* row = x + r * 2 * p.width;
        T* grow = dx + r * 2 * p.width;
        const float2 d = gated_backward<T, A>(g, to_float(row[a_off + c]), to_float(row[b_off + c]));
        grow[a_off + c] = from_float<T>(d.x);
        grow[b_off + c] = from_float<T>(d.y);
      } else {
        dx[r * p.width + c] = from_float<T>(activate_backward<A>(g, to_float(x[r * p.width + c])));
      }
    }
}

template <typename T, Activation A> cudaError_t launch_bwd(const ActivationBwdArgs& a, cudaStream_t stream) {
  namespace config = activation_config;
  const bool pdl = dependent_launch_enabled();
  if (activation_bwd_path(a) == ActivationPath::kScalarFallback) {
    const int64_t row_blocks = a.rows < config::kScalarMaxBlocks ? a.rows : config::kScalarMaxBlocks;
    return launch_kernel(any_bwd_scalar<T, A>, dim3(unsigned(row_blocks)), dim3(config::kScalarThreads), 0, stream,
                         pdl, a);
  }
  if (a.gated) {
    const int64_t words = a.width / (16 / int64_t(sizeof(T)));
    const int threads = config::gated_bwd_threads(words);
    const dim3 grid(unsigned(ceil_div(words, threads)), unsigned(a.rows < 65535 ? a.rows : 65535));
    return launch_kernel(gated_bwd_vectorized<T, A>, grid, dim3(threads), 0, stream, pdl, a);
  }
  const int64_t words = a.rows * a.width / (16 / int64_t(sizeof(T)));
  auto kernel = plain_bwd_vectorized<T, A>;
  const int64_t grid = plan_stride_grid(kernel, config::kBwdPlainThreads, words, config::kBwdPlainGridPlan);
  if (grid < 0) return cudaGetLastError();
  return launch_kernel(kernel, dim3(unsigned(grid)), dim3(config::kBwdPlainThreads), 0, stream, pdl, a, words);
}

// --- head gate ---------------------------------------------------------------------------

// d(out)/d(logit) times the head's sum, from the sum of its D products (exact: of the products rounded
// to T, as eager's bf16 `dy * x` tensor): the formulas in activation.h.
template <typename T, bool kExact> __device__ __forceinline__ float head_gate_logit_grad(float sum, float logit,
                                                                                         float scale) {
  if constexpr (kExact) {
    const float s = round_through<T>(sigmoid_eager(logit));
    const float d_gate = round_through<T>(__fmul_rn(round_through<T>(sum), scale));
    return __fmul_rn(__fmul_rn(d_gate, 1.f - s), s);  // sigmoid_backward's a * (1 - b) * b, uncontracted
  } else {
    // sigmoid'(l) = s (1 - s) = 1 / (2 + e + 1 / e): positive terms, accurate where s rounds to 1;
    // e = inf or 0 (|l| past ~88) gives 0, the derivative's float32 value there.
    const float e = expf(-logit);
    return scale * __fdiv_rn(1.f, 2.f + e + __fdiv_rn(1.f, e)) * sum;
  }
}

// One product dy * x of the logit grad's sum (exact: rounded to T).
template <typename T, bool kExact> __device__ __forceinline__ float gate_product(float dy, float x) {
  return kExact ? round_through<T>(__fmul_rn(dy, x)) : __fmul_rn(dy, x);
}

// The sum of a word's products, left to right.
template <typename T, bool kExact> __device__ __forceinline__ float word_products(const uint4& dy, const uint4& x) {
  float s = 0.f;
  if constexpr (sizeof(T) == 4) {
    float g[4], v[4];
    unpack_word<T>(dy, g);
    unpack_word<T>(x, v);
#pragma unroll
    for (int j = 0; j < 4; ++j) s += gate_product<T, kExact>(g[j], v[j]);
  } else {
    const uint32_t ug[4] = {dy.x, dy.y, dy.z, dy.w}, ux[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 g = unpack_pair<T>(ug[k]), v = unpack_pair<T>(ux[k]);
      s += gate_product<T, kExact>(g.x, v.x);
      s += gate_product<T, kExact>(g.y, v.y);
    }
  }
  return s;
}

// One word of dy and of x per thread and grid step (the forward's layout). A head's `group` words
// (a power of two <= 32) are aligned lanes of one warp: their sums meet in a butterfly of shuffles
// (a fixed order), and the head's first lane writes the logit grad. The loop runs warp-uniformly (it
// tests the warp's first word), so every lane takes part in each shuffle.
template <typename T, bool kExact>
__global__ void head_gate_bwd_vectorized(HeadGateBwdArgs p, int64_t words, int group) {
  const T* dy = static_cast<const T*>(p.grad_out);
  const T* x = static_cast<const T*>(p.x);
  const T* logits = static_cast<const T*>(p.logits);
  uint4* dx = static_cast<uint4*>(p.grad_x);
  T* dlogits = static_cast<T*>(p.grad_logits);
  const int lane = threadIdx.x % 32;
  const int shift = __ffs(group) - 1;  // log2(group)
  pdl_wait_and_release();
  for (int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; w - lane < words;
       w += int64_t(gridDim.x) * blockDim.x) {
    const bool active = w < words;
    const int64_t head = w >> shift;
    float sum = 0.f, logit = 0.f;
    if (active) {
      logit = to_float(logits[head]);
      const uint4 g = load_word(dy, w), v = load_word(x, w);
      dx[w] = scaled_word<T>(g, head_gate_factor<T, kExact>(logit, p.scale));
      sum = word_products<T, kExact>(g, v);
    }
    for (int offset = group / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (active && (lane & (group - 1)) == 0)
      dlogits[head] = from_float<T>(head_gate_logit_grad<T, kExact>(sum, logit, p.scale));
  }
}

// Any head dim and alignment: one warp per (row, head), lanes striding over its D elements, then a
// butterfly of shuffles; lane 0 writes the logit grad.
template <typename T, bool kExact> __global__ void head_gate_bwd_scalar(HeadGateBwdArgs p, int64_t heads_total) {
  const T* dy = static_cast<const T*>(p.grad_out);
  const T* x = static_cast<const T*>(p.x);
  const T* logits = static_cast<const T*>(p.logits);
  T* dx = static_cast<T*>(p.grad_x);
  T* dlogits = static_cast<T*>(p.grad_logits);
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  pdl_wait_and_release();
  for (int64_t h = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; h < heads_total; h += warps) {
    const float logit = to_float(logits[h]);
    const float g = head_gate_factor<T, kExact>(logit, p.scale);
    float sum = 0.f;
    for (int64_t d = lane; d < p.head_dim; d += 32) {
      const int64_t e = h * p.head_dim + d;
      const float gy = to_float(dy[e]);
      dx[e] = from_float<T>(__fmul_rn(gy, g));
      sum += gate_product<T, kExact>(gy, to_float(x[e]));
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) dlogits[h] = from_float<T>(head_gate_logit_grad<T, kExact>(sum, logit, p.scale));
  }
}

template <typename T, bool kExact> cudaError_t launch_head_gate_bwd(const HeadGateBwdArgs& a, cudaStream_t stream) {
  namespace config = activation_config;
  const bool pdl = dependent_launch_enabled();
  const int64_t heads_total = a.rows * a.heads;
  if (head_gate_bwd_path(a) == ActivationPath::kScalarFallback) {
    const int64_t warps = config::kHeadGateBwdScalarThreads / 32;
    const int64_t needed = ceil_div(heads_total, warps);
    const int64_t blocks = needed < config::kHeadGateBwdScalarMaxBlocks ? needed : config::kHeadGateBwdScalarMaxBlocks;
    return launch_kernel(head_gate_bwd_scalar<T, kExact>, dim3(unsigned(blocks)),
                         dim3(config::kHeadGateBwdScalarThreads), 0, stream, pdl, a, heads_total);
  }
  constexpr int64_t kPerWord = 16 / int64_t(sizeof(T));
  const int64_t words_per_head = a.head_dim / kPerWord, words = heads_total * words_per_head;
  auto kernel = head_gate_bwd_vectorized<T, kExact>;
  const int64_t grid = plan_stride_grid(kernel, config::kHeadGateBwdThreads, words, config::kHeadGateBwdGridPlan);
  if (grid < 0) return cudaGetLastError();
  return launch_kernel(kernel, dim3(unsigned(grid)), dim3(config::kHeadGateBwdThreads), 0, stream, pdl, a, words,
                       int(words_per_head));
}

}  // namespace

ActivationPath activation_bwd_path(const ActivationBwdArgs& a) {
  const int64_t n = 16 / dtype_size(a.dtype);
  const bool sizes_ok = a.gated ? a.width % n == 0 : (a.rows * a.width) % n == 0;
  const bool ok = sizes_ok && is_aligned16(a.input) && is_aligned16(a.grad_out) && is_aligned16(a.grad_input);
  return ok ? ActivationPath::kVectorized : ActivationPath::kScalarFallback;
}

cudaError_t activation_bwd(const ActivationBwdArgs& a, cudaStream_t stream) {
  if (a.rows == 0 || a.width == 0) return cudaSuccess;
  return visit_dtype(a.dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    // Plain fast GELU: the derivative alone, so the exact kernel.
    const Activation act = a.activation == Activation::kGeluTanhFast && !a.gated ? Activation::kGeluTanh : a.activation;
    return visit_activation(act, [&](auto kind) { return launch_bwd<T, decltype(kind)::value>(a, stream); });
  });
}

ActivationPath head_gate_bwd_path(const HeadGateBwdArgs& a) {
  const int64_t n = 16 / dtype_size(a.dtype);
  const int64_t wph = a.head_dim / n;
  const bool group_ok = a.head_dim % n == 0 && wph >= 1 && wph <= 32 && (wph & (wph - 1)) == 0;
  const bool ok = group_ok && is_aligned16(a.x) && is_aligned16(a.grad_out) && is_aligned16(a.grad_x);
  return ok ? ActivationPath::kVectorized : ActivationPath::kScalarFallback;
}

cudaError_t head_gate_bwd(const HeadGateBwdArgs& a, cudaStream_t stream) {
  if (a.rows == 0 || a.heads == 0) return cudaSuccess;
  if (a.grad_logits == nullptr || a.head_dim == 0) {
    if (a.grad_logits != nullptr) {  // heads of no elements: each logit grad is a sum over nothing
      const size_t bytes = size_t(a.rows * a.heads) * size_t(dtype_size(a.dtype));
      if (const cudaError_t e = cudaMemsetAsync(a.grad_logits, 0, bytes, stream); e != cudaSuccess) return e;
    }
    // grad_x alone: the forward on grad_out (one read, one write).
    HeadGateArgs f;
    f.out = a.grad_x;
    f.x = a.grad_out;
    f.logits = a.logits;
    f.rows = a.rows;
    f.heads = a.heads;
    f.head_dim = a.head_dim;
    f.scale = a.scale;
    f.dtype = a.dtype;
    f.exact = a.exact;
    return head_gate(f, stream);
  }
  return visit_dtype(a.dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    return a.exact ? launch_head_gate_bwd<T, true>(a, stream) : launch_head_gate_bwd<T, false>(a, stream);
  });
}

}  // namespace ltx
