// Per-element body of the CUDA solver_update kernel: Caffe's update rules (formulas in
// shapes.h, SolverUpdate) in float, in the order of Caffe's CPU solvers. Plain C++ with
// HN_HOST_DEVICE, tested on the host.
#pragma once

#include <math.h>

#include "lib/core/philox.h"  // HN_HOST_DEVICE
#include "lib/core/shapes.h"
#include "lib/core/solver_update.h"

namespace hn::detail::cuda {

// history2 is read only by AdaDelta and Adam.
HN_HOST_DEVICE inline void solver_update_element(index_t i, const SolverUpdate& u, float* param,
                                                 const float* grad, float* history,
                                                 float* history2) {
  if (u.gate != nullptr && !isfinite(*u.gate)) return;
  const float lr = u.rate != nullptr ? u.lr * *u.rate : u.lr;
  const float w = param[i];
  float g = grad[i] * u.grad_scale;
  if (u.decay != 0.0f) {  // Caffe skips regularisation when the local decay is 0
    const float sign = static_cast<float>((w > 0.0f) - (w < 0.0f));
    g += u.decay * (u.l1 ? sign : w);
  }
  const float m = u.momentum, h = history[i];
  float step = 0.0f;
  switch (u.type) {
    case UpdateType::sgd:
      step = history[i] = m * h + lr * g;
      break;
    case UpdateType::nesterov: {
      const float updated = history[i] = m * h + lr * g;
      step = (1.0f + m) * updated - m * h;
      break;
    }
    case UpdateType::adagrad: {
      const float updated = history[i] = h + g * g;
      step = lr * (g / (sqrtf(updated) + u.delta));
      break;
    }
    case UpdateType::rmsprop: {
      const float updated = history[i] = u.rms_decay * h + (1.0f - u.rms_decay) * (g * g);
      step = lr * (g / (sqrtf(updated) + u.delta));
      break;
    }
    case UpdateType::adadelta: {
      const float updated = history[i] = m * h + (1.0f - m) * (g * g);
      const float scaled = g * sqrtf((history2[i] + u.delta) / (updated + u.delta));
      history2[i] = m * history2[i] + (1.0f - m) * (scaled * scaled);
      step = lr * scaled;
      break;
    }
    case UpdateType::adam: {
      const float mean = history[i] = m * h + (1.0f - m) * g;
      const float variance = history2[i] =
          u.momentum2 * history2[i] + (1.0f - u.momentum2) * (g * g);
      step = lr * (mean / (sqrtf(variance) + u.delta));
      break;
    }
  }
  param[i] = w - step;
}

}  // namespace hn::detail::cuda
