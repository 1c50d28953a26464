// x += y in place, y broadcast to x: x = T_x(float(x) + float(y)), one
// rounding (torch's add_ computes in fp32 for half x, with an fp32 or a
// half y alike).
//
// The dims are first merged where both x and y stay uniformly strided, so
// the common cases become one or two dims. Three kernels:
//   contiguous   same-shape contiguous x and y: 16-byte words of x (and the
//                matching 16 or 32 bytes of y), a scalar tail for numel not
//                a multiple of a word;
//   broadcast    contiguous x, y broadcast ([C,1,1,1], [D], [1], ...): words
//                of x, one y offset per word from the merged layout; y read
//                as a vector when its innermost dim is contiguous, as one
//                value for the word when that dim is broadcast;
//   strided      anything else (x a strided view, misaligned pointers):
//                scalar, one offset pair per element.
// Index arithmetic is 32-bit when numel fits, each division by a dim's size
// then a multiply-high and a shift (divisions were the cost of the broadcast
// and strided kernels).
#include <cstdint>
#include <type_traits>

#include "../common/launch.cuh"
#include "inplace_add.h"
#include "vae_config.h"

namespace ltx {
namespace {

constexpr int kBlock = vae_config::kAddBlock;

// Shape and strides after merging; innermost dim last. `div` is set for
// 32-bit indexing (numel <= UINT32_MAX).
struct Layout {
  int ndim;
  int64_t sizes[kMaxElementwiseDims];
  int64_t x_strides[kMaxElementwiseDims];
  int64_t y_strides[kMaxElementwiseDims];
  DivU32 div[kMaxElementwiseDims];
};

Layout merge_dims(const InplaceAddArgs& a) {
  Layout l{};
  for (int d = 0; d < a.ndim; ++d) {
    if (a.sizes[d] == 1) continue;  // contributes no offset
    const int last = l.ndim - 1;
    // Dim d is inner to l's last: merge when both strides continue evenly.
    if (l.ndim > 0 && l.x_strides[last] == a.x_strides[d] * a.sizes[d] &&
        l.y_strides[last] == a.y_strides[d] * a.sizes[d]) {
      l.sizes[last] *= a.sizes[d];
      l.x_strides[last] = a.x_strides[d];
      l.y_strides[last] = a.y_strides[d];
      continue;
    }
    l.sizes[l.ndim] = a.sizes[d];
    l.x_strides[l.ndim] = a.x_strides[d];
    l.y_strides[l.ndim] = a.y_strides[d];
    ++l.ndim;
  }
  if (l.ndim == 0) l = Layout{1, {1}, {1}, {0}};  // a single element
  return l;
}

int64_t numel_of(const Layout& l) {
  int64_t n = 1;
  for (int d = 0; d < l.ndim; ++d) n *= l.sizes[d];
  return n;
}

bool x_contiguous(const Layout& l) {
  int64_t expected = 1;
  for (int d = l.ndim - 1; d >= 0; --d) {
    if (l.x_strides[d] != expected) return false;
    expected *= l.sizes[d];
  }
  return true;
}

// Offsets of element `i` (row-major over l.sizes) in x and y.
template <typename I>
__host__ __device__ __forceinline__ void offsets(const Layout& l, I i, int64_t& x_off, int64_t& y_off) {
  x_off = 0;
  y_off = 0;
  for (int d = l.ndim - 1; d > 0; --d) {
    const I size = I(l.sizes[d]);
    I q;
    if constexpr (sizeof(I) == 4) {
      q = l.div[d].div(i);
    } else {
      q = i / size;
    }
    const I idx = i - q * size;
    x_off += int64_t(idx) * l.x_strides[d];
    y_off += int64_t(idx) * l.y_strides[d];
    i = q;
  }
  x_off += int64_t(i) * l.x_strides[0];
  y_off += int64_t(i) * l.y_strides[0];
}

// The y values that go with one 16-byte word of x: N elements of Ty, 1 or
// 2 words, kept packed in registers until used.
template <typename Tx, typename Ty> struct YWords {
  static constexpr int N = 16 / sizeof(Tx);
  static constexpr int kWords = N * sizeof(Ty) / 16;
  uint4 raw[kWords];

  __device__ __forceinline__ void load(const Ty* y) {  // y 16-byte aligned
#pragma unroll
    for (int w = 0; w < kWords; ++w) raw[w] = reinterpret_cast<const uint4*>(y)[w];
  }
  __device__ __forceinline__ float get(int j) const {  // j a compile-time constant after unrolling
    return to_float(reinterpret_cast<const Ty*>(raw)[j]);
  }
};

// x word = T_x(float(x) + y_j) for each of its N elements.
template <typename Tx, typename F> __device__ __forceinline__ void add_word(Tx* x, const uint4& xw, F y_of) {
  constexpr int N = 16 / sizeof(Tx);
  float v[N];
  unpack_word<Tx>(xw, v);
#pragma unroll
  for (int j = 0; j < N; ++j) v[j] += y_of(j);
  store_vec<Tx, N>(x, v);
}

template <typename Tx, typename Ty, int W>
__global__ void __launch_bounds__(kBlock) add_contiguous(Tx* x, const Ty* y, int64_t words, int64_t numel) {
  pdl_wait_and_release();
  constexpr int N = 16 / sizeof(Tx);
  const int64_t first = int64_t(blockIdx.x) * kBlock * W + threadIdx.x;
  uint4 xw[W];
  YWords<Tx, Ty> yw[W];
#pragma unroll
  for (int k = 0; k < W; ++k) {  // all loads before any store
    const int64_t w = first + int64_t(k) * kBlock;
    if (w < words) {
      xw[k] = reinterpret_cast<const uint4*>(x)[w];
      yw[k].load(y + w * N);
    }
  }
#pragma unroll
  for (int k = 0; k < W; ++k) {
    const int64_t w = first + int64_t(k) * kBlock;
    if (w < words) add_word<Tx>(x + w * N, xw[k], [&](int j) { return yw[k].get(j); });
  }
  const int64_t tail = numel - words * N;  // < N elements after the last whole word
  if (blockIdx.x == 0 && threadIdx.x < tail) {
    const int64_t e = words * N + threadIdx.x;
    x[e] = from_float<Tx>(to_float(x[e]) + to_float(y[e]));
  }
}

template <typename Tx, typename Ty, typename I, bool kYInnerContiguous, int W>
__global__ void __launch_bounds__(kBlock) add_broadcast(Tx* x, const Ty* y, Layout l, int64_t words) {
  pdl_wait_and_release();
  constexpr int N = 16 / sizeof(Tx);
  const int64_t first = int64_t(blockIdx.x) * kBlock * W + threadIdx.x;
  uint4 xw[W];
  YWords<Tx, Ty> yw[W];  // y innermost dim contiguous: N values
  float y1[W];           // y innermost dim broadcast: one value
#pragma unroll
  for (int k = 0; k < W; ++k) {
    const int64_t w = first + int64_t(k) * kBlock;
    if (w >= words) continue;
    int64_t x_off, y_off;  // x_off == w * N: x is contiguous
    offsets<I>(l, I(w * N), x_off, y_off);
    xw[k] = reinterpret_cast<const uint4*>(x)[w];
    if constexpr (kYInnerContiguous) {
      yw[k].load(y + y_off);
    } else {  // the word lies within one run of the broadcast innermost dim
      y1[k] = to_float(y[y_off]);
    }
  }
#pragma unroll
  for (int k = 0; k < W; ++k) {
    const int64_t w = first + int64_t(k) * kBlock;
    if (w >= words) continue;
    if constexpr (kYInnerContiguous) {
      add_word<Tx>(x + w * N, xw[k], [&](int j) { return yw[k].get(j); });
    } else {
      add_word<Tx>(x + w * N, xw[k], [&](int) { return y1[k]; });
    }
  }
}

template <typename Tx, typename Ty, typename I>
__global__ void __launch_bounds__(kBlock) add_strided(Tx* x, const Ty* y, Layout l, int64_t numel) {
  pdl_wait_and_release();
  for (int64_t i = int64_t(blockIdx.x) * kBlock + threadIdx.x; i < numel; i += int64_t(gridDim.x) * kBlock) {
    int64_t x_off, y_off;
    offsets<I>(l, I(i), x_off, y_off);
    x[x_off] = from_float<Tx>(to_float(x[x_off]) + to_float(y[y_off]));
  }
}

// f(W) for vae_config's 16-byte words of x per thread; development builds also compile 2 and 4 (the
// `inplace_add.words` override, A/B).
template <typename F> cudaError_t with_words_per_thread(F&& f) {
  if constexpr (tuning::kDevBuild) {
    switch (tuning::override_of(tuning::Knob::kInplaceAddWords)) {
      case 2: return f(std::integral_constant<int, 2>{});
      case 4: return f(std::integral_constant<int, 4>{});
    }
  }
  return f(std::integral_constant<int, vae_config::kAddWordsPerThread>{});
}

int word_elems(DType x_dtype) { return 16 / dtype_size(x_dtype); }

InplaceAddPath path_of(const InplaceAddArgs& a, const Layout& l) {
  const int64_t n = word_elems(a.x_dtype);
  if (!is_aligned16(a.x) || !x_contiguous(l)) return InplaceAddPath::kStrided;
  const int last = l.ndim - 1;
  if (l.ndim == 1 && l.y_strides[0] == 1 && is_aligned16(a.y)) return InplaceAddPath::kContiguous;
  if (l.sizes[last] % n != 0) return InplaceAddPath::kStrided;
  if (l.y_strides[last] == 0) return InplaceAddPath::kVectorizedBroadcast;
  if (l.y_strides[last] != 1 || !is_aligned16(a.y)) return InplaceAddPath::kStrided;
  for (int d = 0; d < last; ++d)  // every word's y run must start 16-byte aligned
    if (l.y_strides[d] % n != 0) return InplaceAddPath::kStrided;
  return InplaceAddPath::kVectorizedBroadcast;
}

template <typename Tx, typename Ty, typename I>
cudaError_t launch_indexed(const InplaceAddArgs& a, const Layout& l, InplaceAddPath path, int64_t numel,
                           cudaStream_t stream) {
  Tx* x = static_cast<Tx*>(a.x);
  const Ty* y = static_cast<const Ty*>(a.y);
  if (path == InplaceAddPath::kVectorizedBroadcast) {
    const int64_t words = numel / word_elems(a.x_dtype);
    return with_words_per_thread([&](auto w_tag) {
      constexpr int W = decltype(w_tag)::value;
      const dim3 grid(unsigned(ceil_div(words, int64_t(kBlock) * W)));
      const auto kernel =
          l.y_strides[l.ndim - 1] == 0 ? add_broadcast<Tx, Ty, I, false, W> : add_broadcast<Tx, Ty, I, true, W>;
      return launch_kernel(kernel, grid, dim3(kBlock), 0, stream, dependent_launch_enabled(), x, y, l, words);
    });
  }
  const int64_t blocks = ceil_div(numel, kBlock);
  const dim3 grid(unsigned(blocks < vae_config::kAddMaxStridedBlocks ? blocks : vae_config::kAddMaxStridedBlocks));
  return launch_kernel(add_strided<Tx, Ty, I>, grid, dim3(kBlock), 0, stream, dependent_launch_enabled(), x, y, l,
                       numel);
}

template <typename Tx, typename Ty> cudaError_t launch(const InplaceAddArgs& a, cudaStream_t stream) {
  const Layout l = merge_dims(a);
  const int64_t numel = numel_of(l);
  const InplaceAddPath path = path_of(a, l);
  if (path == InplaceAddPath::kContiguous) {
    const int64_t words = numel / word_elems(a.x_dtype);
    return with_words_per_thread([&](auto w_tag) {
      constexpr int W = decltype(w_tag)::value;
      const int64_t blocks = words == 0 ? 1 : ceil_div(words, int64_t(kBlock) * W);
      return launch_kernel(add_contiguous<Tx, Ty, W>, dim3(unsigned(blocks)), dim3(kBlock), 0, stream,
                           dependent_launch_enabled(), static_cast<Tx*>(a.x), static_cast<const Ty*>(a.y), words,
                           numel);
    });
  }
  if (numel <= int64_t(UINT32_MAX)) {
    Layout l32 = l;
    for (int d = 0; d < l.ndim; ++d) l32.div[d] = DivU32::of(uint64_t(l.sizes[d]));
    return launch_indexed<Tx, Ty, uint32_t>(a, l32, path, numel, stream);
  }
  return launch_indexed<Tx, Ty, uint64_t>(a, l, path, numel, stream);
}

bool args_ok(const InplaceAddArgs& a) {
  if (a.ndim < 0 || a.ndim > kMaxElementwiseDims) return false;
  return a.y_dtype == a.x_dtype || a.y_dtype == DType::kFloat32;
}

}  // namespace

InplaceAddPath inplace_add_path(const InplaceAddArgs& a) { return path_of(a, merge_dims(a)); }

cudaError_t inplace_add(const InplaceAddArgs& a, cudaStream_t stream) {
  if (!args_ok(a)) return cudaErrorInvalidValue;
  for (int d = 0; d < a.ndim; ++d)
    if (a.sizes[d] == 0) return cudaSuccess;
  return visit_dtype(a.x_dtype, [&](auto tag) -> cudaError_t {
    using Tx = typename decltype(tag)::type;
    if (a.y_dtype == a.x_dtype) return launch<Tx, Tx>(a, stream);
    return launch<Tx, float>(a, stream);
  });
}

}  // namespace ltx
