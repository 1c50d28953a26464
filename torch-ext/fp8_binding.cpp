// Validation and dispatch for the FP8 producers (kernel_src/fp8/): each op
// returns the e4m3 data (x's shape, contiguous) and one float32 scale per row
// (x's shape without the last dim), the operands torch._scaled_mm's rowwise
// scaling takes. The norm ops check their operands like the fused norms
// (ltx_check::RowOperands).
#include <optional>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "check.h"
#include "row_operands.h"
#include "torch_binding.h"

#include "../kernel_src/fp8/fp8.h"

namespace {

using ltx_check::prefix;
using Rows = std::tuple<at::Tensor, at::Tensor>;

// The hidden size the kernels take: a multiple of 16 (torch._scaled_mm's K), at most fp8_max_hidden.
void check_hidden(const char* op, const char* arg, int64_t hidden, ltx::DType dt) {
  LTX_CHECK(hidden % 16 == 0, prefix(op), "the last dim of `", arg, "` must be a multiple of 16 (torch._scaled_mm's ",
            "K), got ", hidden);
  LTX_CHECK(hidden <= ltx::fp8_max_hidden(dt), prefix(op), "the last dim of `", arg, "` is ", hidden,
            "; rows of at most ", ltx::fp8_max_hidden(dt), " elements of this dtype are supported");
}

// The e4m3 data ([..., K], contiguous) and row scales ([...]) for rows shaped like `x`.
Rows new_fp8_rows(const at::Tensor& x) {
  at::Tensor data = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor scale = at::empty(x.sizes().slice(0, x.dim() - 1), x.options().dtype(at::kFloat));
  return {data, scale};
}

// The kernels read 16-byte words with no scalar fallback. Row ops read strided rows in place (a
// modulation view such as `unbind` of a [B, 6, D] table is not copied) when every row starts on a
// 16-byte boundary; anything else (a storage offset, an odd row stride, a strided last dim) is read
// from a contiguous copy. `contiguous` asks for a contiguous tensor (the elementwise ops' flat rows).
at::Tensor aligned(const at::Tensor& t, bool contiguous = false) {
  const int64_t item = static_cast<int64_t>(t.element_size());
  bool ok = reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 &&
            (contiguous ? t.is_contiguous() : t.dim() == 0 || t.size(-1) <= 1 || t.stride(-1) == 1);
  for (int64_t d = 0; ok && d + 1 < t.dim(); ++d) ok = t.size(d) <= 1 || t.stride(d) * item % 16 == 0;
  return ok ? t : t.clone(at::MemoryFormat::Contiguous);
}

std::optional<at::Tensor> aligned(const std::optional<at::Tensor>& t) {
  return t ? std::optional<at::Tensor>(aligned(*t)) : std::nullopt;
}

void run(const char* op, const ltx::Fp8RowsArgs& a, const at::Tensor& x) {
  if (a.batch * a.seq == 0 || a.hidden == 0) return;
  ltx_check::launch(op, x.device(), [&](cudaStream_t stream) { return ltx::fp8_rows(a, stream); });
}

// quantize_fp8 / gelu_tanh_fp8: rows of any rank >= 1.
Rows elementwise_rows(const char* op, const at::Tensor& x, ltx::Fp8Producer producer) {
  const ltx::DType dt = ltx_check::dtype_of(op, "x", x.scalar_type());
  LTX_CHECK(x.dim() >= 1, prefix(op), "`x` must have at least one dimension, got a 0-d tensor");
  check_hidden(op, "x", x.size(-1), dt);
  ltx_check::check_same_cuda_device(op, "x", x, "x", x);
  LTX_CHECK(producer == ltx::Fp8Producer::kQuantize || dt != ltx::DType::kFloat32, prefix(op),
            "`x` must be torch.bfloat16 or torch.float16, got torch.float32");
  const at::Tensor input = aligned(x, /*contiguous=*/true);
  Rows out = new_fp8_rows(input);
  ltx::Fp8RowsArgs a;
  a.data = std::get<0>(out).data_ptr();
  a.row_scale = std::get<1>(out).data_ptr<float>();
  a.hidden = x.size(-1);
  a.batch = a.hidden == 0 ? 0 : x.numel() / a.hidden;
  a.seq = 1;
  a.x = {input.data_ptr(), a.hidden, 0};
  a.dtype = dt;
  a.producer = producer;
  run(op, a, x);
  return out;
}

Rows quantize_fp8(const at::Tensor& x) { return elementwise_rows("quantize_fp8", x, ltx::Fp8Producer::kQuantize); }

Rows gelu_tanh_fp8(const at::Tensor& x) { return elementwise_rows("gelu_tanh_fp8", x, ltx::Fp8Producer::kGeluTanh); }

// Row ops ([R, D] or [B, S, D], modulation broadcast to the rows): the modulated RMSNorm of `x`, or of
// h = x + y * gate, or h itself, into e4m3 rows.
struct RowsCall {
  ltx_check::RowOperands ops;
  ltx::Fp8RowsArgs args;

