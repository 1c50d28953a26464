// Validation and dispatch for the activations. Inputs that are not
// contiguous are copied once; outputs must be contiguous.
#include <vector>


#include "activation_binding.h"
#include "check.h"

#include "../kernel_src/activation.h"

namespace {

using ltx_check::prefix;

struct ActivationCall {
  ltx::ActivationArgs args;
  at::Tensor input;  // x, or a contiguous copy of it
};

ActivationCall check(const char* op, const at::Tensor& out, const at::Tensor& x, int64_t activation, bool gated) {
  LTX_CHECK(activation >= 0 && activation <= 4, prefix(op), "`activation` must be 0 (GELU-tanh), 1 (GELU), ",
            "2 (SiLU), 3 (fast GELU-tanh) or 4 (fast SiLU), got ", activation);
  const ltx::DType dt = ltx_check::dtype_of(op, "x", x.scalar_type());
  LTX_CHECK(x.dim() >= 1, prefix(op), "`x` must have at least one dimension, got a 0-d tensor");
  ltx_check::check_same_cuda_device(op, "out", out, "x", x);
  LTX_CHECK_TYPE(out.scalar_type() == x.scalar_type(), prefix(op), "`out` has dtype ", out.scalar_type(),
                 " but `x` has dtype ", x.scalar_type());
  std::vector<int64_t> shape = x.sizes().vec();
  if (gated) {
    LTX_CHECK(shape.back() % 2 == 0, prefix(op), "the last dim of `x` must be even ([..., 2H]), got ", shape.back());
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
  a.activation = static_cast<ltx::Activation>(activation);
  a.gated = gated;
  return call;
}

void run(const char* op, const ActivationCall& call, const at::Tensor& x) {
  if (call.args.rows == 0) return;
  ltx_check::launch(op, x.device(), [&](cudaStream_t stream) { return ltx::activation(call.args, stream); });
}

}  // namespace

void activation(at::Tensor& out, const at::Tensor& x, int64_t activation) {
  run("activation", check("activation", out, x, activation, false), x);
}

void gated_activation(at::Tensor& out, const at::Tensor& x, int64_t activation, bool act_first) {
  ActivationCall call = check("gated_activation", out, x, activation, true);
  call.args.act_first = act_first;
  run("gated_activation", call, x);
}

int64_t activation_path(const at::Tensor& out, const at::Tensor& x, bool gated) {
  return static_cast<int64_t>(ltx::activation_path(check("activation_path", out, x, 0, gated).args));
}

void register_activation_ops(torch::Library& ops) {
  ops.def("activation(Tensor(a!) out, Tensor x, int activation) -> ()");
  ops.def("gated_activation(Tensor(a!) out, Tensor x, int activation, bool act_first) -> ()");
  ops.def("activation_path(Tensor out, Tensor x, bool gated) -> int");
  ltx_check::impl_cuda_and_cpu(ops, "activation", &activation);
  ltx_check::impl_cuda_and_cpu(ops, "gated_activation", &gated_activation);
  ltx_check::impl_cuda_and_cpu(ops, "activation_path", &activation_path);
}
