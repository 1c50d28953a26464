#include "rope_axes_binding.h"

void register_rope_axes_ops(torch::Library& ops) { (void)ops; }
