// Argument checks for the bindings.
//
// Messages are built with std::string alone, never through std::ostream
// (c10::str with several arguments uses std::ostringstream). Why: torch wheels
// export parts of their own statically linked libstdc++, so in this library
// the stream constructor can bind to torch's copy and the number formatting to
// the system's; the two copies number their locale facets independently and
// printing an integer then crashed the process on the GPU machine (torch
// 2.11, g++ 13.3). With one std::string argument
// c10::str returns it as is and no stream is created.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "../kernel_src/common/dtype.h"

namespace ltx_check {

inline void append(std::string& s, const char* v) { s += v; }
inline void append(std::string& s, const std::string& v) { s += v; }
inline void append(std::string& s, char v) { s += v; }
inline void append(std::string& s, double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  s += buf;
}
template <typename I, std::enable_if_t<std::is_integral_v<I>, int> = 0> void append(std::string& s, I v) {
  s += std::to_string(v);
}
inline void append(std::string& s, at::IntArrayRef v) {
  s += '[';
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  s += ']';
}
inline void append(std::string& s, at::ScalarType v) { s += c10::toString(v); }
inline void append(std::string& s, const c10::Device& v) { s += v.str(); }

template <typename... A> std::string cat(const A&... a) {
  std::string s;
  (append(s, a), ...);
  return s;
}

// "ltx_kernels.<op>: "
inline std::string prefix(const char* op) { return cat("ltx_kernels.", op, ": "); }

}  // namespace ltx_check

// TORCH_CHECK / TORCH_CHECK_TYPE with the message pieces joined by ltx_check::cat.
#define LTX_CHECK(cond, ...) TORCH_CHECK(cond, ::ltx_check::cat(__VA_ARGS__))
#define LTX_CHECK_TYPE(cond, ...) TORCH_CHECK_TYPE(cond, ::ltx_check::cat(__VA_ARGS__))
#define LTX_CHECK_INDEX(cond, ...) TORCH_CHECK_INDEX(cond, ::ltx_check::cat(__VA_ARGS__))

namespace ltx_check {

// The kernels' dtype of `arg`; a TypeError naming it for anything but
// bfloat16, float16 and float32.
inline ltx::DType dtype_of(const char* op, const char* arg, at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ltx::DType::kFloat32;
    case at::kHalf: return ltx::DType::kFloat16;
    case at::kBFloat16: return ltx::DType::kBFloat16;
    default:
      LTX_CHECK_TYPE(false, prefix(op), "`", arg, "` has dtype ", t,
                     "; supported dtypes are torch.bfloat16, torch.float16 and torch.float32");
  }
}

// `t` is on `ref`'s CUDA device (ref names the argument that sets the device).
inline void check_same_cuda_device(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                                   const at::Tensor& ref) {
  LTX_CHECK(ref.is_cuda(), prefix(op), "`", ref_arg, "` must be a CUDA tensor, got a tensor on ", ref.device());
  LTX_CHECK(t.device() == ref.device(), prefix(op), "`", arg, "` is on ", t.device(), " but `", ref_arg, "` is on ",
            ref.device());
}

// Run `enqueue(stream)` (a kernel_src launcher returning cudaError_t) on
// `device` and its current stream; a launch error names the op.
template <typename F> void launch(const char* op, const c10::Device& device, F&& enqueue) {
  const c10::cuda::CUDAGuard guard(device);
  const cudaError_t err = enqueue(c10::cuda::getCurrentCUDAStream(device.index()).stream());
  LTX_CHECK(err == cudaSuccess, prefix(op), "kernel launch failed: ", cudaGetErrorString(err));
}

// Register `fn` for the CUDA and the CPU keys: a CPU tensor then gets the
// validation error that names the argument, not a missing-kernel error.
template <typename F> void impl_cuda_and_cpu(torch::Library& ops, const char* name, F* fn) {
  for (auto key : {c10::DispatchKey::CUDA, c10::DispatchKey::CPU}) ops.impl(name, key, fn);
}

}  // namespace ltx_check
