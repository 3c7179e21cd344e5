// The public API of libhybridnn in one include.
#pragma once

#include "hybridnn/comm.h"
#include "hybridnn/device.h"
#include "hybridnn/driver.h"
#include "hybridnn/error.h"
#include "hybridnn/layer.h"
#include "hybridnn/layers.h"
#include "hybridnn/memory.h"
#include "hybridnn/net.h"
#include "hybridnn/runtime.h"
#include "hybridnn/shapes.h"
#include "hybridnn/solver.h"
#include "hybridnn/split.h"
#include "hybridnn/tensor.h"
#include "hybridnn/version.h"
