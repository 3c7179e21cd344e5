// The generic implementations of the optional Driver calls, the defaults a driver gets for
// every call of driver_calls.def it does not override.
//
// HN_COMPOSED calls are built from core calls on the driver itself (copy_strided, gemm,
// fill), so they run where the driver's data lives. Every other optional call runs its
// reference kernel (ref_kernels.h) on host memory, the way ggml's scheduler falls back to
// its CPU backend: on a driver that computes on host memory, directly on the operands
// after synchronize(); on a driver with memory of its own, on host copies made with the
// core copies (copy_to_host of every operand, copy_from_host of every written one).
#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

#include "lib/core/check.h"
#include "lib/core/driver.h"
#include "lib/core/ref_kernels.h"

namespace hn {

namespace {

// Host copies of a call's operands, one per distinct address (an in-place call names the
// same memory twice), or the operands themselves when the driver computes on host memory.
class HostStage {
 public:
  HostStage(Driver& driver, const DriverOperands& operands)
      : driver_(driver), direct_(driver.capabilities().host_addressable) {
    driver.synchronize();
    if (direct_) return;
    for (const DriverOperand& operand : operands) {
      if (operand.address == nullptr || operand.bytes == 0) continue;
      const bool written = operand.use != DriverOperand::Use::read;
      Copy* copy = find(operand.address);
      if (copy == nullptr) {
        copies_.push_back(Copy{operand.address, operand.bytes, written, nullptr});
      } else {
        copy->bytes = std::max(copy->bytes, operand.bytes);
        copy->written = copy->written || written;
      }
    }
    for (Copy& copy : copies_) {
      // Whole floats, so that a kernel's float view of an int32 mask stays in bounds.
      copy.host = std::make_unique<float[]>((copy.bytes + sizeof(float) - 1) / sizeof(float));
      driver.copy_to_host(copy.host.get(), copy.device, copy.bytes);
    }
  }

  // The host address standing for `device` (nullptr for an address that is no operand:
  // the kernel must not touch it); other arguments pass through.
  template <class T>
  T* map(T* device) const {
    if (direct_ || device == nullptr) return device;
    for (const Copy& copy : copies_) {
      if (copy.device == device) return reinterpret_cast<T*>(copy.host.get());
    }
    return nullptr;
  }
  template <class T>
  const T& map(const T& value) const {
    return value;
  }

  // Copies the written operands back.
  void finish() {
    for (const Copy& copy : copies_) {
      if (copy.written)
        driver_.copy_from_host(const_cast<void*>(copy.device), copy.host.get(), copy.bytes);
    }
  }

 private:
  struct Copy {
    const void* device;
    std::size_t bytes;
    bool written;
    std::unique_ptr<float[]> host;
  };
  Copy* find(const void* device) {
    for (Copy& copy : copies_) {
      if (copy.device == device) return &copy;
    }
    return nullptr;
  }

  Driver& driver_;
  const bool direct_;
  std::vector<Copy> copies_;
};

// Calls `kernel` with the stage's host addresses in place of the driver's.
template <class Ret, class... Params>
struct StagedCall {
  HostStage& stage;
  Ret (*kernel)(Params...);

