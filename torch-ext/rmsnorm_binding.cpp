// Validation and dispatch for rmsnorm (kernel_src/rmsnorm/). Every error
// names the argument it is about; nothing is launched until all checks pass.
#include <optional>
#include <string>

#include <tuple>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "check.h"
#include "torch_binding.h"

#include "../kernel_src/rmsnorm/rmsnorm.h"

namespace {

using ltx_check::prefix;

using ltx_check::dtype_of;

// View `t` as [rows, hidden] rows with a single row stride and a contiguous
// last dim. Returns false when the leading dims cannot collapse into one stride.
bool row_stride_of(const at::Tensor& t, int64_t& row_stride) {
  const int64_t nd = t.dim();
  const int64_t hidden = t.size(nd - 1);
  if (hidden > 1 && t.stride(nd - 1) != 1) return false;
  row_stride = hidden;
  bool first = true;
  int64_t expected = 0;
  for (int64_t d = nd - 2; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (first) {
      row_stride = t.stride(d);
      expected = t.stride(d) * t.size(d);
      first = false;
    } else {
      if (t.stride(d) != expected) return false;
      expected = t.stride(d) * t.size(d);
    }
  }
  return true;
}

struct RmsnormCall {
  ltx::RmsnormArgs args;
  at::Tensor input_rows;  // keeps a contiguous copy alive when one was needed
};

// A tensor of `input`'s shape in the input's dtype or float32 (an output, or the grad of one): its dtype.
ltx::DType check_like_input(const char* op, const char* name, const at::Tensor& t, const at::Tensor& input) {
  const ltx::DType dt = dtype_of(op, name, t.scalar_type());
  LTX_CHECK_TYPE(t.scalar_type() == input.scalar_type() || t.scalar_type() == at::kFloat, prefix(op), "`", name,
                 "` has dtype ", t.scalar_type(), " but `input` has dtype ", input.scalar_type(), "; `", name,
                 "` must have the input's dtype or torch.float32");
  LTX_CHECK(t.sizes() == input.sizes(), prefix(op), "`", name, "` has shape ", t.sizes(), " but `input` has shape ",
            input.sizes());
  return dt;
}

// An optional [hidden] weight of the input's dtype or float32: its dtype (the input's without one).
ltx::DType check_weight(const char* op, const std::optional<at::Tensor>& weight, const at::Tensor& input) {
  if (!weight.has_value()) return dtype_of(op, "input", input.scalar_type());
  const at::Tensor& w = *weight;
  const ltx::DType dt = dtype_of(op, "weight", w.scalar_type());
  LTX_CHECK_TYPE(w.scalar_type() == input.scalar_type() || w.scalar_type() == at::kFloat, prefix(op),
                 "`weight` has dtype ", w.scalar_type(), " but `input` has dtype ", input.scalar_type(),
                 "; `weight` must have the input's dtype or torch.float32");
  LTX_CHECK(w.dim() == 1 && w.size(0) == input.size(-1), prefix(op), "`weight` has shape ", w.sizes(),
            " but must be [", input.size(-1), "] (the last dim of `input`)");
  return dt;
}

RmsnormCall check_rmsnorm(const char* op, at::Tensor& out, const at::Tensor& input,
                           const std::optional<at::Tensor>& weight, double eps, bool round_before_weight) {
  LTX_CHECK(input.dim() >= 1, prefix(op), "`input` must have at least one dimension, got a 0-d tensor");
  const int64_t hidden = input.size(-1);
  const ltx::DType in_dt = dtype_of(op, "input", input.scalar_type());
  const ltx::DType out_dt = check_like_input(op, "out", out, input);
  const ltx::DType w_dt = check_weight(op, weight, input);
  if (weight.has_value()) LTX_CHECK(weight->is_contiguous(), prefix(op), "`weight` must be contiguous");
  LTX_CHECK(eps >= 0.0, prefix(op), "`eps` must be >= 0, got ", eps);
  LTX_CHECK(input.is_cuda(), prefix(op), "`input` must be a CUDA tensor, got a tensor on ", input.device());
  LTX_CHECK(out.device() == input.device(), prefix(op), "`out` is on ", out.device(), " but `input` is on ",
              input.device());
  if (weight.has_value())
    LTX_CHECK(weight->device() == input.device(), prefix(op), "`weight` is on ", weight->device(),
                " but `input` is on ", input.device());

  // out may be input itself: each row is read completely before it is written.
  RmsnormCall call;
  if (input.numel() == 0) return call;  // rows == 0: nothing to launch, no layout to inspect
  int64_t out_stride = 0, in_stride = 0;
  LTX_CHECK(row_stride_of(out, out_stride), prefix(op),
              "`out` must have a contiguous last dim and leading dims that flatten into rows (strides ",
              out.strides(), ")");
  call.input_rows = input;
  if (!row_stride_of(input, in_stride)) {
    // A layout the kernel cannot walk: copy once rather than fail.
    call.input_rows = input.contiguous();
    in_stride = hidden;
  }
  ltx::RmsnormArgs& a = call.args;
  a.out = out.data_ptr();
  a.input = call.input_rows.data_ptr();
  a.weight = weight.has_value() ? weight->data_ptr() : nullptr;
  a.rows = hidden == 0 ? 0 : input.numel() / hidden;
  a.hidden = hidden;
  a.input_row_stride = in_stride;
  a.out_row_stride = out_stride;
  a.input_dtype = in_dt;
  a.weight_dtype = w_dt;
  a.out_dtype = out_dt;
  a.eps = static_cast<float>(eps);
  a.round_before_weight = round_before_weight && weight.has_value() && w_dt == in_dt && in_dt != ltx::DType::kFloat32;
  return call;
}

void run_rmsnorm(const char* op, at::Tensor& out, const at::Tensor& input, const std::optional<at::Tensor>& weight,
                  double eps, bool round_before_weight) {
  RmsnormCall call = check_rmsnorm(op, out, input, weight, eps, round_before_weight);
  if (call.args.rows == 0) return;
  ltx_check::launch(op, input.device(), [&](cudaStream_t stream) { return ltx::rmsnorm(call.args, stream); });
}

void rmsnorm(at::Tensor& out, const at::Tensor& input, const std::optional<at::Tensor>& weight, double eps,
             bool diffusers_rounding) {
  run_rmsnorm("rmsnorm", out, input, weight, eps, /*round_before_weight=*/diffusers_rounding);
}

// The output dtype of the functional forward: the input's, except float32 for
// diffusers rounding with a float32 weight on a half input (diffusers does not
// round then, and returns float32).
at::ScalarType forward_out_dtype(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                 bool diffusers_rounding) {
  const bool half = input.scalar_type() == at::kHalf || input.scalar_type() == at::kBFloat16;
  if (diffusers_rounding && half && weight.has_value() && weight->scalar_type() == at::kFloat) return at::kFloat;
  return input.scalar_type();
}

// Functional forward for autograd: the output and each row's r (float32,
// input.shape[:-1]), written by the forward kernel itself (one store per row).
std::tuple<at::Tensor, at::Tensor> rmsnorm_fwd(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                               double eps, bool diffusers_rounding) {
  const char* op = "rmsnorm";
  at::Tensor out = at::empty(input.sizes(), input.options().dtype(forward_out_dtype(input, weight, diffusers_rounding)));
  RmsnormCall call = check_rmsnorm(op, out, input, weight, eps, /*round_before_weight=*/diffusers_rounding);
  at::Tensor rstd = at::empty(input.sizes().slice(0, input.dim() - 1), input.options().dtype(at::kFloat));
  if (call.args.rows == 0) {
    rstd.fill_(0.0);  // hidden == 0 with rows left: nothing to normalise, and no r the backward reads
    return {out, rstd};
  }
  call.args.rstd = rstd.data_ptr<float>();
  ltx_check::launch(op, input.device(), [&](cudaStream_t stream) { return ltx::rmsnorm(call.args, stream); });
  return {out, rstd};
}

// Backward of rmsnorm_fwd (formulas in kernel_src/rmsnorm/rmsnorm.h): grad_input
// always, grad_weight (the weight's dtype) when there is a weight and
// weight_requires_grad.
std::tuple<at::Tensor, std::optional<at::Tensor>> rmsnorm_bwd(
    const at::Tensor& grad_out, const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const at::Tensor& rstd, bool diffusers_rounding, bool weight_requires_grad) {
  const char* op = "rmsnorm_bwd";
  LTX_CHECK(input.dim() >= 1, prefix(op), "`input` must have at least one dimension, got a 0-d tensor");
  const int64_t hidden = input.size(-1);
  const ltx::DType in_dt = dtype_of(op, "input", input.scalar_type());
  const ltx::DType dy_dt = check_like_input(op, "grad_out", grad_out, input);
  LTX_CHECK_TYPE(rstd.scalar_type() == at::kFloat, prefix(op), "`rstd` has dtype ", rstd.scalar_type(),
                 " but must be torch.float32");
  LTX_CHECK(rstd.sizes() == input.sizes().slice(0, input.dim() - 1), prefix(op), "`rstd` has shape ", rstd.sizes(),
            " but must be ", input.sizes().slice(0, input.dim() - 1), " (`input`'s shape without its last dim)");
  const ltx::DType w_dt = check_weight(op, weight, input);
  LTX_CHECK(!weight_requires_grad || weight.has_value(), prefix(op),
            "`weight_requires_grad` is true but there is no `weight`");
  LTX_CHECK(input.is_cuda(), prefix(op), "`input` must be a CUDA tensor, got a tensor on ", input.device());
  ltx_check::check_same_cuda_device(op, "grad_out", grad_out, "input", input);
  ltx_check::check_same_cuda_device(op, "rstd", rstd, "input", input);
  if (weight.has_value()) ltx_check::check_same_cuda_device(op, "weight", *weight, "input", input);

  at::Tensor grad_input = at::empty(input.sizes(), input.options());
  std::optional<at::Tensor> grad_weight;
  if (weight_requires_grad) grad_weight = at::empty({hidden}, weight->options());
  const int64_t rows = hidden == 0 ? 0 : input.numel() / hidden;
  if (rows == 0) {
    if (grad_weight.has_value()) grad_weight->zero_();  // a sum over no rows
    return {grad_input, grad_weight};
  }
  // The kernels walk contiguous rows: views are copied once (no copy when already contiguous).
  const at::Tensor x = input.contiguous(), dy = grad_out.contiguous(), r = rstd.contiguous();
  const at::Tensor w = weight.has_value() ? weight->contiguous() : at::Tensor();
  at::Tensor partials;
  if (grad_weight.has_value())
    partials = at::empty({ltx::rmsnorm_bwd_blocks(rows), hidden}, input.options().dtype(at::kFloat));
  ltx::RmsnormBwdArgs a;
  a.grad_input = grad_input.data_ptr();
  a.weight_partials = grad_weight.has_value() ? partials.data_ptr<float>() : nullptr;
  a.grad_weight = grad_weight.has_value() ? grad_weight->data_ptr() : nullptr;
  a.grad_out = dy.data_ptr();
  a.input = x.data_ptr();
  a.weight = weight.has_value() ? w.data_ptr() : nullptr;
  a.rstd = r.data_ptr<float>();
  a.rows = rows;
  a.hidden = hidden;
  a.input_dtype = in_dt;
  a.weight_dtype = w_dt;
  a.grad_out_dtype = dy_dt;
  a.round_before_weight =
      diffusers_rounding && weight.has_value() && w_dt == in_dt && in_dt != ltx::DType::kFloat32;
  ltx_check::launch(op, input.device(), [&](cudaStream_t stream) { return ltx::rmsnorm_bwd(a, stream); });
  return {grad_input, grad_weight};
}

#ifdef LTX_KERNELS_DEV
// Which kernel a call with these arguments takes: 0 vectorized, 1 scalar fallback (tests).
int64_t rmsnorm_path(const at::Tensor& out, const at::Tensor& input, const std::optional<at::Tensor>& weight) {
  at::Tensor o = out;
  RmsnormCall call = check_rmsnorm("rmsnorm_path", o, input, weight, 1e-6, false);
  return static_cast<int64_t>(ltx::rmsnorm_path(call.args));
}
#endif

}  // namespace

