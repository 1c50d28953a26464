// Validation and dispatch for the fused norm family (kernel_src/fused_norm/). Every op builds one
// ltx::FusedNormArgs through FusedCall, which checks each tensor against the
// row shape of `x` (ltx_check::RowOperands) and names the argument in every error.
#include <optional>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

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

// --- the functional ops autograd records (ltx_kernels/fused_norm.py registers their backward) ---------
// Each allocates its outputs (contiguous) and runs the out-variant above: the forward kernels and their
// speed are those of the inference path.

at::Tensor new_rows(const at::Tensor& like) { return at::empty(like.sizes(), like.options()); }

std::tuple<at::Tensor, at::Tensor> rmsnorm_residual_fwd(const at::Tensor& input, const at::Tensor& residual,
                                                        const std::optional<at::Tensor>& weight, double eps,
                                                        bool diffusers_rounding) {
  at::Tensor out = new_rows(input), residual_out = new_rows(input);
  rmsnorm_residual(out, residual_out, input, residual, weight, eps, diffusers_rounding);
  return {out, residual_out};
}

at::Tensor adaln_rmsnorm_fwd(const at::Tensor& input, const std::optional<at::Tensor>& weight, const at::Tensor& scale,
                             const std::optional<at::Tensor>& shift, double eps, bool exact_mode) {
  at::Tensor out = new_rows(input);
  adaln_rmsnorm(out, input, weight, scale, shift, eps, exact_mode);
  return out;
}

at::Tensor gated_residual_fwd(const at::Tensor& x, const at::Tensor& y, const std::optional<at::Tensor>& gate,
                              bool exact_mode) {
  at::Tensor out = new_rows(x);
  gated_residual(out, x, y, gate, exact_mode);
  return out;
}

std::tuple<at::Tensor, at::Tensor> gated_residual_rmsnorm_fwd(const at::Tensor& x, const at::Tensor& y,
                                                              const std::optional<at::Tensor>& gate,
                                                              const std::optional<at::Tensor>& weight,
                                                              const at::Tensor& scale,
                                                              const std::optional<at::Tensor>& shift, double eps,
                                                              bool exact_mode) {
  at::Tensor out = new_rows(x), x_out = new_rows(x);
  gated_residual_rmsnorm(out, x_out, x, y, gate, weight, scale, shift, eps, exact_mode);
  return {out, x_out};
}

at::Tensor residual_tanh_gated_rmsnorm_fwd(const at::Tensor& x, const at::Tensor& x_res, const at::Tensor& gate,
                                           double eps, bool exact_mode) {
  at::Tensor out = new_rows(x);
  residual_tanh_gated_rmsnorm(out, x, x_res, gate, eps, exact_mode);
  return out;
}

at::Tensor modulated_rmsnorm_fwd(const at::Tensor& x, const at::Tensor& scale, double eps, double scale_offset) {
  at::Tensor out = new_rows(x);
  modulated_rmsnorm(out, x, scale, eps, scale_offset);
  return out;
}

// --- the backward (formulas in kernel_src/fused_norm/fused_norm.h) --------------------------------------

struct OpName {
  const char* name;
  ltx::FusedNormOp op;
  bool normalises, sums, weight, gate, scale, shift;  // what it reads and has grads for
};
constexpr OpName kOpNames[] = {
    {"adaln_rmsnorm", ltx::FusedNormOp::kAdalnRmsnorm, true, false, true, false, true, true},
    {"rmsnorm_residual", ltx::FusedNormOp::kRmsnormResidual, true, true, true, false, false, false},
    {"gated_residual_rmsnorm", ltx::FusedNormOp::kGatedResidualRmsnorm, true, true, true, true, true, true},
    {"gated_residual", ltx::FusedNormOp::kGatedResidual, false, true, false, true, false, false},
    {"residual_tanh_gated_rmsnorm", ltx::FusedNormOp::kResidualTanhGatedRmsnorm, true, false, false, true, false,
     false},
    {"modulated_rmsnorm", ltx::FusedNormOp::kModulatedRmsnorm, true, false, false, false, true, false},
};

