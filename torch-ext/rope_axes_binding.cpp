// Validation and dispatch for rope_3d and rope_1d (kernel_src/rope_axes/). Shapes, dtypes and layouts are
// checked before the device, so every argument error can be raised (and
// tested) with CPU tensors; nothing is launched until all checks pass.
#include <algorithm>
#include <array>
#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ops/empty.h>

#include "check.h"
#include "torch_binding.h"

#include "../kernel_src/rope_axes/rope_axes.h"

namespace {

using ltx_check::prefix;

// Wan's split of the head dim into (time, height, width) channels:
// h = w = 2 * (head_dim / 6), time takes the rest (128 -> 44/42/42).
std::array<int64_t, 3> wan_split(int64_t head_dim) {
  const int64_t hw = 2 * (head_dim / 6);
  return {head_dim - 2 * hw, hw, hw};
}

// Sufficient condition for no two indices sharing an element: taking the dims
// of size > 1 by increasing stride, each stride reaches past everything the
// smaller ones span. Views made by slicing, select, unbind, transpose or
// permute of a dense tensor pass; expand (stride 0) does not.
bool nested_strides(const at::Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;  // elements covered by the dims seen so far (max offset + 1)
  for (const auto& [stride, size] : dims) {
    if (stride < span) return false;
    span += (size - 1) * stride;
  }
  return true;
}

void check_layout(const char* op, const char* arg, const at::Tensor& t) {
  if (t.numel() == 0) return;
  LTX_CHECK(t.stride(3) == 1, prefix(op), "`", arg, "` must have a contiguous last dim (stride 1), got strides ",
            t.strides(), " for shape ", t.sizes(),
            "; rotate a .contiguous() copy and copy it back (the op works in place)");
  LTX_CHECK(nested_strides(t), prefix(op), "`", arg, "` has overlapping elements or an interleaved layout (shape ",
            t.sizes(), ", strides ", t.strides(), "): rotating it in place could write an element twice");
}

int64_t floor_div(int64_t a, int64_t b) { return a / b - (a % b != 0 && (a < 0) != (b < 0)); }

// Some sum of c_i * stride_i over dims[i..] equals delta, with c_i in
// [-(key_size - 1), query_size - 1]. With nested strides the remainder left
// for the smaller dims is below the current stride in magnitude, so only
// floor(delta / stride) and the next integer can work at each dim.
bool reachable(int64_t delta, const std::vector<std::array<int64_t, 3>>& dims, size_t i) {
  if (i == dims.size()) return delta == 0;
  const auto& [stride, nq, nk] = dims[i];
  const int64_t c0 = floor_div(delta, stride);
  for (int64_t c = c0; c <= c0 + 1; ++c)
    if (c > -nk && c < nq && reachable(delta - c * stride, dims, i + 1)) return true;
  return false;
}

int64_t byte_end(const at::Tensor& t) {
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return (last + 1) * int64_t(t.element_size());
}

// query and key share no element. Views of one fused qkv tensor (the same
// strides, different offsets) are decided exactly; other layouts whose byte
// ranges intersect count as overlapping.
bool disjoint(const at::Tensor& q, const at::Tensor& k) {
  if (q.numel() == 0 || k.numel() == 0) return true;
  const auto qb = reinterpret_cast<intptr_t>(q.data_ptr()), kb = reinterpret_cast<intptr_t>(k.data_ptr());
  if (qb + byte_end(q) <= kb || kb + byte_end(k) <= qb) return true;
  const int64_t delta_bytes = int64_t(kb - qb), elem = int64_t(q.element_size());
  if (delta_bytes % elem != 0) return false;
  std::vector<std::array<int64_t, 3>> dims;  // (stride, query size, key size), dims of size > 1 in either
  for (int64_t d = 0; d < q.dim(); ++d) {
    const int64_t nq = q.size(d), nk = k.size(d);
    if (nq > 1 && nk > 1 && q.stride(d) != k.stride(d)) return false;
    if (nq > 1 || nk > 1) dims.push_back({nq > 1 ? q.stride(d) : k.stride(d), nq, nk});
  }
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;
  for (const auto& [stride, nq, nk] : dims) {
    if (stride < span) return false;
    span += (std::max(nq, nk) - 1) * stride;
  }
  std::reverse(dims.begin(), dims.end());
  return !reachable(delta_bytes / elem, dims, 0);
}

ltx::RopeAxesOperand operand(const at::Tensor& t) {
  // Strides of size-1 dims are never used; 0 keeps them out of the alignment test.
  const auto stride = [&](int64_t d) { return t.size(d) > 1 ? t.stride(d) : 0; };
  return {t.numel() ? t.data_ptr() : nullptr, t.size(2), stride(0), stride(1), stride(2)};
}

// Validate and describe a call; grid = (frames, height, width) for rope_3d,
// (seq, 1, 1) for rope_1d, and split the channels of each axis.
// in_place: query and key are written, so they must not overlap (themselves or each other);
// the functional op only reads them.
ltx::RopeAxesArgs check(const char* op, const at::Tensor& query, const at::Tensor& key, bool three_d,
                        int64_t frames, int64_t height, int64_t width, double theta_base, bool in_place = true) {
  const ltx::DType dt = ltx_check::dtype_of(op, "query", query.scalar_type());
  ltx_check::dtype_of(op, "key", key.scalar_type());
  LTX_CHECK_TYPE(key.scalar_type() == query.scalar_type(), prefix(op), "`key` has dtype ", key.scalar_type(),
                 " but `query` has dtype ", query.scalar_type(), "; they must match");
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"query", query}, {"key", key}})
    LTX_CHECK(t.dim() == 4, prefix(op), "`", name, "` must be [batch, seq, heads, head_dim], got shape ",
              t.sizes());
  LTX_CHECK(key.size(0) == query.size(0) && key.size(1) == query.size(1) && key.size(3) == query.size(3),
            prefix(op), "`key` has shape ", key.sizes(), " but `query` has shape ", query.sizes(),
            "; batch, seq and head_dim must match (the head counts may differ)");
  const int64_t batch = query.size(0), seq = query.size(1), head_dim = query.size(3);
  LTX_CHECK(head_dim % 2 == 0, prefix(op), "the head_dim of `query` and `key` must be even (interleaved pairs), got ",
            head_dim);
  LTX_CHECK(head_dim <= 2 * ltx::kRopeAxesMaxPairs, prefix(op), "the head_dim of `query` and `key` must be at most ",
            2 * ltx::kRopeAxesMaxPairs, ", got ", head_dim);
  const int64_t max_pos = ltx::kRopeAxesMaxPosition;
  if (three_d) {
    for (const auto& [name, n] : {std::pair<const char*, int64_t>{"num_frames", frames}, {"height", height},
                                  {"width", width}})
      LTX_CHECK(n >= 0 && n <= max_pos, prefix(op), "`", name, "` must be in [0, 2^24] (positions exact in "
                "float32), got ", n);
    const int64_t plane = height * width;  // <= 2^48
    LTX_CHECK(plane == 0 ? seq == 0 : seq % plane == 0 && seq / plane == frames, prefix(op),
              "`num_frames` * `height` * `width` (", frames, " * ", height, " * ", width,
              ") must equal the seq dim of `query` and `key`, ", seq);
  } else {
    LTX_CHECK(seq <= max_pos, prefix(op),
              "the seq dim of `query` and `key` must be at most 2^24 (positions exact in float32), got ", seq);
    frames = seq;
    height = width = 1;
  }
  LTX_CHECK(std::isfinite(theta_base) && theta_base > 0, prefix(op), "`theta_base` must be finite and > 0, got ",
            theta_base);
  if (in_place) {
    check_layout(op, "query", query);
    check_layout(op, "key", key);
    LTX_CHECK(disjoint(query, key), prefix(op), "`query` and `key` overlap in memory; both are rotated in place, "
              "so they must share no element (disjoint views of one fused qkv tensor are fine)");
  }
  ltx_check::check_same_cuda_device(op, "key", key, "query", query);

  ltx::RopeAxesArgs a;
  a.query = operand(query);
  a.key = operand(key);
  a.batch = batch;
  a.seq = seq;
  a.head_dim = head_dim;
  a.frames = frames;
  a.height = height;
  a.width = width;
  const std::array<int64_t, 3> split = three_d ? wan_split(head_dim) : std::array<int64_t, 3>{head_dim, 0, 0};
  std::copy(split.begin(), split.end(), a.split);
  a.theta_base = theta_base;
  a.dtype = dt;
  return a;
}