void register_rmsnorm(torch::Library& ops) {
  // diffusers_rounding: round the normalised value to the input dtype before a
  // half-precision weight multiply (diffusers RMSNorm, behaviour "A" of
  // docs/formulas.md); false: one rounding at the end (torch.nn.RMSNorm, "B").
  ops.def("rmsnorm(Tensor! out, Tensor input, Tensor? weight, float eps, bool diffusers_rounding) -> ()");
  ltx_check::impl_cuda_and_cpu(ops, "rmsnorm", &rmsnorm);
  // The functional pair autograd uses (ltx_kernels/rmsnorm.py registers the
  // backward with torch.library.register_autograd): rstd is float32, one per row.
  ops.def("rmsnorm_fwd(Tensor input, Tensor? weight, float eps, bool diffusers_rounding) -> (Tensor out, "
          "Tensor rstd)");
  ltx_check::impl_cuda_and_cpu(ops, "rmsnorm_fwd", &rmsnorm_fwd);
  ops.def("rmsnorm_bwd(Tensor grad_out, Tensor input, Tensor? weight, Tensor rstd, bool diffusers_rounding, "
          "bool weight_requires_grad) -> (Tensor grad_input, Tensor? grad_weight)");
  ltx_check::impl_cuda_and_cpu(ops, "rmsnorm_bwd", &rmsnorm_bwd);
#ifdef LTX_KERNELS_DEV
  ops.def("rmsnorm_path(Tensor out, Tensor input, Tensor? weight) -> int");
  ltx_check::impl_cuda_and_cpu(ops, "rmsnorm_path", &rmsnorm_path);
#endif
}
