#include "qk_norm_rope.h"
