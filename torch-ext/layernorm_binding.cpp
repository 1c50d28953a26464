// Validation and dispatch for the layernorm family (kernel_src/layernorm/). Every op builds one
// ltx::LayerNormArgs through LayerNormCall, which checks each tensor against the row shape of `x`
// (ltx_check::RowOperands) and names the argument in every error.
#include <array>
#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

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
    if (weight) args_.weight = ops_.affine("weight", *weight, args_.weight_f32);
    if (bias) args_.bias = ops_.affine("bias", *bias, args_.bias_f32);
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

// --- autograd: the functional forwards (output(s) and the per-row float32 mean and rstd the forward
// kernel saves) and the one backward of the three ops (kernel_src/layernorm/layernorm.h). ltx_kernels/
// layernorm.py registers the backward with torch.library.register_autograd.

// [rows] float32 statistics of x's rows (x's shape without its last dim).
at::Tensor row_stats(const at::Tensor& x) {
  at::Tensor t = at::empty(x.sizes().slice(0, x.dim() - 1), x.options().dtype(at::kFloat));
  if (x.size(-1) == 0) t.zero_();  // rows with nothing to normalise: no kernel writes them
  return t;
}

// Point the forward kernel at the statistics it saves, then run it.
void run_saving(LayerNormCall& call, at::Tensor& mean, at::Tensor& rstd) {
  if (mean.numel() > 0) {
    call.args().mean = mean.data_ptr<float>();
    call.args().rstd = rstd.data_ptr<float>();
  }
  call.run();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layernorm_fwd(const at::Tensor& x,
                                                             const std::optional<at::Tensor>& weight,
                                                             const std::optional<at::Tensor>& bias, double eps) {
  at::Tensor out = at::empty(x.sizes(), x.options());
  LayerNormCall call("layernorm", out, x, weight, bias, eps, /*exact=*/true);
  at::Tensor mean = row_stats(x), rstd = row_stats(x);
  run_saving(call, mean, rstd);
  return {out, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> adaln_layernorm_fwd(
    const at::Tensor& x, const at::Tensor& scale, const std::optional<at::Tensor>& shift,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps, bool exact_mode) {
  at::Tensor out = at::empty(x.sizes(), x.options());
  LayerNormCall call("adaln_layernorm", out, x, weight, bias, eps, exact_mode);
  call.modulate(scale, shift);
  at::Tensor mean = row_stats(x), rstd = row_stats(x);
  run_saving(call, mean, rstd);
  return {out, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gated_residual_layernorm_fwd(
    const at::Tensor& x, const at::Tensor& y, const std::optional<at::Tensor>& gate,
    const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& shift,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps, bool exact_mode) {
  LTX_CHECK(scale || !shift, prefix("gated_residual_layernorm"),
            "`shift` was given without `scale`; pass scale=torch.zeros_like(shift) for a shift alone");
  at::Tensor out = at::empty(x.sizes(), x.options()), x_out = at::empty(x.sizes(), x.options());
  LayerNormCall call("gated_residual_layernorm", out, x, weight, bias, eps, exact_mode);
  call.add_summand(x_out, y, gate);
  if (scale) call.modulate(*scale, shift);
  at::Tensor mean = row_stats(x), rstd = row_stats(x);
  run_saving(call, mean, rstd);
  return {out, x_out, mean, rstd};
}

using OptTensor = std::optional<at::Tensor>;

// The grad of one modulation tensor `t` (read as `r`, a RowIn from RowOperands::modulation): its kind
// (layernorm.h) and the tensors it is written to.
struct ModGradPlan {
  ltx::ModGrad grad;
  at::Tensor out;        // the grad, t's shape and dtype
  at::Tensor rows;       // kPerRow over a batch-broadcast tensor: every row's grad, summed over batch after
  at::Tensor partials;   // kAllRows / kPerBatch: the workspace
};

// By the tensor's shape, not its strides: a leaf that is an expanded view (stride 0) still has a grad
// element per index.
ltx::ModGradKind mod_grad_kind(const at::Tensor& t, int64_t batch, int64_t seq) {
  const int64_t tb = t.dim() >= 2 ? t.size(0) : 1;
  const int64_t ts = t.dim() == 3 && seq > 1 ? t.size(1) : 1;  // a 2-D x has seq 1 ([R, 1, D] per row)
  const bool covers_b = tb == batch, covers_s = ts == seq;
  if (covers_b && covers_s) return ltx::ModGradKind::kPerRow;    // an element per row
  if (!covers_b && !covers_s) return ltx::ModGradKind::kAllRows;  // [D]: every row
  if (covers_b) return ltx::ModGradKind::kPerBatch;              // [B, D], [B, 1, D] with seq > 1
  if (seq == 1) return ltx::ModGradKind::kAllRows;               // [D] or [1, D] over rows of their own
  return ltx::ModGradKind::kPerRow;  // [1, S, D] over batch > 1: written per row, then summed over batch
}

std::tuple<OptTensor, OptTensor, OptTensor, OptTensor, OptTensor, OptTensor, OptTensor> layernorm_bwd(
    const at::Tensor& grad_out, const OptTensor& grad_x_out, const at::Tensor& h, const at::Tensor& mean,
    const at::Tensor& rstd, const OptTensor& y, const OptTensor& gate, const OptTensor& scale,
    const OptTensor& shift, const OptTensor& weight, const OptTensor& bias, bool exact_mode,
    std::array<bool, 7> output_mask) {
  const char* op = "layernorm_bwd";
  LTX_CHECK(!gate || y, prefix(op), "`gate` was given without `y`");
  LTX_CHECK(!shift || scale, prefix(op), "`shift` was given without `scale`");
  // The statistics' dtype and shape first (before the device: CPU tests reach these checks).
  const auto check_stats = [&](const char* name, const at::Tensor& t) {
    LTX_CHECK_TYPE(t.scalar_type() == at::kFloat, prefix(op), "`", name, "` has dtype ", t.scalar_type(),
                   " but must be torch.float32");
    if (h.dim() < 1) return;  // RowOperands names the bad `h`
    const auto stats_shape = h.sizes().slice(0, h.dim() - 1);
    LTX_CHECK(t.sizes() == stats_shape, prefix(op), "`", name, "` has shape ", t.sizes(), " but must be ",
              stats_shape, " (`h`'s shape without its last dim)");
  };
  check_stats("mean", mean);
  check_stats("rstd", rstd);
  ltx_check::RowOperands ops(op, h, 0.0, "h");
  ltx_check::check_same_cuda_device(op, "mean", mean, "h", h);
  ltx_check::check_same_cuda_device(op, "rstd", rstd, "h", h);
  const at::Tensor m = mean.contiguous(), r = rstd.contiguous();
  const auto want = [&](int i) { return output_mask[i]; };

  ltx::LayerNormBwdArgs a;
  a.batch = ops.batch();
  a.seq = ops.seq();
  a.hidden = ops.hidden();
  a.dtype = ops.dtype();
  a.exact = exact_mode;
  a.h = ops.row_in("h", h);
  a.grad_out = ops.row_in("grad_out", grad_out);
  a.mean = m.data_ptr<float>();
  a.rstd = r.data_ptr<float>();
  if (grad_x_out && y) a.grad_h = ops.row_in("grad_x_out", *grad_x_out);
  if (y) ops.row_in("y", *y);  // checked even when dgate is not wanted
  if (gate) a.gate = ops.modulation("gate", *gate);
  if (scale) a.scale = ops.modulation("scale", *scale);
  if (shift) ops.modulation("shift", *shift);  // read for its shape and dtype only
  a.mod_dtype = ops.mod_dtype();
  if (weight) a.weight = ops.affine("weight", *weight, a.weight_f32);
  if (bias) a.bias = ops.affine("bias", *bias, a.bias_f32);

  OptTensor grad_x, grad_y, grad_weight, grad_bias;
  if (want(0)) {
    grad_x = at::empty(h.sizes(), h.options());
    a.grad_x = ops.row_out("grad_x", *grad_x);
  }
  if (want(1) && y) {
    grad_y = at::empty(h.sizes(), h.options());
    a.grad_y = ops.row_out("grad_y", *grad_y);
  }
  // The modulation grads: kinds first (a per-batch one sets the row split), then their tensors.
  // The row split follows the shapes alone (any per-batch tensor given), not the grads asked for, so
  // that leaving an input out of the graph changes no bit of the other grads.
  ModGradPlan plans[3];
  const OptTensor* mods[3] = {&gate, &scale, &shift};
  bool per_batch = false;
  for (int i = 0; i < 3; ++i) {
    if (!*mods[i]) continue;
    const ltx::ModGradKind kind = mod_grad_kind(**mods[i], a.batch, a.seq);
    per_batch = per_batch || kind == ltx::ModGradKind::kPerBatch;
    if (want(2 + i)) plans[i].grad.kind = kind;
  }
  a.per_batch_split = per_batch;
  a.seam = y.has_value();  // gated_residual_layernorm's backward always passes y
  const int64_t blocks = ltx::layernorm_bwd_blocks(a);
  const auto workspace = [&]() { return at::empty({blocks, a.hidden}, h.options().dtype(at::kFloat)); };
  const bool three_d = h.dim() == 3;
  for (int i = 0; i < 3; ++i) {
    ModGradPlan& p = plans[i];
    if (p.grad.kind == ltx::ModGradKind::kNone) continue;
    const at::Tensor& t = **mods[i];
    p.out = at::empty(t.sizes(), t.options());
    if (p.grad.kind == ltx::ModGradKind::kPerRow) {
      const bool direct = p.out.numel() == a.batch * a.seq * a.hidden;
      p.rows = direct ? p.out : at::empty(h.sizes(), t.options());
      p.grad.rows = {p.rows.data_ptr(), three_d ? a.seq * a.hidden : a.hidden, three_d ? a.hidden : 0};
    } else {
      p.partials = workspace();
      p.grad.partials = p.partials.data_ptr<float>();
      p.grad.out = p.out.data_ptr();
    }
  }
  if (gate && plans[0].grad.kind != ltx::ModGradKind::kNone) a.y = ops.row_in("y", *y);  // dgate = dh * y
  a.grad_gate = plans[0].grad;
  a.grad_scale = plans[1].grad;
  a.grad_shift = plans[2].grad;
  at::Tensor weight_partials, bias_partials;
  if (want(5) && weight) {
    grad_weight = at::empty(weight->sizes(), weight->options());
    weight_partials = workspace();
    a.weight_partials = weight_partials.data_ptr<float>();
    a.grad_weight = grad_weight->data_ptr();
  }
  if (want(6) && bias) {
    grad_bias = at::empty(bias->sizes(), bias->options());
    bias_partials = workspace();
    a.bias_partials = bias_partials.data_ptr<float>();
    a.grad_bias = grad_bias->data_ptr();
  }

  OptTensor mod_out[3];
  if (ops.empty()) {  // nothing to launch: sums over no rows are zero
    for (OptTensor* t : {&grad_weight, &grad_bias})
      if (*t) (*t)->zero_();
    for (int i = 0; i < 3; ++i)
      if (plans[i].out.defined()) mod_out[i] = plans[i].out.zero_();
    return {grad_x, grad_y, mod_out[0], mod_out[1], mod_out[2], grad_weight, grad_bias};
  }
  ops.run([&](cudaStream_t stream) { return ltx::layernorm_bwd(a, stream); });
  for (int i = 0; i < 3; ++i) {
    ModGradPlan& p = plans[i];
    if (!p.out.defined()) continue;
    if (p.rows.defined() && !p.rows.is_same(p.out))  // deterministic: torch's sum over batch has a fixed order
      p.out.copy_(p.rows.sum(0, /*keepdim=*/true, at::kFloat).view(p.out.sizes()));
    mod_out[i] = p.out;
  }
  return {grad_x, grad_y, mod_out[0], mod_out[1], mod_out[2], grad_weight, grad_bias};
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
  // The functional ops autograd records (ltx_kernels/layernorm.py registers the backward): mean and
  // rstd are float32, one per row of x.
  ops.def("layernorm_fwd(Tensor x, Tensor? weight, Tensor? bias, float eps) -> (Tensor out, Tensor mean, "
          "Tensor rstd)");
  ops.def("adaln_layernorm_fwd(Tensor x, Tensor scale, Tensor? shift, Tensor? weight, Tensor? bias, float eps, "
          "bool exact_mode) -> (Tensor out, Tensor mean, Tensor rstd)");
  ops.def("gated_residual_layernorm_fwd(Tensor x, Tensor y, Tensor? gate, Tensor? scale, Tensor? shift, "
          "Tensor? weight, Tensor? bias, float eps, bool exact_mode) -> (Tensor out, Tensor x_out, Tensor mean, "
          "Tensor rstd)");
  // h: the rows the forward normalised (x, or the seam's x_out); output_mask: which grads to return, in
  // the order x, y, gate, scale, shift, weight, bias.
  ops.def("layernorm_bwd(Tensor grad_out, Tensor? grad_x_out, Tensor h, Tensor mean, Tensor rstd, Tensor? y, "
          "Tensor? gate, Tensor? scale, Tensor? shift, Tensor? weight, Tensor? bias, bool exact_mode, "
          "bool[7] output_mask) -> (Tensor? grad_x, Tensor? grad_y, Tensor? grad_gate, Tensor? grad_scale, "
          "Tensor? grad_shift, Tensor? grad_weight, Tensor? grad_bias)");
  ltx_check::impl_cuda_and_cpu(ops, "layernorm_fwd", &layernorm_fwd);
  ltx_check::impl_cuda_and_cpu(ops, "adaln_layernorm_fwd", &adaln_layernorm_fwd);
  ltx_check::impl_cuda_and_cpu(ops, "gated_residual_layernorm_fwd", &gated_residual_layernorm_fwd);
  ltx_check::impl_cuda_and_cpu(ops, "layernorm_bwd", &layernorm_bwd);
#ifdef LTX_KERNELS_DEV
  ops.def("layernorm_path(Tensor out, Tensor x, Tensor? y, Tensor? modulation, Tensor? weight) -> int");
  ltx_check::impl_cuda_and_cpu(ops, "layernorm_path", &layernorm_path);
#endif
}