const OpName& op_named(const char* where, c10::string_view name) {
  for (const OpName& o : kOpNames)
    if (name == o.name) return o;
  LTX_CHECK(false, prefix(where), "unknown op `", std::string(name.data(), name.size()),
            "`; expected one of the fused_norm ops");
  return kOpNames[0];
}

// A grad of a modulation tensor `t` of a [B, S, D] problem: written per row, or reduced over the rows of a
// batch or over all rows (fused_norm.h). Decided by t's shape, not its strides: an expanded tensor has a
// grad per element of its shape (autograd sums it into the tensor it was expanded from).
struct ModGrad {
  at::Tensor grad;      // t's shape, contiguous: what the op returns
  at::Tensor per_row;   // [B, S, D] of the mod dtype when rows of different batches share a row of t
  ltx::FusedGrad args;  // partials set later
  bool reduced = false;
};

ModGrad mod_grad(const at::Tensor& t, int64_t batch, int64_t seq, int64_t hidden) {
  ModGrad g;
  g.grad = at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous));
  const bool spans_b = t.dim() >= 2 && t.size(0) == batch && batch > 1;
  const bool spans_s = t.dim() == 3 && t.size(1) == seq && seq > 1;
  if ((spans_b || batch == 1) && (spans_s || seq == 1)) {  // a row of t per row of x
    g.args.per_row = {g.grad.data_ptr(), spans_b ? g.grad.stride(0) : 0, spans_s ? g.grad.stride(1) : 0};
  } else if (spans_s) {  // [1, S, D] with B > 1: the batches share each row; summed after the kernel
    g.per_row = at::empty({batch, seq, hidden}, t.options().memory_format(at::MemoryFormat::Contiguous));
    g.args.per_row = {g.per_row.data_ptr(), seq * hidden, hidden};
  } else {  // per batch ([B, D], [B, 1, D]), or one row for all ([D], [1, D], [1, 1, D])
    g.reduced = true;
    g.args.per_batch = spans_b;
    g.args.out = g.grad.data_ptr();
  }
  return g;
}

using BwdGrads = std::tuple<std::optional<at::Tensor>, std::optional<at::Tensor>, std::optional<at::Tensor>, std::optional<at::Tensor>,
                            std::optional<at::Tensor>, std::optional<at::Tensor>>;