void run(const char* op, const at::Tensor& query, const at::Tensor& key, const ltx::RopeAxesArgs& a) {
  if (query.numel() == 0 && key.numel() == 0) return;
  ltx_check::launch(op, query.device(), [&](cudaStream_t stream) { return ltx::rope_axes(a, stream); });
}

void rope_3d(at::Tensor& query, at::Tensor& key, int64_t num_frames, int64_t height, int64_t width,
             double theta_base) {
  const char* op = "rope_3d";
  run(op, query, key, check(op, query, key, true, num_frames, height, width, theta_base));
}

void rope_1d(at::Tensor& query, at::Tensor& key, double theta_base) {
  const char* op = "rope_1d";
  run(op, query, key, check(op, query, key, false, 0, 1, 1, theta_base));
}

// `t` when its last dim is contiguous (any other strides, 0 included, are read as they are),
// else a contiguous copy: autograd's grads may be expanded.
at::Tensor readable(const at::Tensor& t) {
  return t.dim() == 4 && t.size(3) > 1 && t.stride(3) != 1 ? t.contiguous() : t;
}

// `in` as the source of an out-of-place call (strides of size-1 dims unused: 0).
ltx::RopeAxesSource source(const at::Tensor& in) {
  const auto stride = [&](int64_t d) { return in.size(d) > 1 ? in.stride(d) : 0; };
  return {in.numel() ? in.data_ptr() : nullptr, stride(0), stride(1), stride(2)};
}

