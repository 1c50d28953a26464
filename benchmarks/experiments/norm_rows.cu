// Experiment: the smallest row kernels of the fused norm family (bf16, hidden a multiple of 8 up to
// 8192), standalone (no torch, no ltx headers), driven by norm_rows.py: one 16-byte word of each row
// stream per thread, R rows per block (threadIdx.y), no loop, no prefetch. Ops (kOp):
//   0 rmsnorm_residual: h = T(x + y) -> res_out; out = T(h * r * w)
//   1 adaln fast:       out = T(fma(x * r, 1 + scale, shift))          (scale, shift [B, 1, D])
//   2 adaln exact:      out = T(T(T(x * r) * T(1 + scale)) + shift)    (packed bf16 pairs)
//   3 seam fast:        h = T(fma(y, gate, x)) -> res_out; out = T(fma(h * r, 1 + scale, shift))
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

namespace {
__device__ __forceinline__ float lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ uint32_t pack(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t op2(uint32_t a, uint32_t b, bool mul) {
  const __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162*>(&a), y = *reinterpret_cast<__nv_bfloat162*>(&b);
  __nv_bfloat162 r = mul ? __hmul2(x, y) : __hadd2(x, y);
  return *reinterpret_cast<uint32_t*>(&r);
}
__device__ __forceinline__ void words(const uint4& v, uint32_t (&u)[4]) { u[0] = v.x; u[1] = v.y; u[2] = v.z; u[3] = v.w; }

struct Args {
  const uint4 *x, *y, *w, *gate, *scale, *shift;
  uint4 *out, *res;
  int rows, seq, words;
  float eps;
};

template <int kOp, int R>
__global__ void __launch_bounds__(1024) norm_rows(Args a) {
  __shared__ float sums[R][32];
  const int t = threadIdx.x, ry = threadIdx.y;
  const int row = blockIdx.x * R + ry;
  const bool act = t < a.words && row < a.rows;
  const int64_t off = int64_t(row) * a.words + t;
  const int64_t moff = int64_t(row / a.seq) * a.words + t;  // [B, 1, D] modulation
  uint4 xv = make_uint4(0, 0, 0, 0), yv = xv, gv = xv;
  if (act) {
    xv = a.x[off];
    if (kOp == 0 || kOp == 3) yv = a.y[off];
    if (kOp == 3) gv = a.gate[moff];
  }
  uint32_t h[4];
  if (kOp == 0) {
    uint32_t xu[4], yu[4];
    words(xv, xu); words(yv, yu);
    for (int p = 0; p < 4; ++p) h[p] = op2(xu[p], yu[p], false);
  } else if (kOp == 3) {
    uint32_t xu[4], yu[4], gu[4];
    words(xv, xu); words(yv, yu); words(gv, gu);
    for (int p = 0; p < 4; ++p) h[p] = pack(fmaf(lo(yu[p]), lo(gu[p]), lo(xu[p])), fmaf(hi(yu[p]), hi(gu[p]), hi(xu[p])));
  } else {
    words(xv, h);
  }
  if ((kOp == 0 || kOp == 3) && act) a.res[off] = make_uint4(h[0], h[1], h[2], h[3]);
  float ss = 0.f;
#pragma unroll
  for (int p = 0; p < 4; ++p) ss += lo(h[p]) * lo(h[p]) + hi(h[p]) * hi(h[p]);
#pragma unroll
  for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (t % 32 == 0) sums[ry][t / 32] = ss;
  __syncthreads();
  ss = 0.f;
  for (int i = 0; i < int(blockDim.x) / 32; ++i) ss += sums[ry][i];
  const float r = rsqrtf(ss / float(a.words * 8) + a.eps);
  if (!act) return;
  uint32_t o[4];
  if (kOp == 0) {
    uint32_t wu[4];
    words(a.w[t], wu);
    for (int p = 0; p < 4; ++p) o[p] = pack(lo(h[p]) * r * lo(wu[p]), hi(h[p]) * r * hi(wu[p]));
  } else {
    uint32_t su[4], shu[4];
    words(a.scale[moff], su);
    words(a.shift[moff], shu);
    for (int p = 0; p < 4; ++p) {
      if (kOp == 2) {
        const uint32_t n = pack(lo(h[p]) * r, hi(h[p]) * r);
        o[p] = op2(op2(n, op2(0x3f803f80u, su[p], false), true), shu[p], false);
      } else {
        o[p] = pack(fmaf(lo(h[p]) * r, 1.f + lo(su[p]), lo(shu[p])), fmaf(hi(h[p]) * r, 1.f + hi(su[p]), hi(shu[p])));
      }
    }
  }
  a.out[off] = make_uint4(o[0], o[1], o[2], o[3]);
}

template <int kOp, int R> int launch(const Args& a, cudaStream_t st) {
  const int threads = (a.words + 31) / 32 * 32;
  if (threads * R > 1024) return 3;
  norm_rows<kOp, R><<<(a.rows + R - 1) / R, dim3(threads, R), 0, st>>>(a);
  return int(cudaGetLastError());
}
}  // namespace

// op as above; rows_per_block 1, 2 or 4.
extern "C" int norm_rows_launch(int op, int rows_per_block, const void* x, const void* y, const void* w, const void* gate,
                                const void* scale, const void* shift, void* out, void* res, int rows, int seq, int hidden,
                                float eps, void* stream) {
  const Args a{static_cast<const uint4*>(x), static_cast<const uint4*>(y), static_cast<const uint4*>(w),
               static_cast<const uint4*>(gate), static_cast<const uint4*>(scale), static_cast<const uint4*>(shift),
               static_cast<uint4*>(out), static_cast<uint4*>(res), rows, seq, hidden / 8, eps};
  cudaStream_t st = static_cast<cudaStream_t>(stream);
#define BY_R(OP)                                         \
  switch (rows_per_block) {                              \
    case 1: return launch<OP, 1>(a, st);                 \
    case 2: return launch<OP, 2>(a, st);                 \
    case 4: return launch<OP, 4>(a, st);                 \
  }                                                      \
  return 2
  switch (op) {
    case 0: BY_R(0);
    case 1: BY_R(1);
    case 2: BY_R(2);
    case 3: BY_R(3);
  }
#undef BY_R
  return 1;
}
