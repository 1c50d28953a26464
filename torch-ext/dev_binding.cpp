// Development builds only (`ltx-build build --dev`): the op that sets the
// launch-choice overrides of kernel_src/common/tuning.h, for A/B benchmarks
// and the tests that force one path. Release builds register nothing here.
#ifdef LTX_KERNELS_DEV
#include <string>
#include <vector>

#include "check.h"
#include "torch_binding.h"

#include "../kernel_src/common/tuning.h"

namespace {

using ltx::tuning::Knob;

// value -1 clears the override (the table's choice again).
void set_tuning(c10::string_view knob, int64_t value) {
  const std::string name(knob.data(), knob.size());
  const Knob k = ltx::tuning::knob_named(name.c_str());
  std::string known;
  for (const char* n : ltx::tuning::kKnobNames) known += std::string(known.empty() ? "" : ", ") + n;
  LTX_CHECK(k != Knob::kCount, ltx_check::prefix("set_tuning"), "unknown knob '", name, "'; knobs: ", known);
  LTX_CHECK(value >= -1, ltx_check::prefix("set_tuning"), "`value` must be >= 0, or -1 to clear, got ", value);
  ltx::tuning::set_override(k, static_cast<int>(value));
}

std::vector<std::string> tuning_knobs() { return {std::begin(ltx::tuning::kKnobNames), std::end(ltx::tuning::kKnobNames)}; }

}  // namespace

void register_dev(torch::Library& ops) {
  ops.def("set_tuning(str knob, int value) -> ()", &set_tuning);
  ops.def("tuning_knobs() -> str[]", &tuning_knobs);
}
#endif