  RowsCall(const char* op, const at::Tensor& x, const char* x_name, double eps, ltx::Fp8Producer producer)
      : ops(op, x, eps, x_name) {
    LTX_CHECK(ops.dtype() != ltx::DType::kFloat32, prefix(op), "`", x_name,
              "` must be torch.bfloat16 or torch.float16, got torch.float32");
    check_hidden(op, x_name, ops.hidden(), ops.dtype());
    args.batch = ops.batch();
    args.seq = ops.seq();
    args.hidden = ops.hidden();
    args.dtype = args.mod_dtype = ops.dtype();
    args.eps = static_cast<float>(eps);
    args.producer = producer;
    args.x = ops.row_in(x_name, x);
  }

  // The LayerNorm's operands: weight and bias optional, and the modulation (scale, with an optional shift) too.
  void layernorm_operands(const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                          const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& shift) {
    LTX_CHECK(scale || !shift, prefix(ops.op()), "`shift` was given without `scale`; pass "
              "scale=torch.zeros_like(shift) for a shift alone");
    if (weight) args.weight = ops.affine("weight", *weight, args.weight_f32);
    if (bias) args.bias = ops.affine("bias", *bias, args.bias_f32);
    if (scale) args.scale = ops.modulation("scale", *scale);
    if (shift) args.shift = ops.modulation("shift", *shift);
    args.mod_dtype = ops.mod_dtype();
  }

  // h = x + y * gate, written to a new tensor of x's shape, which it returns.
  at::Tensor summand(const at::Tensor& x, const at::Tensor& y, const std::optional<at::Tensor>& gate) {
    at::Tensor x_out = at::empty(x.sizes(), x.options());
    args.y = ops.row_in("y", y);
    if (gate) args.gate = ops.modulation("gate", *gate);
    args.mod_dtype = ops.mod_dtype();
    args.residual_out = ops.row_out("x_out", x_out);
    return x_out;
  }

  void operands(const std::optional<at::Tensor>& weight, const at::Tensor& scale,
                const std::optional<at::Tensor>& shift) {
    if (weight) {
      args.weight = ops.vector("weight", *weight);
      LTX_CHECK_TYPE(weight->scalar_type() == ops.x().scalar_type(), prefix(ops.op()), "`weight` has dtype ",
                     weight->scalar_type(), " but `", ops.x_name(), "` has dtype ", ops.x().scalar_type());
    }
    args.scale = ops.modulation("scale", scale);
    if (shift) args.shift = ops.modulation("shift", *shift);
    args.mod_dtype = ops.mod_dtype();
  }

