#include "qk_norm_rope_binding.h"

void register_qk_norm_rope_ops(torch::Library& ops) { (void)ops; }
