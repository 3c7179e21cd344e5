// The library's C++ API in one include: what the tools, benchmarks and tests build on (no
// ABI is promised for it; programs that embed the library use the C ABI or the header-only
// hybridnn.hpp over it, include/hybridnn/). Besides the classes it holds the few helpers
// the tools share with the library: comma lists (text.h), dataset conversion (convert.h)
// and the data-parallel gradient sync that `time` reports on (gradient_sync.h). Other
// headers under lib/ are their component's own (scripts/check_layering.py keeps the tools
// to this one).
#pragma once

#include "hybridnn/error.h"
#include "lib/comm/comm.h"
#include "lib/core/device.h"
#include "lib/core/driver.h"
#include "lib/core/driver_registry.h"
#include "lib/core/memory.h"
#include "lib/core/runtime.h"
#include "lib/core/shapes.h"
#include "lib/core/tensor.h"
#include "lib/core/text.h"
#include "lib/core/version.h"
#include "lib/data/convert.h"
#include "lib/drivers/builtin.h"
#include "lib/layers/layer.h"
#include "lib/layers/layers.h"
#include "lib/net/net.h"
#include "lib/onnx/onnx_convert.h"
#include "lib/scheduler/split.h"
#include "lib/solver/gradient_sync.h"
#include "lib/solver/options.h"
#include "lib/solver/solver.h"
