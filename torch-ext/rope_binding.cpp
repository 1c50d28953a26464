// Validation and dispatch for apply_rotary_emb (kernel_src/rope/).
#include <deque>

#include <ATen/ops/empty.h>

#include "check.h"
#include "torch_binding.h"

#include "../kernel_src/rope/rope.h"

namespace {

using ltx_check::prefix;

struct RopeCall {
  ltx::RopeArgs args;
  std::deque<at::Tensor> copies;  // contiguous copies kept alive until the launch
};

// A [B|1, S, D] operand with a contiguous last dim (copied once otherwise).
ltx::RopeOperand operand(const char* op, const char* arg, const at::Tensor& t, const at::Tensor& x, RopeCall& call) {
  ltx_check::check_same_cuda_device(op, arg, t, "x", x);
  LTX_CHECK(t.dim() == 3 && (t.size(0) == 1 || t.size(0) == x.size(0)) && t.size(1) == x.size(1) &&
                t.size(2) == x.size(2),
            prefix(op), "`", arg, "` has shape ", t.sizes(), " but must be [", x.size(0), " or 1, ", x.size(1), ", ",
            x.size(2), "] for `x` of shape ", x.sizes());
  const at::Tensor* r = &t;
  if (t.size(2) > 1 && t.stride(2) != 1) {
    call.copies.push_back(t.contiguous());
    r = &call.copies.back();
  }
  return {r->data_ptr(), r->size(0) == 1 ? 0 : r->stride(0), r->stride(1)};
}

RopeCall check(const char* op, const at::Tensor& out, const at::Tensor& x, const at::Tensor& cos,
               const at::Tensor& sin) {
  const ltx::DType dt = ltx_check::dtype_of(op, "x", x.scalar_type());
  LTX_CHECK(x.dim() == 3, prefix(op), "`x` must be [batch, seq, dim], got shape ", x.sizes());
  LTX_CHECK(x.size(2) % 2 == 0, prefix(op), "the last dim of `x` must be even (pairs), got ", x.size(2));
  ltx_check::check_same_cuda_device(op, "out", out, "x", x);
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"cos", cos}, {"sin", sin}})
    LTX_CHECK_TYPE(t.scalar_type() == at::kFloat, prefix(op), "`", name, "` has dtype ", t.scalar_type(),
                   "; the tables must be torch.float32 (as diffusers builds them)");
  LTX_CHECK_TYPE(out.scalar_type() == x.scalar_type(), prefix(op), "`out` has dtype ", out.scalar_type(),
                 " but `x` has dtype ", x.scalar_type());
  LTX_CHECK(out.sizes() == x.sizes(), prefix(op), "`out` has shape ", out.sizes(), " but `x` has shape ", x.sizes());
  LTX_CHECK((out.size(2) <= 1 || out.stride(2) == 1) && (out.size(1) <= 1 || out.stride(1) != 0) &&
                (out.size(0) <= 1 || out.stride(0) != 0),
            prefix(op), "`out` must have a contiguous last dim and no internal overlap (strides ", out.strides(), ")");
  RopeCall call;
  ltx::RopeArgs& a = call.args;
  a.x = operand(op, "x", x, x, call);
  a.cos = operand(op, "cos", cos, x, call);
  a.sin = operand(op, "sin", sin, x, call);
  a.out = out.data_ptr();
  a.out_batch_stride = out.stride(0);
  a.out_seq_stride = out.stride(1);
  a.batch = x.size(0);
  a.seq = x.size(1);
  a.dim = x.size(2);
  a.dtype = dt;
  return call;
}

// out = x rotated by the interleaved pairs (2i, 2i+1) with float32 cos/sin tables (LTX-Video).
void apply_rotary_emb(at::Tensor& out, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const char* op = "apply_rotary_emb";
  RopeCall call = check(op, out, x, cos, sin);
  if (x.numel() == 0) return;
  ltx_check::launch(op, x.device(), [&](cudaStream_t stream) { return ltx::apply_rotary_emb(call.args, stream); });
}

// The functional pair autograd uses (ltx_kernels/rope.py registers the backward): a new
// contiguous output, the tables treated as constants.
at::Tensor apply_rotary_emb_fwd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const char* op = "apply_rotary_emb";
  at::Tensor out = at::empty(x.sizes(), x.options());
  RopeCall call = check(op, out, x, cos, sin);
  if (x.numel() == 0) return out;
  ltx_check::launch(op, x.device(), [&](cudaStream_t stream) { return ltx::apply_rotary_emb(call.args, stream); });
  return out;
}

// grad_x = the transposed rotation of grad_out (kernel_src/rope/rope.h), grad_out of x's dtype.
at::Tensor apply_rotary_emb_bwd(const at::Tensor& grad_out, const at::Tensor& cos, const at::Tensor& sin) {
  const char* op = "apply_rotary_emb_bwd";
  at::Tensor grad_x = at::empty(grad_out.sizes(), grad_out.options());
  RopeCall call = check(op, grad_x, grad_out, cos, sin);
  call.args.transpose = true;
  if (grad_out.numel() == 0) return grad_x;
  ltx_check::launch(op, grad_out.device(),
                    [&](cudaStream_t stream) { return ltx::apply_rotary_emb(call.args, stream); });
  return grad_x;
}

#ifdef LTX_KERNELS_DEV
// Which kernel a call with these arguments takes: 0 vectorized, 1 scalar fallback (tests).
int64_t rope_path(const at::Tensor& out, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return static_cast<int64_t>(ltx::rope_path(check("rope_path", out, x, cos, sin).args));
}
#endif

}  // namespace

void register_rope(torch::Library& ops) {
  ops.def("apply_rotary_emb(Tensor(a!) out, Tensor x, Tensor cos, Tensor sin) -> ()");
  ltx_check::impl_cuda_and_cpu(ops, "apply_rotary_emb", &apply_rotary_emb);
  // The functional pair autograd uses (ltx_kernels/rope.py): grads for x only.
  ops.def("apply_rotary_emb_fwd(Tensor x, Tensor cos, Tensor sin) -> Tensor");
  ltx_check::impl_cuda_and_cpu(ops, "apply_rotary_emb_fwd", &apply_rotary_emb_fwd);
  ops.def("apply_rotary_emb_bwd(Tensor grad_out, Tensor cos, Tensor sin) -> Tensor");
  ltx_check::impl_cuda_and_cpu(ops, "apply_rotary_emb_bwd", &apply_rotary_emb_bwd);
#ifdef LTX_KERNELS_DEV
  ops.def("rope_path(Tensor out, Tensor x, Tensor cos, Tensor sin) -> int");
  ltx_check::impl_cuda_and_cpu(ops, "rope_path", &rope_path);
#endif
}
