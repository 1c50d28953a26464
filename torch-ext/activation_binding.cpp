// Validation and dispatch for the activations (kernel_src/activation/).
// Inputs that are not contiguous are copied once; outputs must be contiguous.
#include <optional>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

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

struct HeadGateCall {
  ltx::HeadGateArgs args;
  at::Tensor x, logits;  // the inputs, or contiguous copies of them
};

// x [..., H * D] and logits [..., H] of one dtype and the same leading dims. The dtype and shape checks
// come before the device check, so that they fire on CPU tensors too.
HeadGateCall check_head_gate(const char* op, const at::Tensor& out, const at::Tensor& x, const at::Tensor& logits,
                             double scale, bool exact) {
  const ltx::DType dt = ltx_check::dtype_of(op, "x", x.scalar_type());
  LTX_CHECK_TYPE(logits.scalar_type() == x.scalar_type(), prefix(op), "`logits` has dtype ", logits.scalar_type(),
                 " but `x` has dtype ", x.scalar_type(), "; they must match");
  LTX_CHECK(x.dim() >= 1, prefix(op), "`x` must have at least one dimension, got a 0-d tensor");
  LTX_CHECK(logits.dim() == x.dim() && logits.sizes().slice(0, x.dim() - 1) == x.sizes().slice(0, x.dim() - 1),
            prefix(op), "`logits` has shape ", logits.sizes(), " but must be `x`'s leading dims and the heads, ",
            "[..., H], with `x` of shape ", x.sizes());
  const int64_t heads = logits.size(-1);
  LTX_CHECK(heads >= 1 && x.size(-1) % heads == 0, prefix(op), "the last dim of `x` (", x.size(-1),
            ") must be a multiple of the number of heads, the last dim of `logits` (", heads, ")");
  ltx_check::check_same_cuda_device(op, "out", out, "x", x);
  ltx_check::check_same_cuda_device(op, "logits", logits, "x", x);
  LTX_CHECK_TYPE(out.scalar_type() == x.scalar_type(), prefix(op), "`out` has dtype ", out.scalar_type(),
                 " but `x` has dtype ", x.scalar_type());
  LTX_CHECK(out.sizes() == x.sizes(), prefix(op), "`out` has shape ", out.sizes(), " but must be ", x.sizes());
  LTX_CHECK(out.is_contiguous(), prefix(op), "`out` must be contiguous (strides ", out.strides(), ")");
  HeadGateCall call;
  call.x = x.is_contiguous() ? x : x.contiguous();
  call.logits = logits.is_contiguous() ? logits : logits.contiguous();
  ltx::HeadGateArgs& a = call.args;
  a.out = out.data_ptr();
  a.x = call.x.data_ptr();
  a.logits = call.logits.data_ptr();
  a.heads = heads;
  a.head_dim = x.size(-1) / heads;
  a.rows = logits.numel() / heads;
  a.scale = static_cast<float>(scale);
  a.dtype = dt;
  a.exact = exact;
  return call;
}

// exact: T(x * T(scale * T(sigmoid(logits)))), the eager chain; else T(x * scale * sigmoid(logits)) in float32.
void head_gate(at::Tensor& out, const at::Tensor& x, const at::Tensor& logits, double scale, bool exact) {
  const HeadGateCall call = check_head_gate("head_gate", out, x, logits, scale, exact);
  if (out.numel() == 0) return;
  ltx_check::launch("head_gate", x.device(), [&](cudaStream_t stream) { return ltx::head_gate(call.args, stream); });
}

// --- the functional pair autograd uses (issue 36; ltx_kernels/activation.py registers the backward) ---

// The output shape of a plain or gated activation of `x`, after the checks that come before allocation.
std::vector<int64_t> output_shape(const char* op, const char* in_name, const at::Tensor& x, bool gated) {
  ltx_check::dtype_of(op, in_name, x.scalar_type());
  LTX_CHECK(x.dim() >= 1, prefix(op), "`", in_name, "` must have at least one dimension, got a 0-d tensor");
  std::vector<int64_t> shape = x.sizes().vec();
  if (gated) {
    LTX_CHECK(shape.back() % 2 == 0, prefix(op), "the last dim of `", in_name, "` must be even ([..., 2H]), got ",
              shape.back());
    shape.back() /= 2;
  }
  return shape;
}

at::Tensor gelu_tanh_fwd(const at::Tensor& x, bool fast) {
  at::Tensor out = at::empty(output_shape("gelu_tanh", "x", x, false), x.options());
  gelu_tanh(out, x, fast);
  return out;
}