// grad_h (the grad of x, and of the residual / y where nothing scales it; None for gated_residual, whose
// dx is grad_sum), then the grads of y
// (summand ops with a gate), gate, weight, scale and shift, each when its flag asks for it.
BwdGrads fused_norm_bwd(c10::string_view op_name, const std::optional<at::Tensor>& grad_out,
                        const std::optional<at::Tensor>& grad_sum, const at::Tensor& h,
                        const std::optional<at::Tensor>& y, const std::optional<at::Tensor>& gate,
                        const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& scale,
                        const std::optional<at::Tensor>& shift, double eps, double scale_offset, bool exact_mode,
                        bool y_grad, bool gate_grad, bool weight_grad, bool scale_grad, bool shift_grad) {
  const char* op = "fused_norm_bwd";
  const OpName& kind = op_named(op, op_name);
  const auto require = [&](bool ok, const char* what) {
    LTX_CHECK(ok, prefix(op), what, " (op `", kind.name, "`)");
  };
  require(grad_out.has_value() == kind.normalises, kind.normalises ? "`grad_out` is required" : "`grad_out` must be None");
  require(grad_sum.has_value() == kind.sums, kind.sums ? "`grad_sum` is required" : "`grad_sum` must be None");
  require(!weight.has_value() || kind.weight, "this op has no `weight`");
  require(!gate.has_value() || kind.gate, "this op has no `gate`");
  require(!scale.has_value() || kind.scale, "this op has no `scale`");
  require(!shift.has_value() || kind.shift, "this op has no `shift`");
  require(scale.has_value() || !kind.scale, "`scale` is required");
  require(gate.has_value() || kind.op != ltx::FusedNormOp::kResidualTanhGatedRmsnorm, "`gate` is required");
  require(!weight_grad || weight.has_value(), "`weight_grad` is true but there is no `weight`");
  require(!gate_grad || gate.has_value(), "`gate_grad` is true but there is no `gate`");
  require(!scale_grad || scale.has_value(), "`scale_grad` is true but there is no `scale`");
  require(!shift_grad || shift.has_value(), "`shift_grad` is true but there is no `shift`");
  require(!(gate_grad && kind.sums) || y.has_value(), "`gate_grad` needs `y`");
  ltx_check::RowOperands ops(op, h, eps, "h");  // checks h, then each operand against it

  ltx::FusedNormBwdArgs a;
  a.op = kind.op;
  a.batch = ops.batch();
  a.seq = ops.seq();
  a.hidden = ops.hidden();
  a.dtype = ops.dtype();
  a.eps = static_cast<float>(eps);
  a.scale_offset = static_cast<float>(scale_offset);
  a.h = ops.row_in("h", h);
  // The upstream grads are read as contiguous rows: a view is copied once.
  at::Tensor dout, dsum;
  if (grad_out) {
    dout = grad_out->contiguous();
    ops.row_in("grad_out", dout);
    a.grad_out = dout.data_ptr();
  }
  if (grad_sum) {
    dsum = grad_sum->contiguous();
    ops.row_in("grad_sum", dsum);
    a.grad_sum = dsum.data_ptr();
  }
  if (gate) a.gate = ops.modulation("gate", *gate);
  if (scale) a.scale = ops.modulation("scale", *scale);
  if (shift) ops.modulation("shift", *shift);  // checked; the backward reads only its shape
  a.mod_dtype = ops.mod_dtype();
  if (weight) {
    a.weight = ops.vector("weight", *weight);
    LTX_CHECK_TYPE(weight->scalar_type() == h.scalar_type(), prefix(op), "`weight` has dtype ", weight->scalar_type(),
                   " but `h` has dtype ", h.scalar_type());
  }
  if (gate_grad && kind.sums) a.y = ops.row_in("y", *y);
  a.round_n = exact_mode && a.dtype != ltx::DType::kFloat32 && a.mod_dtype == a.dtype;

  std::optional<at::Tensor> grad_h;
  if (kind.normalises) {  // gated_residual: dx is grad_sum itself
    grad_h = new_rows(h);
    a.grad_h = grad_h->data_ptr();
  }
  std::optional<at::Tensor> grad_y;
  if (y_grad && kind.sums && gate) {
    grad_y = new_rows(h);
    a.grad_y = grad_y->data_ptr();
  }
  std::optional<ModGrad> g_gate, g_scale, g_shift;
  const int64_t B = a.batch, S = a.seq, D = a.hidden;
  if (gate_grad) g_gate = mod_grad(*gate, B, S, D);
  if (scale_grad) g_scale = mod_grad(*scale, B, S, D);
  if (shift_grad) g_shift = mod_grad(*shift, B, S, D);
  std::optional<at::Tensor> grad_weight;
  if (weight_grad) grad_weight = at::empty({D}, weight->options());
  if (g_gate) a.grad_gate = g_gate->args;
  if (g_scale) a.grad_scale = g_scale->args;
  if (g_shift) a.grad_shift = g_shift->args;
  if (grad_weight) a.grad_weight.out = grad_weight->data_ptr();

  std::vector<at::Tensor*> reduced_outs;  // zeroed when there are no rows
  ltx::FusedGrad* reduced[4] = {nullptr, nullptr, nullptr, nullptr};
  int n_reduced = 0;
  if (grad_weight) {
    reduced[n_reduced++] = &a.grad_weight;
    reduced_outs.push_back(&*grad_weight);
  }
  for (const auto& [g, f] : {std::make_pair(&g_gate, &a.grad_gate), std::make_pair(&g_scale, &a.grad_scale),
                              std::make_pair(&g_shift, &a.grad_shift)})
    if (*g && (*g)->reduced) {
      reduced[n_reduced++] = f;
      reduced_outs.push_back(&(*g)->grad);
    }
  if (ops.empty()) {
    for (at::Tensor* t : reduced_outs) t->zero_();  // a sum over no rows
    for (auto* g : {&g_gate, &g_scale, &g_shift})
      if (*g && (*g)->per_row.defined()) (*g)->grad.zero_();
  } else {
    at::Tensor partials;
    if (n_reduced > 0) {
      const int64_t blocks = ltx::fused_norm_bwd_blocks(a);
      partials = at::empty({n_reduced, blocks, D}, h.options().dtype(at::kFloat));
      for (int i = 0; i < n_reduced; ++i) reduced[i]->partials = partials[i].data_ptr<float>();
    }
    ops.run([&](cudaStream_t stream) { return ltx::fused_norm_bwd(a, stream); });
    for (auto* g : {&g_gate, &g_scale, &g_shift})  // [1, S, D]: the sum over batches (deterministic)
      if (*g && (*g)->per_row.defined()) (*g)->grad.copy_((*g)->per_row.sum(0).view((*g)->grad.sizes()));
  }
  const auto grad_of = [](const std::optional<ModGrad>& g) -> std::optional<at::Tensor> {
    if (!g) return std::nullopt;
    return g->grad;
  };
  return {grad_h, grad_y, grad_of(g_gate), grad_weight, grad_of(g_scale), grad_of(g_shift)};
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
  // The functional ops autograd records, and their one backward (ltx_kernels/fused_norm.py).
  ops.def("rmsnorm_residual_fwd(Tensor input, Tensor residual, Tensor? weight, float eps, bool diffusers_rounding) "
          "-> (Tensor out, Tensor residual_out)");
  ops.def("adaln_rmsnorm_fwd(Tensor input, Tensor? weight, Tensor scale, Tensor? shift, float eps, bool exact_mode) "
          "-> Tensor");
  ops.def("gated_residual_fwd(Tensor x, Tensor y, Tensor? gate, bool exact_mode) -> Tensor");
  ops.def("gated_residual_rmsnorm_fwd(Tensor x, Tensor y, Tensor? gate, Tensor? weight, Tensor scale, Tensor? shift, "
          "float eps, bool exact_mode) -> (Tensor out, Tensor x_out)");
  ops.def("residual_tanh_gated_rmsnorm_fwd(Tensor x, Tensor x_res, Tensor gate, float eps, bool exact_mode) -> Tensor");
  ops.def("modulated_rmsnorm_fwd(Tensor x, Tensor scale, float eps, float scale_offset) -> Tensor");
  ops.def("fused_norm_bwd(str op, Tensor? grad_out, Tensor? grad_sum, Tensor h, Tensor? y, Tensor? gate, "
          "Tensor? weight, Tensor? scale, Tensor? shift, float eps, float scale_offset, bool exact_mode, bool y_grad, "
          "bool gate_grad, bool weight_grad, bool scale_grad, bool shift_grad) -> (Tensor? grad_h, Tensor? grad_y, "
          "Tensor? grad_gate, Tensor? grad_weight, Tensor? grad_scale, Tensor? grad_shift)");
  ltx_check::impl_cuda_and_cpu(ops, "rmsnorm_residual_fwd", &rmsnorm_residual_fwd);
  ltx_check::impl_cuda_and_cpu(ops, "adaln_rmsnorm_fwd", &adaln_rmsnorm_fwd);
  ltx_check::impl_cuda_and_cpu(ops, "gated_residual_fwd", &gated_residual_fwd);
  ltx_check::impl_cuda_and_cpu(ops, "gated_residual_rmsnorm_fwd", &gated_residual_rmsnorm_fwd);
  ltx_check::impl_cuda_and_cpu(ops, "residual_tanh_gated_rmsnorm_fwd", &residual_tanh_gated_rmsnorm_fwd);
  ltx_check::impl_cuda_and_cpu(ops, "modulated_rmsnorm_fwd", &modulated_rmsnorm_fwd);
  ltx_check::impl_cuda_and_cpu(ops, "fused_norm_bwd", &fused_norm_bwd);
#ifdef LTX_KERNELS_DEV
  ops.def("fused_norm_path(Tensor out, Tensor x, Tensor? y, Tensor? modulation) -> int");
  ltx_check::impl_cuda_and_cpu(ops, "fused_norm_path", &fused_norm_path);
#endif
}
