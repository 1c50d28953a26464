// Validation and dispatch for the fused norm family (kernel_src/fused_norm/). Every op builds one
// ltx::FusedNormArgs through FusedCall, which checks each tensor against the
// row shape of `x` and names the argument in every error.
#include <deque>

#include "check.h"
#include "torch_binding.h"

#include "../kernel_src/fused_norm/fused_norm.h"

namespace {

using ltx_check::prefix;

class FusedCall {
 public:
  // `x` (named `x_name` in errors) sets the row shape ([R, D] or [B, S, D]),
  // the dtype and the device.
  FusedCall(const char* op, const at::Tensor& x, double eps, bool exact, const char* x_name = "x")
      : op_(op), x_name_(x_name), x_(x) {
    LTX_CHECK(x.dim() == 2 || x.dim() == 3, prefix(op), "`", x_name, "` must be [rows, hidden] or [batch, seq, ",
              "hidden], got ", x.dim(), " dims (shape ", x.sizes(), "); reshape it first");
    args_.dtype = ltx_check::dtype_of(op, x_name, x.scalar_type());
    ltx_check::check_same_cuda_device(op, x_name, x, x_name, x);
    LTX_CHECK(eps >= 0.0, prefix(op), "`eps` must be >= 0, got ", eps);
    args_.batch = x.size(0);
    args_.seq = x.dim() == 3 ? x.size(1) : 1;
    args_.hidden = x.size(-1);
    // The kernels count rows in 32 bits (fewer registers, more blocks per SM).
    LTX_CHECK(args_.batch * args_.seq < (int64_t(1) << 31), prefix(op), "`", x_name, "` has ",
              args_.batch * args_.seq, " rows; at most 2^31 - 1 are supported (split the call)");
    args_.eps = static_cast<float>(eps);
    args_.exact = exact;
    args_.mod_dtype = args_.dtype;
    args_.x = row_in(x_name, x);
  }

  // A tensor of x's shape and dtype, read.
  ltx::RowIn row_in(const char* arg, const at::Tensor& t) {
    check_row_shape(arg, t);
    const at::Tensor& r = last_dim_contiguous(t);
    return {r.data_ptr(), r.stride(0), x_.dim() == 3 ? r.stride(1) : 0};
  }

  // A tensor of x's shape and dtype, written: no copy is possible, so the last
  // dim must be contiguous and no two rows may share memory.
  ltx::RowOut row_out(const char* arg, at::Tensor& t) {
    check_row_shape(arg, t);
    LTX_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, prefix(op_), "`", arg,
              "` must have a contiguous last dim (strides ", t.strides(), ")");
    for (int64_t d = 0; d + 1 < t.dim(); ++d)
      LTX_CHECK(t.size(d) <= 1 || t.stride(d) != 0, prefix(op_), "`", arg, "` has internal overlap (dim ", d,
                " has stride 0); pass a tensor that owns its elements");
    return {t.data_ptr(), t.stride(0), x_.dim() == 3 ? t.stride(1) : 0};
  }

