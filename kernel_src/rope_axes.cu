#include "rope_axes.h"