// The functional op autograd uses (ltx_kernels/rope_axes.py): new rotated query and key;
// inverse turns by -angle (the backward, and the backward's backward turns back).
std::tuple<at::Tensor, at::Tensor> rope_axes_fwd(const at::Tensor& query_in, const at::Tensor& key_in,
                                                int64_t num_frames, int64_t height, int64_t width,
                                                double theta_base, bool three_d, bool inverse) {
  const char* op = three_d ? "rope_3d" : "rope_1d";
  const at::Tensor query = readable(query_in), key = readable(key_in);
  ltx::RopeAxesArgs a = check(op, query, key, three_d, num_frames, height, width, theta_base, false);
  at::Tensor q_out = at::empty(query.sizes(), query.options()), k_out = at::empty(key.sizes(), key.options());
  a.query = operand(q_out);
  a.key = operand(k_out);
  a.query_src = source(query);
  a.key_src = source(key);
  a.inverse = inverse;
  run(op, query, key, a);
  return {q_out, k_out};
}

#ifdef LTX_KERNELS_DEV
// Which kernel a call with these arguments takes: 0 vectorized, 1 scalar fallback (tests).
int64_t rope_axes_path(const at::Tensor& query, const at::Tensor& key) {
  return static_cast<int64_t>(ltx::rope_axes_path(check("rope_axes_path", query, key, false, 0, 1, 1, 10000.0)));
}
#endif

}  // namespace

void register_rope_axes(torch::Library& ops) {
  ops.def("rope_3d(Tensor(a!) query, Tensor(b!) key, int num_frames, int height, int width, float theta_base) -> ()");
  ops.def("rope_1d(Tensor(a!) query, Tensor(b!) key, float theta_base) -> ()");
  ltx_check::impl_cuda_and_cpu(ops, "rope_3d", &rope_3d);
  ltx_check::impl_cuda_and_cpu(ops, "rope_1d", &rope_1d);
  // The functional op autograd uses: three_d false is rope_1d (the grid arguments unused).
  ops.def("rope_axes_fwd(Tensor query, Tensor key, int num_frames, int height, int width, float theta_base, "
          "bool three_d, bool inverse) -> (Tensor, Tensor)");
  ltx_check::impl_cuda_and_cpu(ops, "rope_axes_fwd", &rope_axes_fwd);
#ifdef LTX_KERNELS_DEV
  ops.def("rope_axes_path(Tensor query, Tensor key) -> int");
  ltx_check::impl_cuda_and_cpu(ops, "rope_axes_path", &rope_axes_path);
#endif
}
