// Validation and dispatch for the fused norm family (kernel_src/fused_norm/). Every op builds one
// ltx::FusedNormArgs through FusedCall, which checks each tensor against the
// row shape of `x` (ltx_check::RowOperands) and names the argument in every error.
#include "check.h"
#include "row_operands.h"
#include "torch_binding.h"

#include "../kernel_src/fused_norm/fused_norm.h"

namespace {

using ltx_check::prefix;

class FusedCall {
 public:
  // `x` (named `x_name` in errors) sets the row shape ([R, D] or [B, S, D]),
  // the dtype and the device.
  FusedCall(const char* op, const at::Tensor& x, double eps, bool exact, const char* x_name = "x")
      : ops_(op, x, eps, x_name) {
    args_.dtype = ops_.dtype();
    args_.batch = ops_.batch();
    args_.seq = ops_.seq();
    args_.hidden = ops_.hidden();
    args_.eps = static_cast<float>(eps);
    args_.exact = exact;
    args_.mod_dtype = args_.dtype;
    args_.x = row_in(x_name, x);
  }

  ltx::RowIn row_in(const char* arg, const at::Tensor& t) { return ops_.row_in(arg, t); }
  ltx::RowOut row_out(const char* arg, at::Tensor& t) { return ops_.row_out(arg, t); }

  // A modulation tensor (all of a call's share one dtype, x's or float32).
  ltx::RowIn modulation(const char* arg, const at::Tensor& t) {
    const ltx::RowIn r = ops_.modulation(arg, t);
    args_.mod_dtype = ops_.mod_dtype();
    return r;
  }

  // The RMSNorm weight: [D], x's dtype.
  ltx::RowIn weight(const at::Tensor& w) {
    const ltx::RowIn r = ops_.vector("weight", w);
    LTX_CHECK_TYPE(w.scalar_type() == ops_.x().scalar_type(), prefix(ops_.op()), "`weight` has dtype ",
                   w.scalar_type(), " but `", ops_.x_name(), "` has dtype ", ops_.x().scalar_type(),
                   "; the fused ops take a weight of that dtype");
    return r;
  }

  // A summand stream: h = x + y [* gate], written to `sum_out` (which must
  // not be `out`).
  void add_summand(const char* sum_name, at::Tensor& sum_out, const char* y_name, const at::Tensor& y,
                   const std::optional<at::Tensor>& gate) {
    args_.residual_out = row_out(sum_name, sum_out);
    LTX_CHECK(sum_out.numel() == 0 || args_.out.ptr != args_.residual_out.ptr, prefix(ops_.op()), "`out` and `",
              sum_name, "` must be different tensors");
    args_.y = row_in(y_name, y);
    args_.second = ltx::SecondStream::kSummand;
    if (gate) args_.gate = modulation("gate", *gate);
  }

  // out = n * (1 + scale) [+ shift].
  void scale_shift(const at::Tensor& scale, const std::optional<at::Tensor>& shift) {
    args_.scale = modulation("scale", scale);
    if (shift) args_.shift = modulation("shift", *shift);
    args_.modulation = ltx::Modulation::kScaleShift;
  }

  ltx::FusedNormArgs& args() { return args_; }

  void run() {
    ops_.run([&](cudaStream_t stream) { return ltx::fused_norm(args_, stream); });
  }

