// The fused solver update on the CPU: Caffe's update rules as Eigen array expressions over
// blocks small enough to stay in L1 between the passes of one rule, blocks spread over the
// driver's arena when the array is large.
#include "lib/drivers/cpu/kernels.h"  // first: see eigen.h

namespace hn::detail::cpu {

namespace {

// 1024 floats per array: the five arrays of a block (param, grad, two histories and the
// scratch gradient) take 20 KiB, inside L1.
constexpr index_t kUpdateBlock = 1024;

// Work units per element (see parallel.h), measured serially on 2^17 floats against ReLU's
// 0.085 ns: SGD ~0.19 ns, Nesterov ~0.25, AdaGrad and RMSProp ~0.33, Adam ~0.43, AdaDelta
// ~0.52 (the last four add a square root and a division).
index_t update_cost(UpdateType type) {
  switch (type) {
    case UpdateType::sgd:
      return 2;
    case UpdateType::nesterov:
      return 3;
    case UpdateType::adagrad:
    case UpdateType::rmsprop:
      return 4;
    case UpdateType::adam:
      return 5;
    case UpdateType::adadelta:
      return 6;
  }
  return 6;
}

void update_block(const SolverUpdate& u, index_t len, float* param, const float* grad,
                  float* history, float* history2) {
  alignas(64) float g_buffer[kUpdateBlock];
  alignas(64) float old_buffer[kUpdateBlock];
  Array w(param, len), h(history, len), g(g_buffer, len);
  // Caffe's diff after clipping / normalisation, then regularisation.
  g = ConstArray(grad, len) * u.grad_scale;
  if (u.decay != 0.0f) {
    if (u.l1) {
      g += u.decay * ((w > 0.0f).cast<float>() - (w < 0.0f).cast<float>());
    } else {
      g += u.decay * w;
    }
  }
  const float m = u.momentum, one_minus_m = 1.0f - u.momentum;
  switch (u.type) {
    case UpdateType::sgd:
      h = m * h + u.lr * g;
      w -= h;
      break;
    case UpdateType::nesterov: {
      Array old(old_buffer, len);
      old = h;
      h = m * h + u.lr * g;
      w -= (1.0f + m) * h - m * old;
      break;
    }
    case UpdateType::adagrad:
      h += g.square();
      w -= u.lr * (g / (h.sqrt() + u.delta));
      break;
    case UpdateType::rmsprop:
      h = u.rms_decay * h + (1.0f - u.rms_decay) * g.square();
      w -= u.lr * (g / (h.sqrt() + u.delta));
      break;
    case UpdateType::adadelta: {
      Array h2(history2, len);
      h = m * h + one_minus_m * g.square();
      g *= ((h2 + u.delta) / (h + u.delta)).sqrt();
      h2 = m * h2 + one_minus_m * g.square();
      w -= u.lr * g;
      break;
    }
    case UpdateType::adam: {
      Array h2(history2, len);
      h = m * h + one_minus_m * g;
      h2 = u.momentum2 * h2 + (1.0f - u.momentum2) * g.square();
      w -= u.lr * (h / (h2.sqrt() + u.delta));
      break;
    }
  }
}

}  // namespace

void solver_update(Parallel& par, const SolverUpdate& update, index_t n, float* param,
                   const float* grad, float* history, float* history2) {
  SolverUpdate u = update;
  if (!fold_update_scalars(u)) return;
  const index_t blocks = (n + kUpdateBlock - 1) / kUpdateBlock;
  par.for_range(blocks, kUpdateBlock * update_cost(u.type), [&](index_t first, index_t last) {
    for (index_t b = first; b < last; ++b) {
      const index_t at = b * kUpdateBlock, len = std::min(kUpdateBlock, n - at);
      update_block(u, len, param + at, grad + at, history + at,
                   history2 == nullptr ? nullptr : history2 + at);
    }
  });
}

}  // namespace hn::detail::cpu