at::Tensor geglu_fwd(const at::Tensor& input, bool approximate, bool gelu_first, bool fast) {
  at::Tensor out = at::empty(output_shape("geglu", "input", input, true), input.options());
  geglu(out, input, approximate, gelu_first, fast);
  return out;
}

at::Tensor swiglu_fwd(const at::Tensor& input, bool silu_first, bool fast) {
  at::Tensor out = at::empty(output_shape("swiglu", "input", input, true), input.options());
  swiglu(out, input, silu_first, fast);
  return out;
}

at::Tensor head_gate_fwd(const at::Tensor& x, const at::Tensor& logits, double scale, bool exact) {
  at::Tensor out = at::empty(x.sizes(), x.options());
  head_gate(out, x, logits, scale, exact);
  return out;
}

// grad_out: the output's dtype and shape, on the input's CUDA device. Returns it contiguous.
at::Tensor checked_grad_out(const char* op, const at::Tensor& grad_out, const char* in_name, const at::Tensor& input,
                            at::IntArrayRef out_shape) {
  LTX_CHECK_TYPE(grad_out.scalar_type() == input.scalar_type(), prefix(op), "`grad_out` has dtype ",
                 grad_out.scalar_type(), " but `", in_name, "` has dtype ", input.scalar_type(), "; they must match");
  LTX_CHECK(grad_out.sizes() == out_shape, prefix(op), "`grad_out` has shape ", grad_out.sizes(), " but must be ",
            out_shape, " (the forward's output)");
  ltx_check::check_same_cuda_device(op, "grad_out", grad_out, in_name, input);
  return grad_out.contiguous();
}

// Backward of a plain or gated activation (formulas in kernel_src/activation/activation.h): the grad of
// the input, contiguous, the input's shape and dtype.
at::Tensor activation_backward(const char* op, const at::Tensor& grad_out, const char* in_name, const at::Tensor& input,
                               Activation activation, bool gated, bool act_first) {
  const std::vector<int64_t> shape = output_shape(op, in_name, input, gated);
  const at::Tensor dy = checked_grad_out(op, grad_out, in_name, input, shape);
  const at::Tensor x = input.contiguous();
  at::Tensor grad_input = at::empty(input.sizes(), input.options());
  ltx::ActivationBwdArgs a;
  a.grad_input = grad_input.data_ptr();
  a.grad_out = dy.data_ptr();
  a.input = x.data_ptr();
  a.width = shape.back();
  a.rows = a.width == 0 ? 0 : dy.numel() / a.width;
  a.dtype = ltx_check::dtype_of(op, in_name, input.scalar_type());
  a.activation = activation;
  a.gated = gated;
  a.act_first = act_first;
  if (a.rows == 0) return grad_input;
  ltx_check::launch(op, input.device(), [&](cudaStream_t stream) { return ltx::activation_bwd(a, stream); });
  return grad_input;
}

at::Tensor gelu_tanh_bwd(const at::Tensor& grad_out, const at::Tensor& x) {
  return activation_backward("gelu_tanh_bwd", grad_out, "x", x, Activation::kGeluTanh, false, true);
}

at::Tensor geglu_bwd(const at::Tensor& grad_out, const at::Tensor& input, bool approximate, bool gelu_first,
                     bool fast) {
  LTX_CHECK(approximate || !fast, prefix("geglu_bwd"),
            "fast=True is only available for the tanh GELU (approximate=True)");
  const Activation act = !approximate ? Activation::kGeluErf : fast ? Activation::kGeluTanhFast : Activation::kGeluTanh;
  return activation_backward("geglu_bwd", grad_out, "input", input, act, true, gelu_first);
}

at::Tensor swiglu_bwd(const at::Tensor& grad_out, const at::Tensor& input, bool silu_first, bool fast) {
  return activation_backward("swiglu_bwd", grad_out, "input", input,
                             fast ? Activation::kSiluFast : Activation::kSilu, true, silu_first);
}

