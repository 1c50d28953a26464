// Validation and dispatch for the activations (kernel_src/activation/).
// Inputs that are not contiguous are copied once; outputs must be contiguous.
#include <vector>

#include "check.h"
#include "torch_binding.h"

#include "../kernel_src/activation/activation.h"

namespace {

using ltx::Activation;
using ltx_check::prefix;

struct ActivationCall {
  ltx::ActivationArgs args;
  at::Tensor input;  // the input, or a contiguous copy of it
};

// `in_name` is the public argument name (gelu_tanh's `x`, geglu's `input`).
ActivationCall check(const char* op, const at::Tensor& out, const char* in_name, const at::Tensor& x,
                     Activation activation, bool gated) {
  const ltx::DType dt = ltx_check::dtype_of(op, in_name, x.scalar_type());
  LTX_CHECK(x.dim() >= 1, prefix(op), "`", in_name, "` must have at least one dimension, got a 0-d tensor");
  ltx_check::check_same_cuda_device(op, "out", out, in_name, x);
  LTX_CHECK_TYPE(out.scalar_type() == x.scalar_type(), prefix(op), "`out` has dtype ", out.scalar_type(), " but `",
                 in_name, "` has dtype ", x.scalar_type());
  std::vector<int64_t> shape = x.sizes().vec();
  if (gated) {
    LTX_CHECK(shape.back() % 2 == 0, prefix(op), "the last dim of `", in_name, "` must be even ([..., 2H]), got ",
              shape.back());
    shape.back() /= 2;
  }
  LTX_CHECK(out.sizes() == at::IntArrayRef(shape), prefix(op), "`out` has shape ", out.sizes(), " but must be ",
            at::IntArrayRef(shape));
  LTX_CHECK(out.is_contiguous(), prefix(op), "`out` must be contiguous (strides ", out.strides(), ")");
  ActivationCall call;
  call.input = x.is_contiguous() ? x : x.contiguous();
  ltx::ActivationArgs& a = call.args;
  a.out = out.data_ptr();
  a.input = call.input.data_ptr();
  a.width = shape.back();
  a.rows = a.width == 0 ? 0 : out.numel() / a.width;
  a.dtype = dt;
  a.activation = activation;
  a.gated = gated;
  return call;
}

void run(const char* op, const ActivationCall& call, const at::Tensor& x) {
  if (call.args.rows == 0) return;
  ltx_check::launch(op, x.device(), [&](cudaStream_t stream) { return ltx::activation(call.args, stream); });
}

void gelu_tanh(at::Tensor& out, const at::Tensor& x, bool fast) {
  run("gelu_tanh", check("gelu_tanh", out, "x", x, fast ? Activation::kGeluTanhFast : Activation::kGeluTanh, false),
      x);
}

void gated(const char* op, at::Tensor& out, const at::Tensor& input, Activation activation, bool act_first) {
  ActivationCall call = check(op, out, "input", input, activation, true);
  call.args.act_first = act_first;
  run(op, call, input);
}

// approximate: GELU-tanh (else the erf GELU); fast: GELU-tanh through approximate exp/division.
void geglu(at::Tensor& out, const at::Tensor& input, bool approximate, bool gelu_first, bool fast) {
  LTX_CHECK(approximate || !fast, prefix("geglu"), "fast=True is only available for the tanh GELU (approximate=True)");
  const Activation act = !approximate ? Activation::kGeluErf : fast ? Activation::kGeluTanhFast : Activation::kGeluTanh;
  gated("geglu", out, input, act, gelu_first);
}

void swiglu(at::Tensor& out, const at::Tensor& input, bool silu_first, bool fast) {
  gated("swiglu", out, input, fast ? Activation::kSiluFast : Activation::kSilu, silu_first);
}

#ifdef LTX_KERNELS_DEV
// Which kernel a call with these arguments takes: 0 vectorized, 1 scalar fallback (tests).
int64_t activation_path(const at::Tensor& out, const at::Tensor& x, bool gated) {
  return static_cast<int64_t>(
      ltx::activation_path(check("activation_path", out, "x", x, Activation::kGeluTanh, gated).args));
}
#endif

}  // namespace

void register_activation(torch::Library& ops) {
  ops.def("gelu_tanh(Tensor(a!) out, Tensor x, bool fast) -> ()");
  // out = T(T(act(input[..., a])) * input[..., b]) with `a` the first half when gelu_first / silu_first.
  ops.def("geglu(Tensor(a!) out, Tensor input, bool approximate, bool gelu_first, bool fast) -> ()");
  ops.def("swiglu(Tensor(a!) out, Tensor input, bool silu_first, bool fast) -> ()");
  ltx_check::impl_cuda_and_cpu(ops, "gelu_tanh", &gelu_tanh);
  ltx_check::impl_cuda_and_cpu(ops, "geglu", &geglu);
  ltx_check::impl_cuda_and_cpu(ops, "swiglu", &swiglu);
#ifdef LTX_KERNELS_DEV
  ops.def("activation_path(Tensor out, Tensor x, bool gated) -> int");
  ltx_check::impl_cuda_and_cpu(ops, "activation_path", &activation_path);
#endif
}
