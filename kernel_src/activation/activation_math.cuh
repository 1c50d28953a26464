// The activations' per-element math, shared by the forward (activation.cu) and
// the backward (activation_bwd.cu): PyTorch's float32 formulas, the gated
// product's rounding, and the head gate's factor.
#pragma once

#include <cmath>
#include <cuda_runtime.h>
#include <type_traits>

#include "../common/device.cuh"
#include "activation.h"

namespace ltx {
namespace activation_math {

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

// torch.sigmoid on float, half and bfloat16 tensors (aten/src/ATen/native/cuda/UnarySpecialOpsKernel.cu):
// in float32 (opmath), 1 / (1 + exp(-l)) with the accurate expf and IEEE division, rounded once to T by
// the caller. Large |l| is exact too: exp(-l) overflows to inf and the quotient is 0, or underflows and
// the quotient is 1.
__device__ __forceinline__ float sigmoid_eager(float l) { return __fdiv_rn(1.f, __fadd_rn(1.f, expf(-l))); }

// The factor each element of a head is multiplied by. Exact: eager `scale * torch.sigmoid(l)` on T tensors,
// rounding the sigmoid and then the product to T (the scalar is taken as float, as PyTorch's mul does).
template <typename T, bool kExact> __device__ __forceinline__ float head_gate_factor(float logit, float scale) {
  const float s = sigmoid_eager(logit);
  if constexpr (kExact) return round_through<T>(__fmul_rn(scale, round_through<T>(s)));
  else return __fmul_rn(scale, s);
}

// Every element of a word times g, each product rounded once to T.
template <typename T> __device__ __forceinline__ uint4 scaled_word(const uint4& v, float g) {
  if constexpr (sizeof(T) == 4) {
    float f[4];
    unpack_word<T>(v, f);
#pragma unroll
    for (int j = 0; j < 4; ++j) f[j] = __fmul_rn(f[j], g);
    return pack_word<T>(f);
  } else {
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
    uint32_t o[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = unpack_pair<T>(u[k]);
      o[k] = pack_pair<T>(__fmul_rn(f.x, g), __fmul_rn(f.y, g));
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
  }
}

// --- backward ------------------------------------------------------------------------------

// The exact form of a fast activation (the same function): the backward's derivative formula.
__host__ __device__ constexpr Activation exact_form(Activation a) {
  return a == Activation::kGeluTanhFast ? Activation::kGeluTanh : a == Activation::kSiluFast ? Activation::kSilu : a;
}

// dy * act'(x) in float32 as PyTorch's backward kernels compute it, in their operation order
// (GeluBackwardCUDAKernelImpl, silu_backward_kernel); the caller rounds once. Fast forms take
// their function's exact derivative.
template <Activation A> __device__ __forceinline__ float activate_backward(float dy, float x) {
  constexpr Activation E = exact_form(A);
  if constexpr (E == Activation::kGeluTanh) {
    constexpr float kBeta = float(M_SQRT2 * M_2_SQRTPI * 0.5);
    constexpr float kKappa = 0.044715f;
    const float x_sq = x * x;
    const float inner = kBeta * (x + kKappa * (x_sq * x));
    const float t = tanhf(inner);
    const float left_derivative = 0.5f * (1.f + t);
    const float right_derivative = (0.5f * x) * (1.f - t * t) * (kBeta * (1.f + 3.f * kKappa * x_sq));
    return dy * (left_derivative + right_derivative);
  } else if constexpr (E == Activation::kGeluErf) {
    constexpr float kBeta = float(M_2_SQRTPI * M_SQRT1_2 * 0.5);
    const float cdf = 0.5f * (1.f + erff(x * float(M_SQRT1_2)));
    const float pdf = expf(-0.5f * x * x) * kBeta;
    return dy * (cdf + x * pdf);
  } else {
    const float s = 1.f / (1.f + expf(-x));
    return dy * s * (1.f + x * (1.f - s));
  }
}

// The gated form's grads for one element, eager autograd of `T(act(a)) * b` (T(.) rounds to T):
// db = T(dy * T(act(a))), the value the forward multiplied b by; da = T(dy_a * act'(a)) with
// dy_a = T(dy * b), the mul's grad that eager rounds before the activation's backward.
template <typename T, Activation A> __device__ __forceinline__ float2 gated_backward(float dy, float a, float b) {
  const float db = __fmul_rn(dy, round_through<T>(activate<A>(a)));
  const float da = activate_backward<A>(round_through<T>(__fmul_rn(dy, b)), a);
  return make_float2(da, db);
}

}  // namespace activation_math
// f(std::integral_constant<Activation, A>{}) for A = `act`: the forward's and the backward's one
// switch from the runtime activation to the compiled kernel.
template <typename F> cudaError_t visit_activation(Activation act, F&& f) {
  switch (act) {
    case Activation::kGeluTanh: return f(std::integral_constant<Activation, Activation::kGeluTanh>{});
    case Activation::kGeluErf: return f(std::integral_constant<Activation, Activation::kGeluErf>{});
    case Activation::kSilu: return f(std::integral_constant<Activation, Activation::kSilu>{});
    case Activation::kGeluTanhFast: return f(std::integral_constant<Activation, Activation::kGeluTanhFast>{});
    case Activation::kSiluFast: return f(std::integral_constant<Activation, Activation::kSiluFast>{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace ltx
