// Validation and dispatch for qk_rmsnorm_rope (kernel_src/qk_rmsnorm_rope/).
#include <deque>
#include <tuple>
#include <string_view>
#include <utility>

#include <ATen/ops/empty.h>

#include "check.h"
#include "torch_binding.h"

#include "../kernel_src/qk_rmsnorm_rope/qk_rmsnorm_rope.h"

namespace {

using ltx_check::prefix;

struct QkCall {
  ltx::QkRmsnormRopeArgs args;
  std::deque<at::Tensor> copies;  // contiguous copies kept alive until the launch

  // `t` itself when its last dim is contiguous, else a contiguous copy.
  const at::Tensor& last_dim_contiguous(const at::Tensor& t) {
    if (t.size(-1) <= 1 || t.stride(-1) == 1) return t;
    copies.push_back(t.contiguous());
    return copies.back();
  }
};

constexpr const char* kOp = "qk_rmsnorm_rope";

void check_output(const char* op, const char* arg, const at::Tensor& out, const char* in_arg, const at::Tensor& in) {
  ltx_check::check_same_cuda_device(op, arg, out, in_arg, in);
  LTX_CHECK_TYPE(out.scalar_type() == in.scalar_type(), prefix(op), "`", arg, "` has dtype ", out.scalar_type(),
                 " but `", in_arg, "` has dtype ", in.scalar_type());
  LTX_CHECK(out.sizes() == in.sizes(), prefix(op), "`", arg, "` has shape ", out.sizes(), " but `", in_arg,
            "` has shape ", in.sizes());
  LTX_CHECK((out.size(2) <= 1 || out.stride(2) == 1) && (out.size(1) <= 1 || out.stride(1) != 0) &&
                (out.size(0) <= 1 || out.stride(0) != 0),
            prefix(op), "`", arg, "` must have a contiguous last dim and no internal overlap (strides ", out.strides(),
            ")");
}

const void* weight_ptr(const char* op, const char* arg, const c10::optional<at::Tensor>& w, const at::Tensor& q,
                       int64_t head_dim, QkCall& call) {
  if (!w.has_value()) return nullptr;
  ltx_check::check_same_cuda_device(op, arg, *w, "q", q);
  LTX_CHECK(w->dim() == 1 && w->size(0) == head_dim, prefix(op), "`", arg, "` has shape ", w->sizes(),
            " but must be [", head_dim, "] (the size of one norm group: head_dim, or the whole last dim)");
  LTX_CHECK_TYPE(w->scalar_type() == q.scalar_type() || w->scalar_type() == at::kFloat, prefix(op), "`", arg,
                 "` has dtype ", w->scalar_type(), "; it must be `q`'s dtype (", q.scalar_type(), ") or torch.float32");
  return call.last_dim_contiguous(*w).data_ptr();
}

ltx::QkTable table(const char* op, const char* arg, const at::Tensor& t, const at::Tensor& q, int64_t head_dim,
                   QkCall& call) {
  ltx_check::check_same_cuda_device(op, arg, t, "q", q);
  LTX_CHECK_TYPE(t.scalar_type() == at::kFloat, prefix(op), "`", arg, "` has dtype ", t.scalar_type(),
                 "; the RoPE tables must be torch.float32");
  LTX_CHECK(t.dim() == 3 && (t.size(0) == 1 || t.size(0) == q.size(0)) && t.size(1) == q.size(1) &&
                ltx::qk_table_dim_ok(q.size(2), head_dim, t.size(2)),
            prefix(op), "`", arg, "` has shape ", t.sizes(), " but must be [", q.size(0), " or 1, ", q.size(1), ", ",
            q.size(2), " or head_dim ", head_dim,
            head_dim == q.size(2) ? " or an even divisor of it (tables repeated along the row)" : "",
            "] for `q` of shape ", q.sizes());
  const at::Tensor& c = call.last_dim_contiguous(t);
  return {c.data_ptr<float>(), c.size(0) == 1 ? 0 : c.stride(0), c.stride(1)};
}

ltx::QkOperand operand(const char* op, const char* in_arg, const at::Tensor& in, const char* out_arg, const at::Tensor& out,
                       const char* weight_arg, const c10::optional<at::Tensor>& weight, const at::Tensor& q,
                       int64_t head_dim, QkCall& call) {
  check_output(op, out_arg, out, in_arg, in);
  const at::Tensor& c = call.last_dim_contiguous(in);
  return {c.data_ptr(), out.data_ptr(), c.stride(0), c.stride(1), out.stride(0), out.stride(1),
          weight_ptr(op, weight_arg, weight, q, head_dim, call)};
}

QkCall check(const char* op, const at::Tensor& q_out, const at::Tensor& k_out, const at::Tensor& q, const at::Tensor& k,
             const c10::optional<at::Tensor>& q_weight, const c10::optional<at::Tensor>& k_weight,
             const at::Tensor& cos, const at::Tensor& sin, int64_t head_dim, double eps, std::string_view rotation,
             bool diffusers_rounding, bool exact_mode) {
  const ltx::DType dt = ltx_check::dtype_of(op, "q", q.scalar_type());
  LTX_CHECK(q.dim() == 3, prefix(op), "`q` must be [batch, seq, dim], got shape ", q.sizes());
  ltx_check::check_same_cuda_device(op, "k", k, "q", q);
  LTX_CHECK_TYPE(k.scalar_type() == q.scalar_type(), prefix(op), "`k` has dtype ", k.scalar_type(), " but `q` has ",
                 q.scalar_type());
  LTX_CHECK(k.sizes() == q.sizes(), prefix(op), "`k` has shape ", k.sizes(), " but `q` has shape ", q.sizes());
  LTX_CHECK(head_dim > 0 && head_dim % 2 == 0 && q.size(2) % head_dim == 0, prefix(op), "`head_dim` is ", head_dim,
            "; it must be even and divide the last dim of `q` (", q.size(2), ")");
  LTX_CHECK(eps >= 0, prefix(op), "`eps` must be >= 0, got ", eps);
  LTX_CHECK(rotation == "interleaved" || rotation == "half", prefix(op),
            "`rotation` must be 'interleaved' or 'half', got '", std::string(rotation), "'");
  LTX_CHECK(q_out.data_ptr() != k_out.data_ptr() || q.numel() == 0, prefix(op),
            "`q_out` and `k_out` are the same memory");
  const bool w_float = (q_weight && q_weight->scalar_type() == at::kFloat) ||
                       (k_weight && k_weight->scalar_type() == at::kFloat);
  if (q_weight && k_weight)
    LTX_CHECK_TYPE(q_weight->scalar_type() == k_weight->scalar_type(), prefix(op), "`q_weight` has dtype ",
                   q_weight->scalar_type(), " but `k_weight` has dtype ", k_weight->scalar_type());
  LTX_CHECK_TYPE(!(diffusers_rounding && w_float && q.scalar_type() != at::kFloat), prefix(op),
                 "diffusers rounding with a float32 weight on ", q.scalar_type(),
                 " input returns float32 in diffusers; cast the weight to the input dtype or use rounding='torch'");

  QkCall call;
  ltx::QkRmsnormRopeArgs& a = call.args;
  a.q = operand(op, "q", q, "q_out", q_out, "q_weight", q_weight, q, head_dim, call);
  a.k = operand(op, "k", k, "k_out", k_out, "k_weight", k_weight, q, head_dim, call);
  a.cos = table(op, "cos", cos, q, head_dim, call);
  a.sin = table(op, "sin", sin, q, head_dim, call);
  LTX_CHECK(cos.sizes() == sin.sizes(), prefix(op), "`cos` has shape ", cos.sizes(), " but `sin` has shape ",
            sin.sizes());
  a.batch = q.size(0);
  a.seq = q.size(1);
  a.dim = q.size(2);
  a.head_dim = head_dim;
  a.table_dim = cos.size(2);
  a.eps = static_cast<float>(eps);
  a.dtype = dt;
  a.weight_is_float = w_float;
  a.rotation = rotation == "half" ? ltx::Rotation::kHalf : ltx::Rotation::kInterleaved;
  a.round_before_weight = diffusers_rounding;
  a.round_normalized = exact_mode;
  return call;
}

// rotation: "interleaved" (pairs 2i, 2i+1) or "half" (i, i + head_dim/2); diffusers_rounding: the
// normalised value is rounded before a half-precision weight multiply (behaviour "A"); exact_mode:
// the normalised value is rounded to the input dtype before the rotation, as the eager chain does.
void qk_rmsnorm_rope(at::Tensor& q_out, at::Tensor& k_out, const at::Tensor& q, const at::Tensor& k,
                     const c10::optional<at::Tensor>& q_weight, const c10::optional<at::Tensor>& k_weight,
                     const at::Tensor& cos, const at::Tensor& sin, int64_t head_dim, double eps,
                     c10::string_view rotation, bool diffusers_rounding, bool exact_mode) {
  QkCall call = check(kOp, q_out, k_out, q, k, q_weight, k_weight, cos, sin, head_dim, eps,
                      std::string_view(rotation.data(), rotation.size()), diffusers_rounding, exact_mode);
  if (q.numel() == 0) return;
  ltx_check::launch(kOp, q.device(), [&](cudaStream_t stream) { return ltx::qk_rmsnorm_rope(call.args, stream); });
}

// The functional forward autograd uses (ltx_kernels/qk_rmsnorm_rope.py): new contiguous outputs,
// the same kernels as the out-variant op. q and k are [B, S, D].
std::tuple<at::Tensor, at::Tensor> qk_rmsnorm_rope_fwd(const at::Tensor& q, const at::Tensor& k,
                                                       const c10::optional<at::Tensor>& q_weight,
                                                       const c10::optional<at::Tensor>& k_weight,
                                                       const at::Tensor& cos, const at::Tensor& sin, int64_t head_dim,
                                                       double eps, c10::string_view rotation,
                                                       bool diffusers_rounding, bool exact_mode) {
  at::Tensor q_out = at::empty(q.sizes(), q.options()), k_out = at::empty(k.sizes(), k.options());
  qk_rmsnorm_rope(q_out, k_out, q, k, q_weight, k_weight, cos, sin, head_dim, eps, rotation, diffusers_rounding,
                  exact_mode);
  return {q_out, k_out};
}

// Backward of qk_rmsnorm_rope_fwd (formulas in kernel_src/qk_rmsnorm_rope/qk_rmsnorm_rope.h): grads of q
// and k always, of each weight (its dtype) when it exists and *_weight_requires_grad.
std::tuple<at::Tensor, at::Tensor, c10::optional<at::Tensor>, c10::optional<at::Tensor>> qk_rmsnorm_rope_bwd(
    const at::Tensor& grad_q, const at::Tensor& grad_k, const at::Tensor& q, const at::Tensor& k,
    const c10::optional<at::Tensor>& q_weight, const c10::optional<at::Tensor>& k_weight, const at::Tensor& cos,
    const at::Tensor& sin, int64_t head_dim, double eps, c10::string_view rotation, bool diffusers_rounding,
    bool q_weight_requires_grad, bool k_weight_requires_grad) {
  const char* op = "qk_rmsnorm_rope_bwd";
  at::Tensor dq = at::empty(q.sizes(), q.options()), dk = at::empty(k.sizes(), k.options());
  // The forward's checks on its arguments (dq, dk stand for its outputs).
  QkCall call = check(op, dq, dk, q, k, q_weight, k_weight, cos, sin, head_dim, eps,
                      std::string_view(rotation.data(), rotation.size()), diffusers_rounding, true);
  LTX_CHECK(!q_weight_requires_grad || q_weight.has_value(), prefix(op),
            "`q_weight_requires_grad` is true but there is no `q_weight`");
  LTX_CHECK(!k_weight_requires_grad || k_weight.has_value(), prefix(op),
            "`k_weight_requires_grad` is true but there is no `k_weight`");
  for (const auto& [name, g, x] : {std::tuple<const char*, const at::Tensor&, const at::Tensor&>{"grad_q", grad_q, q},
                                   {"grad_k", grad_k, k}}) {
    ltx_check::check_same_cuda_device(op, name, g, "q", q);
    LTX_CHECK_TYPE(g.scalar_type() == x.scalar_type(), prefix(op), "`", name, "` has dtype ", g.scalar_type(),
                   " but the input has dtype ", x.scalar_type());
    LTX_CHECK(g.sizes() == x.sizes(), prefix(op), "`", name, "` has shape ", g.sizes(), " but the input has shape ",
              x.sizes());
  }
  const ltx::QkRmsnormRopeArgs& f = call.args;
  ltx::QkRmsnormRopeBwdArgs a;  // sizes, dtype and form first: they give the workspace
  a.batch = f.batch;
  a.seq = f.seq;
  a.dim = f.dim;
  a.head_dim = f.head_dim;
  a.table_dim = f.table_dim;
  a.dtype = f.dtype;
  a.rotation = f.rotation;
  const int64_t workspace = ltx::qk_rmsnorm_rope_bwd_workspace(a);
  c10::optional<at::Tensor> dwq, dwk;
  at::Tensor partials_q, partials_k;
  if (q_weight_requires_grad) {
    dwq = at::empty({head_dim}, q_weight->options());
    partials_q = at::empty({workspace}, q.options().dtype(at::kFloat));
  }
  if (k_weight_requires_grad) {
    dwk = at::empty({head_dim}, k_weight->options());
    partials_k = at::empty({workspace}, q.options().dtype(at::kFloat));
  }
  if (q.numel() == 0) {
    for (auto* dw : {&dwq, &dwk})
      if (dw->has_value()) (*dw)->zero_();  // a sum over no rows
    return {dq, dk, dwq, dwk};
  }
  const auto bwd_operand = [&](const ltx::QkOperand& fo, const at::Tensor& g, const at::Tensor& dx,
                               const at::Tensor& partials, const c10::optional<at::Tensor>& dw) {
    const at::Tensor& gc = call.last_dim_contiguous(g);
    ltx::QkBwdOperand o;
    o.x = fo.in;
    o.x_batch_stride = fo.in_batch_stride;
    o.x_seq_stride = fo.in_seq_stride;
    o.dy = gc.data_ptr();
    o.dy_batch_stride = gc.stride(0);
    o.dy_seq_stride = gc.stride(1);
    o.dx = dx.data_ptr();
    o.dx_batch_stride = dx.stride(0);
    o.dx_seq_stride = dx.stride(1);
    o.weight = fo.weight;
    o.partials = dw.has_value() ? partials.data_ptr<float>() : nullptr;
    o.grad_weight = dw.has_value() ? dw->data_ptr() : nullptr;
    return o;
  };
  a.q = bwd_operand(f.q, grad_q, dq, partials_q, dwq);
  a.k = bwd_operand(f.k, grad_k, dk, partials_k, dwk);
  a.cos = f.cos;
  a.sin = f.sin;
  a.eps = f.eps;
  a.weight_is_float = f.weight_is_float;
  a.round_before_weight = f.round_before_weight;
  ltx_check::launch(op, q.device(), [&](cudaStream_t stream) { return ltx::qk_rmsnorm_rope_bwd(a, stream); });
  return {dq, dk, dwq, dwk};
}

#ifdef LTX_KERNELS_DEV
// Which kernel a call with these arguments takes: 0 vectorized, 1 scalar fallback (tests).
int64_t qk_rmsnorm_rope_path(const at::Tensor& q_out, const at::Tensor& k_out, const at::Tensor& q,
                             const at::Tensor& k, const c10::optional<at::Tensor>& q_weight,
                             const c10::optional<at::Tensor>& k_weight, const at::Tensor& cos, const at::Tensor& sin,
                             int64_t head_dim, c10::string_view rotation) {
  QkCall call = check("qk_rmsnorm_rope_path", q_out, k_out, q, k, q_weight, k_weight, cos, sin, head_dim, 1e-5,
                      std::string_view(rotation.data(), rotation.size()), false, true);
  return static_cast<int64_t>(ltx::qk_rmsnorm_rope_path(call.args));
}
#endif

}  // namespace