  Rows run(const at::Tensor& x) {
    Rows out = new_fp8_rows(x);
    args.data = std::get<0>(out).data_ptr();
    args.row_scale = std::get<1>(out).data_ptr<float>();
    ops.run([&](cudaStream_t stream) { return ltx::fp8_rows(args, stream); });
    return out;
  }
};

Rows adaln_rmsnorm_fp8(const at::Tensor& input_, const std::optional<at::Tensor>& weight_, const at::Tensor& scale_,
                       const std::optional<at::Tensor>& shift_, double eps) {
  const at::Tensor input = aligned(input_), scale = aligned(scale_);
  const std::optional<at::Tensor> weight = aligned(weight_), shift = aligned(shift_);
  RowsCall call("adaln_rmsnorm_fp8", input, "input", eps, ltx::Fp8Producer::kModulatedRmsnorm);
  call.operands(weight, scale, shift);
  return call.run(input);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gated_residual_rmsnorm_fp8(
    const at::Tensor& x_, const at::Tensor& y_, const std::optional<at::Tensor>& gate_,
    const std::optional<at::Tensor>& weight_, const at::Tensor& scale_, const std::optional<at::Tensor>& shift_,
    double eps) {
  const at::Tensor x = aligned(x_), y = aligned(y_), scale = aligned(scale_);
  const std::optional<at::Tensor> gate = aligned(gate_), weight = aligned(weight_), shift = aligned(shift_);
  RowsCall call("gated_residual_rmsnorm_fp8", x, "x", eps, ltx::Fp8Producer::kModulatedRmsnorm);
  at::Tensor x_out = call.summand(x, y, gate);
  call.operands(weight, scale, shift);
  auto [data, row_scale] = call.run(x);
  return {data, row_scale, x_out};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gated_residual_fp8(const at::Tensor& x_, const at::Tensor& y_,
                                                                  const std::optional<at::Tensor>& gate_) {
  const at::Tensor x = aligned(x_), y = aligned(y_);
  const std::optional<at::Tensor> gate = aligned(gate_);
  RowsCall call("gated_residual_fp8", x, "x", 0.0, ltx::Fp8Producer::kQuantize);
  at::Tensor x_out = call.summand(x, y, gate);
  auto [data, row_scale] = call.run(x);
  return {data, row_scale, x_out};
}

Rows adaln_layernorm_fp8(const at::Tensor& x_, const at::Tensor& scale_, const std::optional<at::Tensor>& shift_,
                         double eps, const std::optional<at::Tensor>& weight_, const std::optional<at::Tensor>& bias_) {
  const at::Tensor x = aligned(x_), scale = aligned(scale_);
  const std::optional<at::Tensor> shift = aligned(shift_), weight = aligned(weight_), bias = aligned(bias_);
  RowsCall call("adaln_layernorm_fp8", x, "x", eps, ltx::Fp8Producer::kModulatedLayernorm);
  call.layernorm_operands(weight, bias, scale, shift);
  return call.run(x);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gated_residual_layernorm_fp8(
    const at::Tensor& x_, const at::Tensor& y_, const std::optional<at::Tensor>& gate_, double eps,
    const std::optional<at::Tensor>& weight_, const std::optional<at::Tensor>& bias_,
    const std::optional<at::Tensor>& scale_, const std::optional<at::Tensor>& shift_) {
  const at::Tensor x = aligned(x_), y = aligned(y_);
  const std::optional<at::Tensor> gate = aligned(gate_), weight = aligned(weight_), bias = aligned(bias_),
                                  scale = aligned(scale_), shift = aligned(shift_);
  RowsCall call("gated_residual_layernorm_fp8", x, "x", eps, ltx::Fp8Producer::kModulatedLayernorm);
  at::Tensor x_out = call.summand(x, y, gate);
  call.layernorm_operands(weight, bias, scale, shift);
  auto [data, row_scale] = call.run(x);
  return {data, row_scale, x_out};
}

}  // namespace

void register_fp8(torch::Library& ops) {
  ops.def("quantize_fp8(Tensor x) -> (Tensor data, Tensor row_scale)");
  ops.def("gelu_tanh_fp8(Tensor x) -> (Tensor data, Tensor row_scale)");
  ops.def("adaln_rmsnorm_fp8(Tensor input, Tensor? weight, Tensor scale, Tensor? shift, float eps) "
          "-> (Tensor data, Tensor row_scale)");
  ops.def("gated_residual_rmsnorm_fp8(Tensor x, Tensor y, Tensor? gate, Tensor? weight, Tensor scale, "
          "Tensor? shift, float eps) -> (Tensor data, Tensor row_scale, Tensor x_out)");
  ltx_check::impl_cuda_and_cpu(ops, "quantize_fp8", &quantize_fp8);
  ltx_check::impl_cuda_and_cpu(ops, "gelu_tanh_fp8", &gelu_tanh_fp8);
  ltx_check::impl_cuda_and_cpu(ops, "adaln_rmsnorm_fp8", &adaln_rmsnorm_fp8);
  ltx_check::impl_cuda_and_cpu(ops, "gated_residual_rmsnorm_fp8", &gated_residual_rmsnorm_fp8);
  ops.def("gated_residual_fp8(Tensor x, Tensor y, Tensor? gate) -> (Tensor data, Tensor row_scale, Tensor x_out)");
  ltx_check::impl_cuda_and_cpu(ops, "gated_residual_fp8", &gated_residual_fp8);
  ops.def("adaln_layernorm_fp8(Tensor x, Tensor scale, Tensor? shift, float eps, Tensor? weight, Tensor? bias) "
          "-> (Tensor data, Tensor row_scale)");
  ops.def("gated_residual_layernorm_fp8(Tensor x, Tensor y, Tensor? gate, float eps, Tensor? weight, Tensor? bias, "
          "Tensor? scale, Tensor? shift) -> (Tensor data, Tensor row_scale, Tensor x_out)");
  ltx_check::impl_cuda_and_cpu(ops, "adaln_layernorm_fp8", &adaln_layernorm_fp8);
  ltx_check::impl_cuda_and_cpu(ops, "gated_residual_layernorm_fp8", &gated_residual_layernorm_fp8);
}