  template <class... Args>
  Ret operator()(const Args&... args) {
    if constexpr (std::is_void_v<Ret>) {
      kernel(stage.map(args)...);
      stage.finish();
    } else {
      const Ret result = kernel(stage.map(args)...);
      stage.finish();
      return result;
    }
  }
};

template <class Ret, class... Params>
StagedCall<Ret, Params...> staged(HostStage& stage, Ret (*kernel)(Params...)) {
  return StagedCall<Ret, Params...>{stage, kernel};
}

// Scratch floats in a driver's memory, freed through it.
class Scratch {
 public:
  Scratch(Driver& driver, index_t count)
      : driver_(driver),
        data_(
            static_cast<float*>(driver.allocate(static_cast<std::size_t>(count) * sizeof(float)))) {
  }
  ~Scratch() { driver_.deallocate(data_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* get() const { return data_; }

 private:
  Driver& driver_;
  float* data_;
};

// `count` ones in the driver's memory.
class Ones : public Scratch {
 public:
  Ones(Driver& driver, index_t count) : Scratch(driver, count) { driver.fill(count, 1.0f, get()); }
};

}  // namespace

// ---- staged through the reference kernels ------------------------------------------

#define HN_CORE(RET, NAME, PARAMS, ARGS)
#define HN_COMPOSED(RET, NAME, PARAMS, ARGS)
#define HN_OPTIONAL(RET, NAME, PARAMS, ARGS)      \
  RET Driver::do_##NAME PARAMS {                  \
    HostStage stage(*this, NAME##_operands ARGS); \
    return staged(stage, &ref::NAME) ARGS;        \
  }
#include "lib/core/driver_calls.def"

// ---- composed from core calls ------------------------------------------------------

// The reference kernel staged as the others are, after reading the rate and the gate, which
// the staging does not map (they are fields of u), where they are.
void Driver::do_solver_update(const SolverUpdate& u, index_t n, float* param, const float* grad,
                              float* history, float* history2) {
  SolverUpdate local = u;
  float rate = 1.0f, gate = 0.0f;
  if (u.rate != nullptr) copy_to_host(&rate, u.rate, sizeof(float));
  if (u.gate != nullptr) copy_to_host(&gate, u.gate, sizeof(float));
  local.rate = u.rate != nullptr ? &rate : nullptr;
  local.gate = u.gate != nullptr ? &gate : nullptr;
  if (!fold_update_scalars(local)) return;
  HostStage stage(*this, solver_update_operands(local, n, param, grad, history, history2));
  staged(stage, &ref::solver_update)(local, n, param, grad, history, history2);
}

// One copy_strided per index of the shorter of the two swapped axes.
void Driver::do_swap_axes(index_t d0, index_t d1, index_t inner, const float* src, float* dst) {
  if (d0 <= d1) {
    for (index_t i = 0; i < d0; ++i)  // rows j of src's block i land in column block i
      copy_strided(d1, inner, src + i * d1 * inner, inner, dst + i * inner, d0 * inner);
  } else {
    for (index_t j = 0; j < d1; ++j)  // rows i with middle index j land in dst's block j
      copy_strided(d0, inner, src + j * inner, d1 * inner, dst + j * d0 * inner, inner);
  }
}

void Driver::do_copy_strided_batched(index_t batch, index_t rows, index_t cols, const float* src,
                                     index_t src_ld, index_t src_stride, float* dst, index_t dst_ld,
                                     index_t dst_stride) {
  for (index_t b = 0; b < batch; ++b)
    copy_strided(rows, cols, src + b * src_stride, src_ld, dst + b * dst_stride, dst_ld);
}

void Driver::do_conv_forward_activation(const LoweringShape& shape, index_t out_channels,
                                        const float* x, const float* weights, const float* bias,
                                        const Activation& activation, float* y) {
  conv_forward(shape, out_channels, x, weights, bias, y);
  apply_activation(*this, shape.batch * out_channels * shape.out_h() * shape.out_w(), activation,
                   y);
}

void Driver::do_conv_forward_residual(const LoweringShape& shape, index_t out_channels,
                                      const float* x, const float* weights, const float* bias,
                                      const float* residual, const Activation& activation,
                                      float* y) {
  conv_forward(shape, out_channels, x, weights, bias, y);
  add_activate(*this, shape.batch * out_channels * shape.out_h() * shape.out_w(), residual,
               activation, y);
}

void add_activate(Driver& driver, index_t n, const float* residual, const Activation& activation,
                  float* y) {
  if (activation.kind == Activation::Kind::relu) {
    driver.lincomb_relu(n, 1.0f, y, 1.0f, residual, activation.slope, y);
    return;
  }
  driver.lincomb(n, 1.0f, y, 1.0f, residual, y);
  apply_activation(driver, n, activation, y);
}

void apply_activation(Driver& driver, index_t n, const Activation& activation, float* y) {
  switch (activation.kind) {
    case Activation::Kind::none:
      break;
    case Activation::Kind::relu:
      driver.relu_forward(n, activation.slope, y, y);
      break;
    case Activation::Kind::clip:
      driver.clip_forward(n, activation.lo, activation.hi, y, y);
      break;
  }
}

void Driver::do_conv_backward(const LoweringShape& shape, index_t out_channels, const float* x,
                              const float* weights, const float* dy, float* dx, float* dweights,
                              float* dbias) {
  if (dweights != nullptr) conv_backward_weights(shape, out_channels, x, dy, dweights, dbias);
  if (dx != nullptr) conv_backward_data(shape, out_channels, weights, dy, dx);
}

void Driver::do_conv_backward_relu(const LoweringShape& shape, index_t out_channels, const float* x,
                                   const float* weights, const float* y, float negative_slope,
                                   float* dy, float* dx, float* dweights, float* dbias) {
  relu_backward(shape.batch * out_channels * shape.out_h() * shape.out_w(), negative_slope, y, dy,
                dy);
  conv_backward(shape, out_channels, x, weights, dy, dx, dweights, dbias);
}

// Two rank-1 GEMMs: the bias spread over a channel's positions, then added to every outer
// block.
void Driver::do_bias_forward(const AxisShape& shape, const float* bias, float* y) {
  const index_t c = shape.channels, inner = shape.inner, outer = shape.outer;
  const Ones ones_vector(*this, std::max(inner, outer));
  const Scratch spread(*this, c * inner);
  gemm(Transpose::no, Transpose::no, c, inner, 1, 1.0f, bias, 1, ones_vector.get(), inner, 0.0f,
       spread.get(), inner);
  gemm(Transpose::no, Transpose::no, outer, c * inner, 1, 1.0f, ones_vector.get(), 1, spread.get(),
       c * inner, 1.0f, y, c * inner);
}

void Driver::do_relu_backward_bias(const AxisShape& shape, float negative_slope, const float* y,
                                   const float* dy, float* dx, float* dbias) {
  relu_backward(shape.count(), negative_slope, y, dy, dx);
  bias_backward(shape, dx, 1.0f, dbias);
}

// The same two GEMMs backwards: sum over the outer blocks, then over each channel's
// positions, into beta * dbias.
void Driver::do_bias_backward(const AxisShape& shape, const float* dy, float beta, float* dbias) {
  const index_t c = shape.channels, inner = shape.inner, outer = shape.outer;
  if (c == 0) return;
  const Ones ones_vector(*this, std::max(inner, outer));
  const Scratch summed(*this, c * inner);
  if (c * inner > 0) {
    gemm(Transpose::no, Transpose::no, 1, c * inner, outer, 1.0f, ones_vector.get(),
         std::max<index_t>(outer, 1), dy, c * inner, 0.0f, summed.get(), c * inner);
  }
  gemm(Transpose::no, Transpose::no, c, 1, inner, 1.0f, summed.get(), std::max<index_t>(inner, 1),
       ones_vector.get(), 1, beta, dbias, 1);
}

// Two passes of axpby/axpy, ordered so that neither overwrites an operand still to be read.
void Driver::do_lincomb(index_t n, float alpha, const float* a, float beta, const float* b,
                        float* y) {
  if (y == a) {
    axpby(n, beta, b, alpha, y);
  } else if (y == b) {
    axpby(n, alpha, a, beta, y);
  } else {
    axpby(n, alpha, a, 0.0f, y);
    axpy(n, beta, b, y);
  }
}

void Driver::do_lincomb_relu(index_t n, float alpha, const float* a, float beta, const float* b,
                             float slope, float* y) {
  lincomb(n, alpha, a, beta, b, y);
  relu_forward(n, slope, y, y);
}

// BatchNorm's, Scale's and ReLU's own calls in sequence (normalised, or y, as the
// intermediate).
void Driver::do_norm_affine_forward(const AxisShape& shape, const float* x, const float* shift,
                                    const float* inv_std, const float* gamma, const float* beta,
                                    bool relu, float slope, float* normalised, float* y) {
  float* n = normalised != nullptr ? normalised : y;
  if (n != x) copy(n, x, static_cast<std::size_t>(shape.count()) * sizeof(float));
  bias_forward(shape, shift, n);
  scale_channels(shape, inv_std, n, n);
  scale_channels(shape, gamma, n, y);
  if (beta != nullptr) bias_forward(shape, beta, y);
  if (relu) relu_forward(shape.count(), slope, y, y);
}

void Driver::do_norm_affine_backward(const AxisShape& shape, const float* dy, const float* y,
                                     const float* normalised, const float* dx_scale, bool relu,
                                     float slope, float* dgamma, float* dbeta, float* dx) {
  const index_t count = shape.count();
  const Scratch dz(*this, count);
  if (relu) {
    relu_backward(count, slope, y, dy, dz.get());
  } else {
    copy(dz.get(), dy, static_cast<std::size_t>(count) * sizeof(float));
  }
  if (dbeta != nullptr) bias_backward(shape, dz.get(), 1.0f, dbeta);
  if (dgamma != nullptr) {
    const Scratch product(*this, count);
    mul(count, dz.get(), normalised, product.get());
    bias_backward(shape, product.get(), 1.0f, dgamma);
  }
  if (dx != nullptr) scale_channels(shape, dx_scale, dz.get(), dx);
}

}  // namespace hn
