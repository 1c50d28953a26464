// 1-D and 3-D (Wan-style) RoPE on [batch, seq, heads, head_dim] query and key,
// in place (formula and contract in rope_axes.h).
//
// Memory-bound: every element is read once and written once. The angle of a
// pair depends only on the token and the pair, not on the head or the batch,
// so a block first computes cos/sin of every (token, pair) it rotates into
// shared memory, once each; then a thread owns one unit (a 16-byte word, or
// one pair on the scalar path) of the head dim of one (batch, token) and
// rotates that unit in heads group, group + head_groups, ... of query and then
// of key, several loads in flight before the stores. Consecutive threads take
// consecutive units of a head, then the next head, so a warp reads whole
// 16-byte-word runs.
#include <algorithm>
#include <cmath>

#include "../common/launch.cuh"
#include "rope_axes.h"
#include "rope_axes_config.h"

namespace ltx {
namespace {

// Everything the kernel needs, passed by value as a __grid_constant__
// argument (about 2.2 KB): the per-pair frequency table lives in the
// launch's parameter space, not in global memory, and every launch has its own.
struct RopeAxesParams {
  RopeAxesOperand query, key;
  int64_t batch, seq, height, width;
  int units_per_head;  // head_dim / elements per unit
  int head_groups;     // threads sharing one unit position of a token
  int axis_begin[2];   // first pair of the height and of the width part
  float freq_hi[kRopeAxesMaxPairs];  // theta_base^(-2j/d) = hi + lo, formed in long double on the host
  float freq_lo[kRopeAxesMaxPairs];
  // The functional launch's alone (after everything the in-place one reads, which keeps its layout).
  RopeAxesSource query_src, key_src;
  bool inverse;  // the backward: sin negated
};

// Beyond this angle the float32 remainder of pos * freq (up to half an ulp of
// the angle) is too large for the second-order correction below to stay
// within float32 accuracy; such pairs (only with positions >= 2^17) take a
// float64 sincos instead.
constexpr float kMaxCorrectedAngle = 131072.f;

// cos and sin of pos * (hi + lo), pos an integer below 2^24.
__device__ __forceinline__ void pair_cos_sin(float pos, float hi, float lo, float& c, float& s) {
  const float a = __fmul_rn(pos, hi);
  if (a >= kMaxCorrectedAngle) {
    double sd, cd;
    sincos(double(pos) * (double(hi) + double(lo)), &sd, &cd);
    c = float(cd);
    s = float(sd);
    return;
  }
  // a + e equals pos * (hi + lo) to ~2^-46 relative: the fma gives the
  // rounding error of a exactly, and pos * lo adds the rest of the frequency.
  // (Explicit fmas: the same rounding on the vector and the scalar path.)
  const float e = fmaf(pos, lo, fmaf(pos, hi, -a));
  float s0, c0;
  sincosf(a, &s0, &c0);
  // sin(a + e) = s0 (1 - e^2/2) + c0 e, cos(a + e) = c0 (1 - e^2/2) - s0 e, |e| <= 2^-8.
  const float h = 0.5f * e * e;
  s = fmaf(c0, e, fmaf(-h, s0, s0));
  c = fmaf(-s0, e, fmaf(-h, c0, c0));
}

// One unit of U elements as loaded, unpacked only when it is rotated (half
// the registers of floats for 16-bit types, so more loads fit in flight): a
// 16-byte word when U elements fill one (the caller guarantees alignment),
// separate elements on the scalar path. kStream: words loaded and stored
// evict-first (rope_axes_config::kStreamOutOfPlace).
template <typename T, int U, bool kStream, bool kWord = U * sizeof(T) == 16> struct UnitBits;

template <typename T, int U, bool kStream> struct UnitBits<T, U, kStream, true> {
  uint4 word;
  __device__ __forceinline__ void load(const T* p) {
    const uint4* w = reinterpret_cast<const uint4*>(p);
    word = kStream ? __ldcs(w) : *w;
  }
  __device__ __forceinline__ void unpack(float (&x)[U]) const { unpack_word<T>(word, x); }
  __device__ __forceinline__ static void store(T* p, const float (&y)[U]) {
    uint4* w = reinterpret_cast<uint4*>(p);
    if constexpr (kStream) __stcs(w, pack_word<T>(y));
    else *w = pack_word<T>(y);
  }
};

template <typename T, int U, bool kStream> struct UnitBits<T, U, kStream, false> {
  T e[U];
  __device__ __forceinline__ void load(const T* p) {
#pragma unroll
    for (int j = 0; j < U; ++j) e[j] = p[j];
  }
  __device__ __forceinline__ void unpack(float (&x)[U]) const {
#pragma unroll
    for (int j = 0; j < U; ++j) x[j] = to_float(e[j]);
  }
  __device__ __forceinline__ static void store(T* p, const float (&y)[U]) {
#pragma unroll
    for (int j = 0; j < U; ++j) p[j] = from_float<T>(y[j]);
  }
};

// Rotate the unit at element offset `unit` of heads first, first + step, ...
// of token s in sample b of `t`, kInFlight loads issued before the first store.
// kSource: read from the operand's `src` with its strides (out of place), else in place.
template <typename T, int U, int kInFlight, bool kSource>
__device__ __forceinline__ void rotate_heads(const RopeAxesOperand& t, const RopeAxesSource& from, int64_t b,
                                             int64_t s, int unit, int first,
                                             int step, const float (&c)[U / 2], const float (&sn)[U / 2]) {
  T* base = static_cast<T*>(t.ptr) + b * t.batch_stride + s * t.seq_stride + int64_t(unit) * U;
  const T* src = kSource ? static_cast<const T*>(from.ptr) + b * from.batch_stride + s * from.seq_stride +
                               int64_t(unit) * U
                         : nullptr;
  constexpr bool kStream = kSource && rope_axes_config::kStreamOutOfPlace;
  for (int64_t h0 = first; h0 < t.heads; h0 += int64_t(kInFlight) * step) {
    UnitBits<T, U, kStream> bits[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      const int64_t h = h0 + int64_t(i) * step;
      if constexpr (kSource) {
        if (h < t.heads) bits[i].load(src + h * from.head_stride);
      } else {
        if (h < t.heads) bits[i].load(base + h * t.head_stride);
      }
    }
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      const int64_t h = h0 + int64_t(i) * step;
      if (h >= t.heads) break;
      float x[U], y[U];
      bits[i].unpack(x);
#pragma unroll
      for (int k = 0; k < U / 2; ++k) {
        y[2 * k] = fmaf(x[2 * k], c[k], -x[2 * k + 1] * sn[k]);
        y[2 * k + 1] = fmaf(x[2 * k + 1], c[k], x[2 * k] * sn[k]);
      }
      UnitBits<T, U, kStream>::store(base + h * t.head_stride, y);
    }
  }
}

// (frame, row, column) of token s. 64-bit division is a long instruction
// sequence on the GPU, so the usual sequence lengths divide in 32 bits.
template <typename I> __device__ __forceinline__ void grid_position(I s, I height, I width, float (&pos)[3]) {
  const I row = s / width, frame = row / height;
  pos[0] = float(frame);
  pos[1] = float(row - frame * height);
  pos[2] = float(s - row * width);
}

__device__ __forceinline__ void token_position(const RopeAxesParams& p, int64_t s, float (&pos)[3]) {
  if (p.seq <= int64_t(UINT32_MAX)) grid_position<uint32_t>(uint32_t(s), uint32_t(p.height), uint32_t(p.width), pos);
  else grid_position<uint64_t>(uint64_t(s), uint64_t(p.height), uint64_t(p.width), pos);
}

// cos/sin of a block's (token, pair)s: tokens * units <= kBlockThreads and
// U / 2 <= 4 pairs per unit.
constexpr int kBlockThreads = rope_axes_config::kBlockThreads;
constexpr int kMaxBlockAngles = kBlockThreads * 4;

// blockDim = (units_per_head * head_groups, tokens per block); gridDim.y
// walks the batch. The block's angles are computed once per (token, pair),
// before any thread rotates: with each thread computing its own unit's
// angles, every head group (8 at 32 heads of 64) repeated the sincos.
// kFunctional: the out-of-place functional op autograd uses (sources, and the backward's
// inverse rotation); the in-place op's instantiation is the code without either.
template <typename T, int U, int kInFlight, bool kFunctional>
__global__ void __launch_bounds__(kBlockThreads) rope_axes_kernel(const __grid_constant__ RopeAxesParams p) {
  static_assert(U / 2 * kBlockThreads <= kMaxBlockAngles, "a unit's pairs must fit the block's angle table");
  __shared__ float2 angles[kMaxBlockAngles];  // (cos, sin), [token in block][pair]
  const int unit = threadIdx.x % p.units_per_head;
  const int group = threadIdx.x / p.units_per_head;
  const int pairs = p.units_per_head * (U / 2);
  const int block_angles = int(blockDim.y) * pairs;
  const int thread = threadIdx.y * blockDim.x + threadIdx.x;
  for (int64_t first = int64_t(blockIdx.x) * blockDim.y; first < p.seq; first += int64_t(gridDim.x) * blockDim.y) {
    if (first != int64_t(blockIdx.x) * blockDim.y) __syncthreads();  // the previous tokens' angles are read
    for (int i = thread; i < block_angles; i += blockDim.x * blockDim.y) {
      const int token = i / pairs, pair = i - token * pairs;
      if (first + token >= p.seq) break;
      float pos[3], c, sn;
      token_position(p, first + token, pos);
      const float at = pair < p.axis_begin[0] ? pos[0] : pair < p.axis_begin[1] ? pos[1] : pos[2];
      pair_cos_sin(at, p.freq_hi[pair], p.freq_lo[pair], c, sn);
      angles[i] = make_float2(c, sn);
    }
    __syncthreads();
    // The angles need nothing of the previous kernel: under dependent launch
    // they are computed while it drains, and only q/k wait for it.
    pdl_wait_and_release();
    const int64_t s = first + threadIdx.y;
    if (s >= p.seq) continue;
    float c[U / 2], sn[U / 2];
#pragma unroll
    for (int k = 0; k < U / 2; ++k) {
      const float2 a = angles[threadIdx.y * pairs + unit * (U / 2) + k];
      c[k] = a.x;
      sn[k] = kFunctional && p.inverse ? -a.y : a.y;
    }
    for (int64_t b = blockIdx.y; b < p.batch; b += gridDim.y) {
      rotate_heads<T, U, kInFlight, kFunctional>(p.query, p.query_src, b, s, unit, group, p.head_groups, c, sn);
      rotate_heads<T, U, kInFlight, kFunctional>(p.key, p.key_src, b, s, unit, group, p.head_groups, c, sn);
    }
  }
}

// A word-aligned operand: pointer on 16 bytes, strides of non-trivial dims in whole words.
bool words_ok(const RopeAxesOperand& t, const RopeAxesSource& from, int64_t batch, int64_t seq,
              int64_t elems_per_word) {
  if (t.heads == 0) return true;
  const auto whole = [&](int64_t size, int64_t stride) { return size <= 1 || stride % elems_per_word == 0; };
  const bool dst_ok = is_aligned16(t.ptr) && whole(batch, t.batch_stride) && whole(seq, t.seq_stride) &&
                      whole(t.heads, t.head_stride);
  return dst_ok && (from.ptr == nullptr || (is_aligned16(from.ptr) && whole(batch, from.batch_stride) &&
                                            whole(seq, from.seq_stride) && whole(t.heads, from.head_stride)));
}

// The operand itself as its source (in place), for a functional launch where the other has one.
RopeAxesSource source_of(const RopeAxesOperand& t, const RopeAxesSource& from) {
  return from.ptr != nullptr ? from : RopeAxesSource{t.ptr, t.batch_stride, t.seq_stride, t.head_stride};
}

// frames * height * width == seq without overflow (each factor is at most 2^24).
bool grid_ok(const RopeAxesArgs& a) {
  const int64_t plane = a.height * a.width;
  return plane == 0 ? a.seq == 0 : a.seq % plane == 0 && a.seq / plane == a.frames;
}

bool args_ok(const RopeAxesArgs& a) {
  const int64_t* d = a.split;
  const auto position_ok = [](int64_t n) { return n >= 0 && n <= kRopeAxesMaxPosition; };
  return a.batch >= 0 && a.seq >= 0 && a.query.heads >= 0 && a.key.heads >= 0 && a.head_dim >= 0 &&
         a.head_dim % 2 == 0 && a.head_dim <= 2 * kRopeAxesMaxPairs && d[0] >= 0 && d[1] >= 0 && d[2] >= 0 &&
         d[0] % 2 == 0 && d[1] % 2 == 0 && d[2] % 2 == 0 && d[0] + d[1] + d[2] == a.head_dim &&
         position_ok(a.frames) && position_ok(a.height) && position_ok(a.width) && grid_ok(a) &&
         std::isfinite(a.theta_base) && a.theta_base > 0;
}

template <typename T, int U>
cudaError_t launch(RopeAxesParams& p, int64_t head_dim, int64_t max_heads, cudaStream_t stream) {
  namespace config = rope_axes_config;
  const int units = int(head_dim / U);  // <= kRopeAxesMaxPairs
  const bool functional = p.inverse || p.query_src.ptr != p.query.ptr || p.key_src.ptr != p.key.ptr;
  p.units_per_head = units;
  p.head_groups = int(config::head_groups(max_heads, units, functional));
  const int per_token = units * p.head_groups;  // <= kBlockThreads
  const int tokens = per_token < kBlockThreads ? kBlockThreads / per_token : 1;
  const int64_t token_blocks = ceil_div(p.seq, tokens);
  const dim3 grid(unsigned(token_blocks < config::kMaxTokenBlocks ? token_blocks : config::kMaxTokenBlocks),
                  unsigned(p.batch < config::kMaxBatchBlocks ? p.batch : config::kMaxBatchBlocks));
  const bool two = config::loads_in_flight(ceil_div(max_heads, p.head_groups)) == 2;
  const auto kernel = functional ? (two ? rope_axes_kernel<T, U, 2, true> : rope_axes_kernel<T, U, 4, true>)
                                 : (two ? rope_axes_kernel<T, U, 2, false> : rope_axes_kernel<T, U, 4, false>);
  return launch_kernel(kernel, grid, dim3(per_token, tokens), 0, stream, dependent_launch_enabled(), p);
}

}  // namespace

