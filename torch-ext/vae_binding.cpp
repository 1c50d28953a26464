// Validation and dispatch for the VAE ops pixel_norm and inplace_add
// (kernel_src/vae/). Every error names the
// argument it is about; nothing is launched until all checks pass. Messages
// go through check.h (std::string only, no std::ostream). The Python API
// (ltx_kernels/vae.py) raises the same errors first.
#include <cstdint>
#include <string>
#include <utility>

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "check.h"
#include "torch_binding.h"

#include "../kernel_src/vae/inplace_add.h"
#include "../kernel_src/vae/pixel_norm.h"

namespace {

using ltx_check::check_same_cuda_device;
using ltx_check::dtype_of;
using ltx_check::prefix;

// [first, last] byte addresses `t` can touch (t non-empty).
std::pair<uintptr_t, uintptr_t> byte_span(const at::Tensor& t) {
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  const auto first = reinterpret_cast<uintptr_t>(t.data_ptr());
  return {first, first + uintptr_t((last + 1) * t.element_size()) - 1};
}

// Whether the byte spans of a and b intersect (conservative: interleaved
// views that share no element count as overlapping; they only cost a copy).
bool overlap(const at::Tensor& a, const at::Tensor& b) {
  const auto as = byte_span(a), bs = byte_span(b);
  return as.first <= bs.second && bs.first <= as.second;
}

// --- pixel_norm --------------------------------------------------------------

struct PixelNormCall {
  ltx::PixelNormArgs args;
  at::Tensor input;  // keeps a contiguous copy alive when one was needed
};

PixelNormCall check_pixel_norm(const char* op, at::Tensor& out, const at::Tensor& x, int64_t dim, double eps,
                               bool original) {
  LTX_CHECK(x.dim() >= 2, prefix(op), "`x` must have at least 2 dims ([B, C, ...]), got ", x.dim());
  const ltx::DType dt = dtype_of(op, "x", x.scalar_type());
  LTX_CHECK_TYPE(out.scalar_type() == x.scalar_type(), prefix(op), "`out` has dtype ", out.scalar_type(),
                 " but `x` has dtype ", x.scalar_type(), "; they must match");
  LTX_CHECK(out.sizes() == x.sizes(), prefix(op), "`out` has shape ", out.sizes(), " but `x` has shape ",
            x.sizes());
  LTX_CHECK_INDEX(dim >= -x.dim() && dim < x.dim(), prefix(op), "`dim` is out of range for a ", x.dim(),
                  "-d `x` (expected ", -x.dim(), "..", x.dim() - 1, "), got ", dim);
  LTX_CHECK(eps >= 0.0, prefix(op), "`eps` must be >= 0, got ", eps);
  check_same_cuda_device(op, "out", out, "x", x);

  PixelNormCall call;
  if (x.numel() == 0) return call;  // outer == 0: nothing to launch
  LTX_CHECK(out.is_contiguous(), prefix(op), "`out` must be contiguous (strides ", out.strides(), ")");
  // The kernel walks [outer, C, spatial] row-major: any other layout
  // (channels-last, a strided view) is copied once. out may be x itself
  // (each position's channels are all read before any is written); an out
  // that overlaps x otherwise reads from a copy.
  call.input = x.is_contiguous() ? x : x.contiguous();
  if (out.data_ptr() != call.input.data_ptr() && overlap(out, call.input))
    call.input = x.clone(at::MemoryFormat::Contiguous);
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  ltx::PixelNormArgs& a = call.args;
  a.out = out.data_ptr();
  a.input = call.input.data_ptr();
  a.outer = 1;
  for (int64_t i = 0; i < d; ++i) a.outer *= x.size(i);
  a.channels = x.size(d);
  a.spatial = 1;
  for (int64_t i = d + 1; i < x.dim(); ++i) a.spatial *= x.size(i);
  a.dtype = dt;
  a.eps = static_cast<float>(eps);
  a.original = original;
  return call;
}

// --- inplace_add -------------------------------------------------------------

// y reads exactly the element each thread writes: y is x, element for element.
bool same_elements(const at::Tensor& x, const at::Tensor& y_expanded) {
  if (x.data_ptr() != y_expanded.data_ptr() || x.scalar_type() != y_expanded.scalar_type()) return false;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (x.size(d) > 1 && x.stride(d) != y_expanded.stride(d)) return false;
  return true;
}

struct InplaceAddCall {
  ltx::InplaceAddArgs args;
  at::Tensor y;  // keeps a copy alive when one was needed
};

InplaceAddCall check_inplace_add(const char* op, at::Tensor& x, const at::Tensor& y) {
  const ltx::DType x_dt = dtype_of(op, "x", x.scalar_type());
  LTX_CHECK_TYPE(y.scalar_type() == x.scalar_type() || y.scalar_type() == at::kFloat, prefix(op),
                 "`y` has dtype ", y.scalar_type(), " but `x` has dtype ", x.scalar_type(),
                 "; `y` must have x's dtype or torch.float32");
  LTX_CHECK(x.dim() <= ltx::kMaxElementwiseDims, prefix(op), "`x` has ", x.dim(), " dims; at most ",
            ltx::kMaxElementwiseDims, " are supported");
  bool broadcastable = y.dim() <= x.dim();
  for (int64_t i = 1; broadcastable && i <= y.dim(); ++i) {
    const int64_t ys = y.size(-i), xs = x.size(-i);
    broadcastable = ys == xs || ys == 1;
  }
  LTX_CHECK(broadcastable, prefix(op), "`y` of shape ", y.sizes(), " cannot be broadcast to the shape of `x` ",
            x.sizes(), " (`x` itself is never broadcast)");
  for (int64_t d = 0; d < x.dim(); ++d)
    LTX_CHECK(x.size(d) <= 1 || x.stride(d) != 0, prefix(op), "`x` has internal overlap (dim ", d,
              " of size ", x.size(d), " has stride 0, e.g. from expand): more than one element would be "
              "written through the same memory location");
  check_same_cuda_device(op, "y", y, "x", x);

  InplaceAddCall call;
  call.y = y;
  if (x.numel() == 0) return call;
  const ltx::DType y_dt = y.scalar_type() == at::kFloat ? ltx::DType::kFloat32 : x_dt;
  at::Tensor y_exp = y.expand(x.sizes());
  // y overlapping x in memory (other than being x itself) would be read
  // while it is written: read it from a copy instead.
  if (!same_elements(x, y_exp) && overlap(x, y)) {
    call.y = y.clone(at::MemoryFormat::Contiguous);
    y_exp = call.y.expand(x.sizes());
  }
  ltx::InplaceAddArgs& a = call.args;
  a.x = x.data_ptr();
  a.y = y_exp.data_ptr();
  a.ndim = static_cast<int>(x.dim());
  for (int64_t d = 0; d < x.dim(); ++d) {
    a.sizes[d] = x.size(d);
    a.x_strides[d] = x.stride(d);
    a.y_strides[d] = y_exp.stride(d);
  }
  a.x_dtype = x_dt;
  a.y_dtype = y_dt;
  return call;
}

// original_rounding: the eager roundings of LTX-Video's PixelNorm in the input dtype; false:
// diffusers' RMSNorm via movedim, float32 throughout and one rounding (docs/formulas.md).
void pixel_norm(at::Tensor& out, const at::Tensor& x, int64_t dim, double eps, bool original_rounding) {
  const char* op = "pixel_norm";
  PixelNormCall call = check_pixel_norm(op, out, x, dim, eps, original_rounding);
  if (x.numel() == 0) return;
  ltx_check::launch(op, x.device(), [&](cudaStream_t stream) { return ltx::pixel_norm(call.args, stream); });
}

#ifdef LTX_KERNELS_DEV
// Which kernel a call with these arguments takes: 0 vectorized, 1 scalar fallback (tests).
int64_t pixel_norm_path(const at::Tensor& out, const at::Tensor& x, int64_t dim) {
  at::Tensor o = out;
  PixelNormCall call = check_pixel_norm("pixel_norm_path", o, x, dim, 1e-8, false);
  if (x.numel() == 0) return static_cast<int64_t>(ltx::PixelNormPath::kScalarFallback);
  return static_cast<int64_t>(ltx::pixel_norm_path(call.args));
}
#endif

void inplace_add(at::Tensor& x, const at::Tensor& y) {
  const char* op = "inplace_add";
  InplaceAddCall call = check_inplace_add(op, x, y);
  if (x.numel() == 0) return;
  ltx_check::launch(op, x.device(), [&](cudaStream_t stream) { return ltx::inplace_add(call.args, stream); });
}

#ifdef LTX_KERNELS_DEV
// Which kernel a call with these arguments takes: 0 vectorized, 1 scalar fallback (tests).
int64_t inplace_add_path(const at::Tensor& x, const at::Tensor& y) {
  at::Tensor xm = x;
  InplaceAddCall call = check_inplace_add("inplace_add_path", xm, y);
  if (x.numel() == 0) return static_cast<int64_t>(ltx::InplaceAddPath::kStrided);
  return static_cast<int64_t>(ltx::inplace_add_path(call.args));
}
#endif

}  // namespace

void register_vae(torch::Library& ops) {
  ops.def("pixel_norm(Tensor! out, Tensor x, int dim, float eps, bool original_rounding) -> ()");
  ops.def("inplace_add(Tensor(a!) x, Tensor y) -> ()");
  ltx_check::impl_cuda_and_cpu(ops, "pixel_norm", &pixel_norm);
  ltx_check::impl_cuda_and_cpu(ops, "inplace_add", &inplace_add);
#ifdef LTX_KERNELS_DEV
  ops.def("pixel_norm_path(Tensor out, Tensor x, int dim) -> int");
  ops.def("inplace_add_path(Tensor x, Tensor y) -> int");
  ltx_check::impl_cuda_and_cpu(ops, "pixel_norm_path", &pixel_norm_path);
  ltx_check::impl_cuda_and_cpu(ops, "inplace_add_path", &inplace_add_path);
#endif
}