 private:
  ltx_check::RowOperands ops_;
  ltx::FusedNormArgs args_;
};

void adaln_rmsnorm(at::Tensor& out, const at::Tensor& input, const std::optional<at::Tensor>& weight,
                   const at::Tensor& scale, const std::optional<at::Tensor>& shift, double eps, bool exact_mode) {
  FusedCall call("adaln_rmsnorm", input, eps, exact_mode, "input");
  auto& a = call.args();
  a.out = call.row_out("out", out);
  if (weight) a.weight = call.weight(*weight);
  call.scale_shift(scale, shift);
  call.run();
}

// diffusers_rounding: the weight multiply rounds like diffusers RMSNorm (the
// kernels' exact mode), else like torch.nn.RMSNorm (one rounding).
void rmsnorm_residual(at::Tensor& out, at::Tensor& residual_out, const at::Tensor& input, const at::Tensor& residual,
                      const std::optional<at::Tensor>& weight, double eps, bool diffusers_rounding) {
  FusedCall call("rmsnorm_residual", input, eps, diffusers_rounding, "input");
  auto& a = call.args();
  a.out = call.row_out("out", out);
  call.add_summand("residual_out", residual_out, "residual", residual, std::nullopt);
  if (weight) a.weight = call.weight(*weight);
  call.run();
}

void gated_residual_rmsnorm(at::Tensor& out, at::Tensor& x_out, const at::Tensor& x, const at::Tensor& y,
                            const std::optional<at::Tensor>& gate, const std::optional<at::Tensor>& weight,
                            const at::Tensor& scale, const std::optional<at::Tensor>& shift, double eps,
                            bool exact_mode) {
  FusedCall call("gated_residual_rmsnorm", x, eps, exact_mode);
  auto& a = call.args();
  a.out = call.row_out("out", out);
  call.add_summand("x_out", x_out, "y", y, gate);
  if (weight) a.weight = call.weight(*weight);
  call.scale_shift(scale, shift);
  call.run();
}

void gated_residual(at::Tensor& out, const at::Tensor& x, const at::Tensor& y, const std::optional<at::Tensor>& gate,
                    bool exact_mode) {
  FusedCall call("gated_residual", x, 0.0, exact_mode);
  call.add_summand("out", out, "y", y, gate);  // no normalisation: the kernel's `out` stays null
  call.run();
}

void residual_tanh_gated_rmsnorm(at::Tensor& out, const at::Tensor& x, const at::Tensor& x_res,
                                 const at::Tensor& gate, double eps, bool exact_mode) {
  // The kernel normalises its `x` stream: here that is x_res; x is the base.
  FusedCall call("residual_tanh_gated_rmsnorm", x_res, eps, exact_mode, "x_res");
  auto& a = call.args();
  a.out = call.row_out("out", out);
  a.y = call.row_in("x", x);
  a.second = ltx::SecondStream::kBase;
  a.gate = call.modulation("gate", gate);
  a.modulation = ltx::Modulation::kTanhGatedBase;
  call.run();
}

// scale_offset: 1 for modulated_rmsnorm's (1 + scale), 0 where `scale` is the
// whole multiplier (MochiModulatedRMSNorm, ltx_kernels.layers).
void modulated_rmsnorm(at::Tensor& out, const at::Tensor& x, const at::Tensor& scale, double eps,
                       double scale_offset) {
  FusedCall call("modulated_rmsnorm", x, eps, /*exact=*/true);
  auto& a = call.args();
  a.out = call.row_out("out", out);
  a.scale = call.modulation("scale", scale);
  a.modulation = ltx::Modulation::kScaleFloat;
  a.scale_offset = static_cast<float>(scale_offset);
  call.run();
}

#ifdef LTX_KERNELS_DEV
// Which kernel a call with these arguments takes: 0 vectorized, 1 scalar fallback (tests).
int64_t fused_norm_path(const at::Tensor& out, const at::Tensor& x, const std::optional<at::Tensor>& y,
                        const std::optional<at::Tensor>& modulation) {
  FusedCall call("fused_norm_path", x, 0.0, true);
  auto& a = call.args();
  at::Tensor o = out;
  a.out = call.row_out("out", o);
  if (y) {
    a.y = call.row_in("y", *y);
    a.second = ltx::SecondStream::kSummand;
  }
  if (modulation) a.scale = call.modulation("modulation", *modulation);
  return static_cast<int64_t>(ltx::fused_norm_path(a));
}
#endif

}  // namespace

void register_fused_norm(torch::Library& ops) {
  ops.def("adaln_rmsnorm(Tensor(a!) out, Tensor input, Tensor? weight, Tensor scale, Tensor? shift, float eps, "
          "bool exact_mode) -> ()");
  ops.def("rmsnorm_residual(Tensor(a!) out, Tensor(b!) residual_out, Tensor input, Tensor residual, Tensor? weight, "
          "float eps, bool diffusers_rounding) -> ()");
  ops.def("gated_residual_rmsnorm(Tensor(a!) out, Tensor(b!) x_out, Tensor x, Tensor y, Tensor? gate, "
          "Tensor? weight, Tensor scale, Tensor? shift, float eps, bool exact_mode) -> ()");
  ops.def("gated_residual(Tensor(a!) out, Tensor x, Tensor y, Tensor? gate, bool exact_mode) -> ()");
  ops.def("residual_tanh_gated_rmsnorm(Tensor(a!) out, Tensor x, Tensor x_res, Tensor gate, float eps, "
          "bool exact_mode) -> ()");
  ops.def("modulated_rmsnorm(Tensor(a!) out, Tensor x, Tensor scale, float eps, float scale_offset) -> ()");
  ltx_check::impl_cuda_and_cpu(ops, "adaln_rmsnorm", &adaln_rmsnorm);
  ltx_check::impl_cuda_and_cpu(ops, "rmsnorm_residual", &rmsnorm_residual);
  ltx_check::impl_cuda_and_cpu(ops, "gated_residual_rmsnorm", &gated_residual_rmsnorm);
  ltx_check::impl_cuda_and_cpu(ops, "gated_residual", &gated_residual);
  ltx_check::impl_cuda_and_cpu(ops, "residual_tanh_gated_rmsnorm", &residual_tanh_gated_rmsnorm);
  ltx_check::impl_cuda_and_cpu(ops, "modulated_rmsnorm", &modulated_rmsnorm);
#ifdef LTX_KERNELS_DEV
  ops.def("fused_norm_path(Tensor out, Tensor x, Tensor? y, Tensor? modulation) -> int");
  ltx_check::impl_cuda_and_cpu(ops, "fused_norm_path", &fused_norm_path);
#endif
}
