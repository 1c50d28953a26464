// Interleaved-pair RoPE (formula in rope.h). Memory-bound: per element it
// moves x and out (2 bytes each in bf16) and 8 bytes of float32 tables, so
// the tables dominate unless they are shared across the batch (stride 0,
// then they are read once per token). A block walks tokens with a grid
// stride; its threads take 16-byte words of x (4 pairs in bf16) and the
// matching 32 bytes of cos and sin.
#include "../common/launch.cuh"
#include "rope.h"
#include "rope_config.h"

namespace ltx {
namespace {

// kTranspose: the backward, the transpose of the pair's matrix [[c0, -s0], [s1, c1]]
// (the rotation by -theta when c0 == c1 and s0 == s1), the same float32 roundings.
template <bool kTranspose>
__device__ __forceinline__ void rotate_pair(float x0, float x1, float c0, float c1, float s0, float s1, float& y0,
                                            float& y1) {
  if (kTranspose) {
    y0 = __fadd_rn(__fmul_rn(x0, c0), __fmul_rn(x1, s1));
    y1 = __fadd_rn(__fmul_rn(x1, c1), __fmul_rn(-x0, s0));
  } else {
    y0 = __fadd_rn(__fmul_rn(x0, c0), __fmul_rn(-x1, s0));
    y1 = __fadd_rn(__fmul_rn(x1, c1), __fmul_rn(x0, s1));
  }
}

template <typename T> struct RowPtrs {
  const T* x;
  const float* cos;
  const float* sin;
  T* out;
};

template <typename T> __device__ __forceinline__ RowPtrs<T> row_ptrs(const RopeArgs& a, int64_t b, int64_t s) {
  return {static_cast<const T*>(a.x.ptr) + b * a.x.batch_stride + s * a.x.seq_stride,
          static_cast<const float*>(a.cos.ptr) + b * a.cos.batch_stride + s * a.cos.seq_stride,
          static_cast<const float*>(a.sin.ptr) + b * a.sin.batch_stride + s * a.sin.seq_stride,
          static_cast<T*>(a.out) + b * a.out_batch_stride + s * a.out_seq_stride};
}

// A block walks tokens; each thread takes a word of the token's tables and
// applies it to that word of every sample, so tables shared by the batch
// (stride 0) are loaded once per token, and the samples' loads are in flight
// together.
template <typename T, bool kTranspose> __global__ void rope_vectorized(RopeArgs a) {
  constexpr int N = 16 / sizeof(T);  // elements per word, even
  constexpr int kSamples = 2;        // samples loaded before the first store
  const int64_t words = a.dim / N;
  const bool shared_tables = a.cos.batch_stride == 0 && a.sin.batch_stride == 0;
  pdl_wait_and_release();
  for (int64_t s = blockIdx.x; s < a.seq; s += gridDim.x) {
    for (int64_t w = threadIdx.x; w < words; w += blockDim.x) {
      float c[N], sn[N];
      for (int64_t b0 = 0; b0 < a.batch; b0 += kSamples) {
        float x[kSamples][N];
#pragma unroll
        for (int k = 0; k < kSamples; ++k)
          if (b0 + k < a.batch) load_vec<T, N>(row_ptrs<T>(a, b0 + k, s).x + w * N, x[k]);
#pragma unroll
        for (int k = 0; k < kSamples; ++k) {
          const int64_t b = b0 + k;
          if (b >= a.batch) break;
          const RowPtrs<T> p = row_ptrs<T>(a, b, s);
          if (b == 0 || !shared_tables) {
            load_vec<float, N>(p.cos + w * N, c);
            load_vec<float, N>(p.sin + w * N, sn);
          }
          float y[N];
#pragma unroll
          for (int j = 0; j < N; j += 2)
            rotate_pair<kTranspose>(x[k][j], x[k][j + 1], c[j], c[j + 1], sn[j], sn[j + 1], y[j], y[j + 1]);
          store_vec<T, N>(p.out + w * N, y);
        }
      }
    }
  }
}

template <typename T, bool kTranspose> __global__ void rope_scalar(RopeArgs a) {
  const int64_t pairs = a.dim / 2, rows = a.batch * a.seq;
  pdl_wait_and_release();
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    // Token-major (the samples of one token back to back): a table shared by
    // the batch (stride 0) is then read from HBM once, the repeats hit L1/L2.
    const int64_t s = row / a.batch;
    const RowPtrs<T> p = row_ptrs<T>(a, row - s * a.batch, s);
    for (int64_t i = threadIdx.x; i < pairs; i += blockDim.x) {
      const int64_t c = 2 * i;
      float y0, y1;
      rotate_pair<kTranspose>(to_float(p.x[c]), to_float(p.x[c + 1]), p.cos[c], p.cos[c + 1], p.sin[c],
                              p.sin[c + 1], y0, y1);
      p.out[c] = from_float<T>(y0);
      p.out[c + 1] = from_float<T>(y1);
    }
  }
}

bool words_ok(const void* p, int64_t batch_stride, int64_t seq_stride, int64_t elem_per_word) {
  return is_aligned16(p) && batch_stride % elem_per_word == 0 && seq_stride % elem_per_word == 0;
}

}  // namespace

RopePath rope_path(const RopeArgs& a) {
  const int64_t n = 16 / dtype_size(a.dtype);
  // A word of x (n elements) pairs with n floats of each table: n * 4 bytes, whole words too.
  const bool ok = a.dim % n == 0 && words_ok(a.x.ptr, a.x.batch_stride, a.x.seq_stride, n) &&
                  words_ok(a.out, a.out_batch_stride, a.out_seq_stride, n) &&
                  words_ok(a.cos.ptr, a.cos.batch_stride, a.cos.seq_stride, 4) &&
                  words_ok(a.sin.ptr, a.sin.batch_stride, a.sin.seq_stride, 4);
  return ok ? RopePath::kVectorized : RopePath::kScalarFallback;
}

cudaError_t apply_rotary_emb(const RopeArgs& a, cudaStream_t stream) {
  const int64_t rows = a.batch * a.seq;
  if (rows == 0 || a.dim == 0) return cudaSuccess;
  if (a.dim % 2) return cudaErrorInvalidValue;
  const bool vectorized = rope_path(a) == RopePath::kVectorized;
  const int64_t blocks = vectorized ? a.seq : rows;  // the vectorized kernel's blocks walk tokens
  const dim3 grid(unsigned(blocks < rope_config::kMaxBlocks ? blocks : rope_config::kMaxBlocks));
  return visit_dtype(a.dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    if (a.transpose)
      return launch_kernel(vectorized ? rope_vectorized<T, true> : rope_scalar<T, true>, grid,
                           dim3(rope_config::kThreads), 0, stream, dependent_launch_enabled(), a);
    return launch_kernel(vectorized ? rope_vectorized<T, false> : rope_scalar<T, false>, grid,
                         dim3(rope_config::kThreads), 0, stream, dependent_launch_enabled(), a);
  });
}

}  // namespace ltx