void register_qk_rmsnorm_rope(torch::Library& ops) {
  ops.def(
      "qk_rmsnorm_rope(Tensor(a!) q_out, Tensor(b!) k_out, Tensor q, Tensor k, Tensor? q_weight, "
      "Tensor? k_weight, Tensor cos, Tensor sin, int head_dim, float eps, str rotation, bool diffusers_rounding, "
      "bool exact_mode) -> ()");
  ltx_check::impl_cuda_and_cpu(ops, "qk_rmsnorm_rope", &qk_rmsnorm_rope);
  // The functional pair autograd uses (ltx_kernels/qk_rmsnorm_rope.py): grads for q, k and the
  // weights; the tables are constants.
  ops.def(
      "qk_rmsnorm_rope_fwd(Tensor q, Tensor k, Tensor? q_weight, Tensor? k_weight, Tensor cos, Tensor sin, "
      "int head_dim, float eps, str rotation, bool diffusers_rounding, bool exact_mode) -> (Tensor q_out, "
      "Tensor k_out)");
  ltx_check::impl_cuda_and_cpu(ops, "qk_rmsnorm_rope_fwd", &qk_rmsnorm_rope_fwd);
  ops.def(
      "qk_rmsnorm_rope_bwd(Tensor grad_q, Tensor grad_k, Tensor q, Tensor k, Tensor? q_weight, Tensor? k_weight, "
      "Tensor cos, Tensor sin, int head_dim, float eps, str rotation, bool diffusers_rounding, "
      "bool q_weight_requires_grad, bool k_weight_requires_grad) -> (Tensor grad_q, Tensor grad_k, "
      "Tensor? grad_q_weight, Tensor? grad_k_weight)");
  ltx_check::impl_cuda_and_cpu(ops, "qk_rmsnorm_rope_bwd", &qk_rmsnorm_rope_bwd);
#ifdef LTX_KERNELS_DEV
  ops.def(
      "qk_rmsnorm_rope_path(Tensor q_out, Tensor k_out, Tensor q, Tensor k, Tensor? q_weight, Tensor? k_weight, "
      "Tensor cos, Tensor sin, int head_dim, str rotation) -> int");
  ltx_check::impl_cuda_and_cpu(ops, "qk_rmsnorm_rope_path", &qk_rmsnorm_rope_path);
#endif
}
