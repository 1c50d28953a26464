// Experiment: thread layouts of the per-head q/k RMSNorm + RoPE kernel (bf16, diffusers rounding,
// interleaved rotation, [S, head_dim] float32 tables, head_dim 128), standalone (no torch, no ltx
// headers), driven by qk_head_layouts.py. Each layout runs with the math (bitwise the eager chain)
// or as a plain copy of the same words (the layout's own ceiling). Variants: qk_head_launch's table.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

namespace {
constexpr unsigned kFull = 0xffffffffu;
constexpr int kHeadWords = 16;  // 128 bf16 per head = 16 words of 8

struct Args {
  const uint4 *q, *k;
  uint4 *qo, *ko;
  const uint4 *wq, *wk;  // [16] words each
  const float *cos, *sin;  // [seq, 128]
  int batch, seq, row_words;
  float eps;
};

__device__ __forceinline__ float lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ uint32_t pack(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t mul2(uint32_t a, uint32_t b) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

// 1 / rms of the head this lane's word belongs to (16 consecutive lanes hold a head).
__device__ __forceinline__ float head_rinv(const uint4& x, float eps) {
  const uint32_t u[4] = {x.x, x.y, x.z, x.w};
  float sq = 0.f;
#pragma unroll
  for (int p = 0; p < 4; ++p) sq += lo(u[p]) * lo(u[p]) + hi(u[p]) * hi(u[p]);
#pragma unroll
  for (int o = kHeadWords / 2; o > 0; o /= 2) sq += __shfl_xor_sync(kFull, sq, o);
  return rsqrtf(sq / 128.f + eps);
}

// T(T(x * r) * w), then y0 = x0 c0 - x1 s0, y1 = x1 c1 + x0 s1 (separate products, as eager).
__device__ __forceinline__ uint4 finish(const uint4& x, float r, const uint4& w, const float (&c)[8], const float (&s)[8]) {
  const uint32_t u[4] = {x.x, x.y, x.z, x.w}, wu[4] = {w.x, w.y, w.z, w.w};
  uint32_t o[4];
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const uint32_t n = mul2(pack(lo(u[p]) * r, hi(u[p]) * r), wu[p]);
    const float n0 = lo(n), n1 = hi(n);
    const int j = 2 * p;
    o[p] = pack(__fadd_rn(__fmul_rn(n0, c[j]), __fmul_rn(-n1, s[j])), __fadd_rn(__fmul_rn(n1, c[j + 1]), __fmul_rn(n0, s[j + 1])));
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// Where a thread's words are: token s, slot t of the row (words t + i * row_slots).
struct Place {
  int t, s;
  bool active;
};
// The block covers `chunk` slots of `tokens` tokens (blockIdx.y: which chunk of the row).
__device__ __forceinline__ Place place(const Args& a, int chunk, int tokens) {
  const int slot = int(threadIdx.x) / chunk;
  const int t = int(blockIdx.y) * chunk + int(threadIdx.x) - slot * chunk;
  const int s = int(blockIdx.x) * tokens + slot;
  return {t, s, slot < tokens && s < a.seq};
}

template <bool kMath, int W>
__device__ __forceinline__ void sample(const Args& a, const Place& p, int b, const uint4 (&raw)[W][2], const float (&c)[8],
                                       const float (&s)[8], const uint4 (&w)[2]) {
  const int row_slots = a.row_words / W;
  const int64_t row = (int64_t(b) * a.seq + p.s) * a.row_words;
#pragma unroll
  for (int i = 0; i < W; ++i)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      uint4 y = raw[i][u];
      if constexpr (kMath) y = finish(raw[i][u], head_rinv(raw[i][u], a.eps), w[u], c, s);
      if (p.active) (u ? a.ko : a.qo)[row + p.t + i * row_slots] = y;
    }
}

template <int W>
__device__ __forceinline__ void load(const Args& a, const Place& p, int b, uint4 (&raw)[W][2]) {
  const int row_slots = a.row_words / W;
  const int64_t row = (int64_t(b) * a.seq + p.s) * a.row_words;
#pragma unroll
  for (int i = 0; i < W; ++i)
#pragma unroll
    for (int u = 0; u < 2; ++u) raw[i][u] = p.active ? (u ? a.k : a.q)[row + p.t + i * row_slots] : make_uint4(0, 0, 0, 0);
}

__device__ __forceinline__ void tables(const Args& a, const Place& p, float (&c)[8], float (&s)[8], uint4 (&w)[2]) {
  const int lane = p.t & (kHeadWords - 1);
  if (p.active) {
    const float4* cp = reinterpret_cast<const float4*>(a.cos + int64_t(p.s) * 128 + lane * 8);
    const float4* sp = reinterpret_cast<const float4*>(a.sin + int64_t(p.s) * 128 + lane * 8);
    const float4 c0 = cp[0], c1 = cp[1], s0 = sp[0], s1 = sp[1];
    c[0] = c0.x; c[1] = c0.y; c[2] = c0.z; c[3] = c0.w; c[4] = c1.x; c[5] = c1.y; c[6] = c1.z; c[7] = c1.w;
    s[0] = s0.x; s[1] = s0.y; s[2] = s0.z; s[3] = s0.w; s[4] = s1.x; s[5] = s1.y; s[6] = s1.z; s[7] = s1.w;
  }
  w[0] = a.wq[lane];
  w[1] = a.wk[lane];
}

// kBatchLoop: the samples of a token in sequence in one block (gridDim.z = 1);
// kJoint: both samples' words loaded before either is finished (batch 2);
// otherwise blockIdx.z is the sample.
template <bool kMath, int W, bool kBatchLoop, bool kJoint, int kBlock, int kMinBlocks>
__global__ void __launch_bounds__(kBlock, kMinBlocks) head_kernel(Args a, int chunk, int tokens) {
  const Place p = place(a, chunk, tokens);
  float c[8], s[8];
  uint4 w[2];
  if constexpr (kJoint) {
    uint4 r0[W][2], r1[W][2];
    load<W>(a, p, 0, r0);
    load<W>(a, p, 1, r1);
    tables(a, p, c, s, w);
    sample<kMath, W>(a, p, 0, r0, c, s, w);
    sample<kMath, W>(a, p, 1, r1, c, s, w);
  } else if constexpr (kBatchLoop) {
    for (int b = 0; b < a.batch; ++b) {
      uint4 raw[W][2];
      load<W>(a, p, b, raw);
      if (b == 0) tables(a, p, c, s, w);
      sample<kMath, W>(a, p, b, raw, c, s, w);
    }
  } else {
    uint4 raw[W][2];
    load<W>(a, p, int(blockIdx.z), raw);
    tables(a, p, c, s, w);
    sample<kMath, W>(a, p, int(blockIdx.z), raw, c, s, w);
  }
}

// The row's slots split in chunk_div chunks; a block takes as many tokens' chunk as fit kBlock threads.
template <bool kMath, int W, bool kBatchLoop, bool kJoint, int kBlock, int kMinBlocks>
int launch(const Args& a, int chunk_div, cudaStream_t st) {
  const int row_slots = a.row_words / W;
  const int chunk = row_slots / chunk_div;
  if (chunk * chunk_div != row_slots || chunk % kHeadWords) return 2;
  const int tokens = chunk >= kBlock ? 1 : kBlock / chunk;
  const int threads = ((tokens * chunk + 31) / 32) * 32;
  if (threads > kBlock) return 3;
  if (kJoint && a.batch != 2) return 4;
  dim3 grid((a.seq + tokens - 1) / tokens, chunk_div, kBatchLoop ? 1 : a.batch);
  head_kernel<kMath, W, kBatchLoop, kJoint, kBlock, kMinBlocks><<<grid, threads, 0, st>>>(a, chunk, tokens);
  return int(cudaGetLastError());
}
}  // namespace

// variant: 2 * layout + (1 = copy only); see LAYOUTS in qk_head_layouts.py.
extern "C" int qk_head_launch(int variant, const void* q, const void* k, void* qo, void* ko, const void* wq, const void* wk,
                              const float* cos, const float* sin, int batch, int seq, int row_words, float eps, void* stream) {
  const Args a{static_cast<const uint4*>(q), static_cast<const uint4*>(k), static_cast<uint4*>(qo), static_cast<uint4*>(ko),
               static_cast<const uint4*>(wq), static_cast<const uint4*>(wk), cos, sin, batch, seq, row_words, eps};
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const bool copy = variant & 1;
#define GO(W, LOOP, JOINT, BLOCK, MINB, DIV) \
  return copy ? launch<false, W, LOOP, JOINT, BLOCK, MINB>(a, DIV, st) : launch<true, W, LOOP, JOINT, BLOCK, MINB>(a, DIV, st)
  switch (variant / 2) {
    case 0: GO(2, true, false, 256, 3, 1);   // the library's layout (v8): 2 words, a token per block, samples in sequence
    case 1: GO(2, false, false, 256, 3, 1);  // a block per (token, sample)
    case 2: GO(2, false, false, 128, 6, 2);  // a block per (half token, sample): 128 threads at 32 heads
    case 3: GO(1, false, false, 256, 4, 2);  // 1 word, a block per (half token, sample)
    case 4: GO(2, true, true, 256, 2, 1);    // both samples loaded together
    case 5: GO(1, true, false, 256, 4, 2);   // 1 word, half a token per block, samples in sequence (v7)
    case 6: GO(2, false, false, 256, 4, 1);  // as 1, capped at 64 registers
    case 7: GO(1, false, false, 128, 8, 4);  // 1 word, a block per (quarter token, sample): 128 threads
    case 8: GO(2, true, false, 256, 4, 1);   // the library's layout capped at 64 registers
    case 9: GO(1, false, false, 256, 5, 2);  // as 3, capped at 51 registers
  }
#undef GO
  return 1;
}
