// The parameter update of one solver step (Driver::solver_update): Caffe's update rules
// with their settings for one parameter array.
#pragma once

#include <cmath>

namespace hn {

// The update rules of Caffe's solvers.
enum class UpdateType { sgd, nesterov, adagrad, rmsprop, adadelta, adam };

// One solver step for one parameter array (Driver::solver_update), per element, in Caffe's
// order (sgd_solver.cpp and the other solvers' ComputeUpdateValue, then Net::Update):
//   g = grad * grad_scale, then (when decay != 0) g += decay * w (L2) or decay * sign(w) (L1)
//   sgd:      h = momentum * h + lr * g;                                   w -= h
//   nesterov: h' = momentum * h + lr * g;  w -= (1 + momentum) * h' - momentum * h;  h = h'
//   adagrad:  h += g * g;                                  w -= lr * (g / (sqrt(h) + delta))
//   rmsprop:  h = rms_decay * h + (1 - rms_decay) * g * g; w -= lr * (g / (sqrt(h) + delta))
//   adadelta: h = momentum * h + (1 - momentum) * g * g;
//             u = g * sqrt((h2 + delta) / (h + delta));
//             h2 = momentum * h2 + (1 - momentum) * u * u;                 w -= lr * u
//   adam:     h = momentum * h + (1 - momentum) * g;      (m; momentum is beta1)
//             h2 = momentum2 * h2 + (1 - momentum2) * g * g;             (v; beta2)
//             w -= lr * (h / (sqrt(h2) + delta))       (lr includes the bias correction)
// grad_scale folds gradient clipping and the 1 / iter_size normalisation together.
// `rate` and `gate`, when set, are single floats in the driver's memory, read when the update
// runs (so that a recorded update, Driver::begin_recording, follows them): the local rate is
// lr * *rate, and where *gate is not finite (a NaN loss) nothing is updated.
struct SolverUpdate {
  UpdateType type = UpdateType::sgd;
  float lr = 0.0f;  // local rate: the policy's rate times the parameter's lr_mult
  float momentum = 0.0f;
  float momentum2 = 0.999f;
  float delta = 1e-8f;
  float rms_decay = 0.99f;
  float decay = 0.0f;  // local weight decay: weight_decay times decay_mult
  bool l1 = false;     // L1 regularisation instead of L2
  float grad_scale = 1.0f;
  const float* rate = nullptr;
  const float* gate = nullptr;

  // AdaDelta and Adam keep a second history array.
  bool needs_history2() const { return type == UpdateType::adadelta || type == UpdateType::adam; }
};

// For code that reads the driver's memory directly: false where *gate says not to update,
// else folds *rate into lr and clears both.
inline bool fold_update_scalars(SolverUpdate& u) {
  if (u.gate != nullptr && !std::isfinite(*u.gate)) return false;
  if (u.rate != nullptr) u.lr *= *u.rate;
  u.rate = u.gate = nullptr;
  return true;
}

// "SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam" (Caffe's type strings).
inline const char* update_type_name(UpdateType type) {
  switch (type) {
    case UpdateType::sgd:
      return "SGD";
    case UpdateType::nesterov:
      return "Nesterov";
    case UpdateType::adagrad:
      return "AdaGrad";
    case UpdateType::rmsprop:
      return "RMSProp";
    case UpdateType::adadelta:
      return "AdaDelta";
    case UpdateType::adam:
      return "Adam";
  }
  return "unknown";
}

}  // namespace hn
