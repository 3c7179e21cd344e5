// Every layer of the Caffe layer set, in one include.
#pragma once

#include "hybridnn/layer.h"
#include "hybridnn/layers/accuracy.h"
#include "hybridnn/layers/activation.h"
#include "hybridnn/layers/batch_norm.h"
#include "hybridnn/layers/convolution.h"
#include "hybridnn/layers/eltwise.h"
#include "hybridnn/layers/inner_product.h"
#include "hybridnn/layers/loss.h"
#include "hybridnn/layers/lrn.h"
#include "hybridnn/layers/pooling.h"
#include "hybridnn/layers/scale.h"
#include "hybridnn/layers/shape.h"
#include "hybridnn/layers/softmax.h"
