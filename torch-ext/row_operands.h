// The operands of a row-wise op (fused_norm, layernorm) checked against its
// main input `x`: rows of x's shape and dtype, modulation tensors that
// broadcast to its rows, [D] vectors. Every error names the op and the
// argument. The family's binding builds its kernel argument struct from what
// these return.
#pragma once

#include <deque>

#include "check.h"

#include "../kernel_src/common/rows.h"

namespace ltx_check {

class RowOperands {
 public:
  // `x` (named `x_name` in errors) sets the row shape ([R, D] or [B, S, D]),
  // the dtype and the device.
  RowOperands(const char* op, const at::Tensor& x, double eps, const char* x_name = "x")
      : op_(op), x_name_(x_name), x_(x) {
    LTX_CHECK(x.dim() == 2 || x.dim() == 3, prefix(op), "`", x_name, "` must be [rows, hidden] or [batch, seq, ",
              "hidden], got ", x.dim(), " dims (shape ", x.sizes(), "); reshape it first");
    dtype_ = dtype_of(op, x_name, x.scalar_type());
    check_same_cuda_device(op, x_name, x, x_name, x);
    LTX_CHECK(eps >= 0.0, prefix(op), "`eps` must be >= 0, got ", eps);
    batch_ = x.size(0);
    seq_ = x.dim() == 3 ? x.size(1) : 1;
    hidden_ = x.size(-1);
    // The kernels count rows in 32 bits (fewer registers, more blocks per SM).
    LTX_CHECK(batch_ * seq_ < (int64_t(1) << 31), prefix(op), "`", x_name, "` has ", batch_ * seq_,
              " rows; at most 2^31 - 1 are supported (split the call)");
    mod_dtype_ = dtype_;
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
    check_same_cuda_device(op_, arg, t, x_name_, x_);
    const ltx::DType dt = dtype_of(op_, arg, t.scalar_type());
    LTX_CHECK_TYPE(t.scalar_type() == x_.scalar_type() || t.scalar_type() == at::kFloat, prefix(op_), "`", arg,
                   "` has dtype ", t.scalar_type(), " but `", x_name_, "` has dtype ", x_.scalar_type(), "; `",
                   arg, "` must have the dtype of `", x_name_, "` or torch.float32");
    if (mod_arg_ == nullptr) {
      mod_dtype_ = dt;
      mod_arg_ = arg;
    }
    LTX_CHECK_TYPE(dt == mod_dtype_, prefix(op_), "`", arg, "` has dtype ", t.scalar_type(), " but `", mod_arg_,
                   "` has dtype ", mod_dtype_name(), "; modulation tensors must share one dtype");
    const int64_t D = hidden_, B = batch_, S = seq_;
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

  // A [D] vector (a norm's weight or bias) on x's device, of a supported
  // dtype; the caller decides which dtypes it takes.
  ltx::RowIn vector(const char* arg, const at::Tensor& w) {
    check_same_cuda_device(op_, arg, w, x_name_, x_);
    dtype_of(op_, arg, w.scalar_type());
    LTX_CHECK(w.dim() == 1 && w.size(0) == hidden_, prefix(op_), "`", arg, "` has shape ", w.sizes(),
              " but must be [", hidden_, "] (the last dim of `", x_name_, "`)");
    return {last_dim_contiguous(w).data_ptr(), 0, 0};
  }

  // A norm's weight or bias: [D], of x's dtype or float32 (each on its own: Wan keeps its norms'
  // parameters in float32 beside bf16 activations); `f32` says which.
  ltx::RowIn affine(const char* arg, const at::Tensor& t, bool& f32) {
    const ltx::RowIn r = vector(arg, t);
    LTX_CHECK_TYPE(t.scalar_type() == x_.scalar_type() || t.scalar_type() == at::kFloat, prefix(op_), "`", arg,
                   "` has dtype ", t.scalar_type(), " but `", x_name_, "` has dtype ", x_.scalar_type(), "; `", arg,
                   "` must have the dtype of `", x_name_, "` or torch.float32");
    f32 = t.scalar_type() == at::kFloat;
    return r;
  }

  const char* op() const { return op_; }
  const char* x_name() const { return x_name_; }
  const at::Tensor& x() const { return x_; }
  int64_t batch() const { return batch_; }
  int64_t seq() const { return seq_; }
  int64_t hidden() const { return hidden_; }
  ltx::DType dtype() const { return dtype_; }
  ltx::DType mod_dtype() const { return mod_dtype_; }
  bool empty() const { return batch_ == 0 || seq_ == 0 || hidden_ == 0; }

  // Enqueue `enqueue(stream)` on x's device and current stream, unless the
  // problem is empty.
  template <typename F> void run(F&& enqueue) const {
    if (!empty()) launch(op_, x_.device(), enqueue);
  }

 private:
  void check_row_shape(const char* arg, const at::Tensor& t) {
    check_same_cuda_device(op_, arg, t, x_name_, x_);
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
    return mod_dtype_ == ltx::DType::kFloat32 ? "Float" : c10::toString(x_.scalar_type());
  }

  const char* op_;
  const char* x_name_;
  const at::Tensor& x_;
  int64_t batch_ = 0, seq_ = 0, hidden_ = 0;
  ltx::DType dtype_ = ltx::DType::kBFloat16;
  ltx::DType mod_dtype_ = ltx::DType::kBFloat16;
  const char* mod_arg_ = nullptr;
  std::deque<at::Tensor> copies_;  // a deque: references to earlier copies stay valid
};

}  // namespace ltx_check