RopeAxesPath rope_axes_path(const RopeAxesArgs& a) {
  const int64_t n = 16 / dtype_size(a.dtype);
  const bool ok = a.head_dim % n == 0 && words_ok(a.query, a.query_src, a.batch, a.seq, n) &&
                  words_ok(a.key, a.key_src, a.batch, a.seq, n);
  return ok ? RopeAxesPath::kVectorized : RopeAxesPath::kScalarFallback;
}

cudaError_t rope_axes(const RopeAxesArgs& a, cudaStream_t stream) {
  if (!args_ok(a)) return cudaErrorInvalidValue;
  const int64_t max_heads = a.query.heads > a.key.heads ? a.query.heads : a.key.heads;
  if (a.batch == 0 || a.seq == 0 || max_heads == 0 || a.head_dim == 0) return cudaSuccess;

  RopeAxesParams p{};
  p.query = a.query;
  p.key = a.key;
  p.query_src = source_of(a.query, a.query_src);
  p.key_src = source_of(a.key, a.key_src);
  p.inverse = a.inverse;
  p.batch = a.batch;
  p.seq = a.seq;
  p.height = a.height;
  p.width = a.width;
  p.axis_begin[0] = int(a.split[0] / 2);
  p.axis_begin[1] = int((a.split[0] + a.split[1]) / 2);
  // powl, not pow: glibc >= 2.29 gives pow a new symbol version, which a
  // manylinux_2_28 build must not need; the extended precision does no harm.
  for (int axis = 0, pair = 0; axis < 3; ++axis) {
    for (int64_t j = 0; j < a.split[axis] / 2; ++j, ++pair) {
      const long double f = powl(a.theta_base, -2.0L * j / a.split[axis]);
      p.freq_hi[pair] = float(f);
      p.freq_lo[pair] = float(f - p.freq_hi[pair]);
    }
  }
  const bool vectorized = rope_axes_path(a) == RopeAxesPath::kVectorized;
  return visit_dtype(a.dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    constexpr int kWord = 16 / sizeof(T);
    return vectorized ? launch<T, kWord>(p, a.head_dim, max_heads, stream)
                      : launch<T, 2>(p, a.head_dim, max_heads, stream);
  });
}

}  // namespace ltx
