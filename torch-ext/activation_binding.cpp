// Validation and dispatch for the activations (kernel_src/activation/).
// Inputs that are not contiguous are copied once; outputs must be contiguous.
#include <optional>
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
#ifdef LTX_KERNELS_DEV
  ops.def("activation_path(Tensor out, Tensor x, bool gated, Tensor? logits=None) -> int");
  ltx_check::impl_cuda_and_cpu(ops, "activation_path", &activation_path);
#endif
}
