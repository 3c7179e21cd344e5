// Every layer of the Caffe layer set, in one include.
#pragma once

#include "lib/layers/accuracy.h"
#include "lib/layers/activation.h"
#include "lib/layers/batch_norm.h"
#include "lib/layers/convolution.h"
#include "lib/layers/eltwise.h"
#include "lib/layers/inner_product.h"
#include "lib/layers/layer.h"
#include "lib/layers/loss.h"
#include "lib/layers/lrn.h"
#include "lib/layers/pooling.h"
#include "lib/layers/scale.h"
#include "lib/layers/shape.h"
#include "lib/layers/softmax.h"
