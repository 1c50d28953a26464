// Validation and dispatch for the layernorm family (kernel_src/layernorm/). Every op builds one
// ltx::LayerNormArgs through LayerNormCall, which checks each tensor against the row shape of `x`
// (ltx_check::RowOperands) and names the argument in every error.
#include "check.h"
#include "row_operands.h"
#include "torch_binding.h"

#include "../kernel_src/layernorm/layernorm.h"

namespace {

using ltx_check::prefix;

class LayerNormCall {
 public:
  LayerNormCall(const char* op, at::Tensor& out, const at::Tensor& x, const std::optional<at::Tensor>& weight,
                const std::optional<at::Tensor>& bias, double eps, bool exact)
      : ops_(op, x, eps) {
    args_.dtype = ops_.dtype();
    args_.mod_dtype = args_.dtype;
    args_.batch = ops_.batch();
    args_.seq = ops_.seq();
    args_.hidden = ops_.hidden();
    args_.eps = static_cast<float>(eps);
    args_.exact = exact;
    args_.x = ops_.row_in("x", x);
    args_.out = ops_.row_out("out", out);
    if (weight) args_.weight = affine("weight", *weight, args_.weight_f32);
    if (bias) args_.bias = affine("bias", *bias, args_.bias_f32);
  }

  // scale (required here) and shift: out = n * (1 + scale) [+ shift].
  void modulate(const at::Tensor& scale, const std::optional<at::Tensor>& shift) {
    args_.scale = modulation("scale", scale);
    if (shift) args_.shift = modulation("shift", *shift);
  }

  // The residual h = x + y [* gate], written to `x_out` (which must not be `out`).
  void add_summand(at::Tensor& x_out, const at::Tensor& y, const std::optional<at::Tensor>& gate) {
    args_.residual_out = ops_.row_out("x_out", x_out);
    LTX_CHECK(x_out.numel() == 0 || args_.out.ptr != args_.residual_out.ptr, prefix(ops_.op()),
              "`out` and `x_out` must be different tensors");
    args_.y = ops_.row_in("y", y);
    if (gate) args_.gate = modulation("gate", *gate);
  }

  void run() {
    ops_.run([&](cudaStream_t stream) { return ltx::layernorm(args_, stream); });
  }

  ltx::LayerNormArgs& args() { return args_; }

 private:
  // A norm's weight or bias: [D], of x's dtype or float32 (each on its own: Wan keeps its norms'
  // parameters in float32 beside bf16 activations).
  ltx::RowIn affine(const char* arg, const at::Tensor& t, bool& f32) {
    const ltx::RowIn r = ops_.vector(arg, t);
    LTX_CHECK_TYPE(t.scalar_type() == ops_.x().scalar_type() || t.scalar_type() == at::kFloat, prefix(ops_.op()),
                   "`", arg, "` has dtype ", t.scalar_type(), " but `x` has dtype ", ops_.x().scalar_type(), "; `",
                   arg, "` must have the dtype of `x` or torch.float32");
    f32 = t.scalar_type() == at::kFloat;
    return r;
  }

  ltx::RowIn modulation(const char* arg, const at::Tensor& t) {
    const ltx::RowIn r = ops_.modulation(arg, t);
    args_.mod_dtype = ops_.mod_dtype();
    return r;
  }

  ltx_check::RowOperands ops_;
  ltx::LayerNormArgs args_;
};

void layernorm(at::Tensor& out, const at::Tensor& x, const std::optional<at::Tensor>& weight,
               const std::optional<at::Tensor>& bias, double eps) {
  LayerNormCall call("layernorm", out, x, weight, bias, eps, /*exact=*/true);
  call.run();
}

void adaln_layernorm(at::Tensor& out, const at::Tensor& x, const at::Tensor& scale,
                     const std::optional<at::Tensor>& shift, const std::optional<at::Tensor>& weight,
                     const std::optional<at::Tensor>& bias, double eps, bool exact_mode) {
  LayerNormCall call("adaln_layernorm", out, x, weight, bias, eps, exact_mode);
  call.modulate(scale, shift);
  call.run();
}

void gated_residual_layernorm(at::Tensor& out, at::Tensor& x_out, const at::Tensor& x, const at::Tensor& y,
                              const std::optional<at::Tensor>& gate, const std::optional<at::Tensor>& scale,
                              const std::optional<at::Tensor>& shift, const std::optional<at::Tensor>& weight,
                              const std::optional<at::Tensor>& bias, double eps, bool exact_mode) {
  LTX_CHECK(scale || !shift, prefix("gated_residual_layernorm"),
            "`shift` was given without `scale`; pass scale=torch.zeros_like(shift) for a shift alone");
  LayerNormCall call("gated_residual_layernorm", out, x, weight, bias, eps, exact_mode);
  call.add_summand(x_out, y, gate);
  if (scale) call.modulate(*scale, shift);
  call.run();
}

#ifdef LTX_KERNELS_DEV
// Which kernel a call with these arguments takes: 0 vectorized, 1 scalar fallback (tests).
int64_t layernorm_path(const at::Tensor& out, const at::Tensor& x, const std::optional<at::Tensor>& y,
                       const std::optional<at::Tensor>& modulation, const std::optional<at::Tensor>& weight) {
  at::Tensor o = out;
  LayerNormCall call("layernorm_path", o, x, weight, std::nullopt, 0.0, true);
  auto& a = call.args();
  at::Tensor x_out = x;  // a stand-in with x's layout: the path reads only its alignment
  if (y) call.add_summand(x_out, *y, std::nullopt);
  if (modulation) call.modulate(*modulation, std::nullopt);
  return static_cast<int64_t>(ltx::layernorm_path(a));
}
#endif

}  // namespace

void register_layernorm(torch::Library& ops) {
  ops.def("layernorm(Tensor(a!) out, Tensor x, Tensor? weight, Tensor? bias, float eps) -> ()");
  ops.def("adaln_layernorm(Tensor(a!) out, Tensor x, Tensor scale, Tensor? shift, Tensor? weight, Tensor? bias, "
          "float eps, bool exact_mode) -> ()");
  ops.def("gated_residual_layernorm(Tensor(a!) out, Tensor(b!) x_out, Tensor x, Tensor y, Tensor? gate, "
          "Tensor? scale, Tensor? shift, Tensor? weight, Tensor? bias, float eps, bool exact_mode) -> ()");
  ltx_check::impl_cuda_and_cpu(ops, "layernorm", &layernorm);
  ltx_check::impl_cuda_and_cpu(ops, "adaln_layernorm", &adaln_layernorm);
  ltx_check::impl_cuda_and_cpu(ops, "gated_residual_layernorm", &gated_residual_layernorm);
#ifdef LTX_KERNELS_DEV
  ops.def("layernorm_path(Tensor out, Tensor x, Tensor? y, Tensor? modulation, Tensor? weight) -> int");
  ltx_check::impl_cuda_and_cpu(ops, "layernorm_path", &layernorm_path);
#endif
}