  // A modulation tensor: [D] (all rows), [B, D] (per batch), [B|1, 1|S, D].
  // All modulation tensors of a call share one dtype, x's or float32.
  ltx::RowIn modulation(const char* arg, const at::Tensor& t) {
    ltx_check::check_same_cuda_device(op_, arg, t, x_name_, x_);
    const ltx::DType dt = ltx_check::dtype_of(op_, arg, t.scalar_type());
    LTX_CHECK_TYPE(t.scalar_type() == x_.scalar_type() || t.scalar_type() == at::kFloat, prefix(op_), "`", arg,
                   "` has dtype ", t.scalar_type(), " but `", x_name_, "` has dtype ", x_.scalar_type(), "; `",
                   arg, "` must have the dtype of `", x_name_, "` or torch.float32");
    if (mod_arg_ == nullptr) {
      args_.mod_dtype = dt;
      mod_arg_ = arg;
    }
    LTX_CHECK_TYPE(dt == args_.mod_dtype, prefix(op_), "`", arg, "` has dtype ", t.scalar_type(), " but `", mod_arg_,
                   "` has dtype ", mod_dtype_name(), "; modulation tensors must share one dtype");
    const int64_t D = args_.hidden, B = args_.batch, S = args_.seq;
    const bool rank_ok = t.dim() >= 1 && t.dim() <= 3;
    const int64_t b = t.dim() >= 2 ? t.size(0) : 1;
    const int64_t s = t.dim() == 3 ? t.size(1) : 1;
    LTX_CHECK(rank_ok && t.size(-1) == D && (b == 1 || b == B) && (s == 1 || s == S), prefix(op_), "`", arg,
              "` has shape ", t.sizes(), ", which does not broadcast to the rows of `", x_name_, "` ", x_.sizes(),
              ": expected [", D, "], [", B, ", ", D, "] (per batch), [", B, ", 1, ", D, "] or [", B, ", ", S, ", ",
              D, "]");
    const at::Tensor& r = last_dim_contiguous(t);
    const int64_t bs = t.dim() >= 2 && b > 1 ? r.stride(0) : 0;
    const int64_t ss = t.dim() == 3 && s > 1 ? r.stride(1) : 0;
    return {r.data_ptr(), bs, ss};
  }

  // The RMSNorm weight: [D], x's dtype.
  ltx::RowIn weight(const at::Tensor& w) {
    ltx_check::check_same_cuda_device(op_, "weight", w, x_name_, x_);
    ltx_check::dtype_of(op_, "weight", w.scalar_type());
    LTX_CHECK_TYPE(w.scalar_type() == x_.scalar_type(), prefix(op_), "`weight` has dtype ", w.scalar_type(),
                   " but `", x_name_, "` has dtype ", x_.scalar_type(), "; the fused ops take a weight of that dtype");
    LTX_CHECK(w.dim() == 1 && w.size(0) == args_.hidden, prefix(op_), "`weight` has shape ", w.sizes(),
              " but must be [", args_.hidden, "] (the last dim of `", x_name_, "`)");
    return {last_dim_contiguous(w).data_ptr(), 0, 0};
  }

  // A summand stream: h = x + y [* gate], written to `sum_out` (which must
  // not be `out`).
  void add_summand(const char* sum_name, at::Tensor& sum_out, const char* y_name, const at::Tensor& y,
                   const std::optional<at::Tensor>& gate) {
    args_.residual_out = row_out(sum_name, sum_out);
    LTX_CHECK(sum_out.numel() == 0 || args_.out.ptr != args_.residual_out.ptr, prefix(op_), "`out` and `", sum_name,
              "` must be different tensors");
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
    const bool empty = args_.batch == 0 || args_.seq == 0 || args_.hidden == 0;
    if (empty) return;
    ltx_check::launch(op_, x_.device(), [&](cudaStream_t stream) { return ltx::fused_norm(args_, stream); });
  }

 private:
  void check_row_shape(const char* arg, const at::Tensor& t) {
    ltx_check::check_same_cuda_device(op_, arg, t, x_name_, x_);
    LTX_CHECK_TYPE(t.scalar_type() == x_.scalar_type(), prefix(op_), "`", arg, "` has dtype ", t.scalar_type(),
                   " but `", x_name_, "` has dtype ", x_.scalar_type());
    LTX_CHECK(t.sizes() == x_.sizes(), prefix(op_), "`", arg, "` has shape ", t.sizes(), " but `", x_name_,
              "` has shape ", x_.sizes());
  }

  // `t`, or a copy with a contiguous last dim (kept alive until the launch).
  const at::Tensor& last_dim_contiguous(const at::Tensor& t) {
    if (t.size(-1) <= 1 || t.stride(-1) == 1) return t;
    copies_.push_back(t.contiguous());
    return copies_.back();
  }

  const char* mod_dtype_name() const {
    return args_.mod_dtype == ltx::DType::kFloat32 ? "Float" : c10::toString(x_.scalar_type());
  }

  const char* op_;
  const char* x_name_;
  const at::Tensor& x_;
  ltx::FusedNormArgs args_;
  const char* mod_arg_ = nullptr;
  std::deque<at::Tensor> copies_;  // a deque: references to earlier copies stay valid
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