// Backward of head_gate: grad_x always, grad_logits (the logits' shape and dtype) when logits_requires_grad.
std::tuple<at::Tensor, std::optional<at::Tensor>> head_gate_bwd(const at::Tensor& grad_out, const at::Tensor& x,
                                                                const at::Tensor& logits, double scale, bool exact,
                                                                bool logits_requires_grad) {
  const char* op = "head_gate_bwd";
  at::Tensor grad_x = at::empty(x.sizes(), x.options());
  HeadGateCall call = check_head_gate(op, grad_x, x, logits, scale, exact);
  const at::Tensor dy = checked_grad_out(op, grad_out, "x", x, x.sizes());
  std::optional<at::Tensor> grad_logits;
  if (logits_requires_grad) grad_logits = at::empty(logits.sizes(), logits.options());
  ltx::HeadGateBwdArgs a;
  a.grad_x = grad_x.data_ptr();
  a.grad_logits = grad_logits.has_value() ? grad_logits->data_ptr() : nullptr;
  a.grad_out = dy.data_ptr();
  a.x = call.args.x;
  a.logits = call.args.logits;
  a.rows = call.args.rows;
  a.heads = call.args.heads;
  a.head_dim = call.args.head_dim;
  a.scale = call.args.scale;
  a.dtype = call.args.dtype;
  a.exact = exact;
  if (a.rows == 0) return {grad_x, grad_logits};
  ltx_check::launch(op, x.device(), [&](cudaStream_t stream) { return ltx::head_gate_bwd(a, stream); });
  return {grad_x, grad_logits};
}

#ifdef LTX_KERNELS_DEV
// Which kernel a call with these arguments takes: 0 vectorized, 1 scalar fallback (tests). With `logits`,
// head_gate's (x [..., H * D], logits [..., H]); else the plain or gated activation's.
int64_t activation_path(const at::Tensor& out, const at::Tensor& x, bool gated,
                        const std::optional<at::Tensor>& logits) {
  if (logits.has_value()) {
    return static_cast<int64_t>(
        ltx::head_gate_path(check_head_gate("activation_path", out, x, *logits, 2.0, true).args));
  }
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
  // out = T(x * gate), gate = scale * sigmoid(logits) per head ([..., H * D] by [..., H]); see head_gate above.
  ops.def("head_gate(Tensor(a!) out, Tensor x, Tensor logits, float scale, bool exact) -> ()");
  ltx_check::impl_cuda_and_cpu(ops, "gelu_tanh", &gelu_tanh);
  ltx_check::impl_cuda_and_cpu(ops, "geglu", &geglu);
  ltx_check::impl_cuda_and_cpu(ops, "swiglu", &swiglu);
  ltx_check::impl_cuda_and_cpu(ops, "head_gate", &head_gate);
  // The functional pair autograd uses (ltx_kernels/activation.py registers the backwards with
  // torch.library.register_autograd); the backward recomputes from the forward's input alone.
  ops.def("gelu_tanh_fwd(Tensor x, bool fast) -> Tensor");
  ops.def("geglu_fwd(Tensor input, bool approximate, bool gelu_first, bool fast) -> Tensor");
  ops.def("swiglu_fwd(Tensor input, bool silu_first, bool fast) -> Tensor");
  ops.def("head_gate_fwd(Tensor x, Tensor logits, float scale, bool exact) -> Tensor");
  ops.def("gelu_tanh_bwd(Tensor grad_out, Tensor x) -> Tensor");
  ops.def("geglu_bwd(Tensor grad_out, Tensor input, bool approximate, bool gelu_first, bool fast) -> Tensor");
  ops.def("swiglu_bwd(Tensor grad_out, Tensor input, bool silu_first, bool fast) -> Tensor");
  ops.def("head_gate_bwd(Tensor grad_out, Tensor x, Tensor logits, float scale, bool exact, "
          "bool logits_requires_grad) -> (Tensor grad_x, Tensor? grad_logits)");
  ltx_check::impl_cuda_and_cpu(ops, "gelu_tanh_fwd", &gelu_tanh_fwd);
  ltx_check::impl_cuda_and_cpu(ops, "geglu_fwd", &geglu_fwd);
  ltx_check::impl_cuda_and_cpu(ops, "swiglu_fwd", &swiglu_fwd);
  ltx_check::impl_cuda_and_cpu(ops, "head_gate_fwd", &head_gate_fwd);
  ltx_check::impl_cuda_and_cpu(ops, "gelu_tanh_bwd", &gelu_tanh_bwd);
  ltx_check::impl_cuda_and_cpu(ops, "geglu_bwd", &geglu_bwd);
  ltx_check::impl_cuda_and_cpu(ops, "swiglu_bwd", &swiglu_bwd);
  ltx_check::impl_cuda_and_cpu(ops, "head_gate_bwd", &head_gate_bwd);
#ifdef LTX_KERNELS_DEV
  ops.def("activation_path(Tensor out, Tensor x, bool gated, Tensor? logits=None) -> int");
  ltx_check::impl_cuda_and_cpu(ops, "activation_path", &activation_path);
#endif
}
