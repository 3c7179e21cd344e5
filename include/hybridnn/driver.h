// The Driver interface: every piece of arithmetic a layer needs, on raw addresses in the
// driver's own memory space. One flat list of calls; small parameter structs (shapes.h).
//
// Each public call is non-virtual: it validates its arguments (sizes, leading dimensions,
// that every address lies in memory this driver may touch), checks the capability it
// needs and counts transfers, then calls the matching protected `do_*` virtual. So every
// driver reports misuse with the same hn::Error text, and a driver implements only the
// arithmetic. A call whose capability is false throws hn::Error naming the driver and the
// call; the base class implementations of the optional calls do exactly that.
//
// Calls may run asynchronously on the driver's stream; copy_to_host, the reductions that
// return a value, and synchronize() return with the work done. One driver instance
// serves one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "hybridnn/device.h"
#include "hybridnn/shapes.h"

namespace hn {

// What a driver can do. Memory calls and synchronize() are always supported.
struct Capabilities {
  bool host_addressable = false;  // computes directly on ordinary host memory
  bool gemm = false;              // gemm
  bool lowering = false;          // im2col, col2im, swap_axes, lift, lift_backward
  bool elementwise = false;       // fill, scale, axpy, axpby, mul, add_scalar, powx,
                                  // copy_strided, scale_channels, max_accumulate, max_select
  bool reductions = false;        // dot, asum, sum, bias_backward
  bool activations = false;       // bias_forward, relu, sigmoid, tanh
  bool pooling = false;           // pool_max_*, pool_avg_*
  bool lrn = false;               // lrn_forward, lrn_backward
  bool softmax = false;           // softmax_forward, softmax_backward
  bool dropout = false;           // dropout_forward, dropout_backward
  bool losses = false;            // softmax_loss_*, sigmoid_cross_entropy_*
  bool convolution = false;       // conv_forward, conv_backward_data, conv_backward_weights
  bool solver_update = false;     // solver_update
};

// Transfers made through a driver, for tests and the scheduler's accounting.
struct TransferStats {
  std::uint64_t to_device = 0, to_device_bytes = 0;  // copy_from_host
  std::uint64_t to_host = 0, to_host_bytes = 0;      // copy_to_host
  std::uint64_t within = 0, within_bytes = 0;        // copy inside the driver's space
  std::uint64_t total() const { return to_device + to_host + within; }
};

// Identifies a memory space. Drivers that compute on host memory share host_space();
// a driver with memory of its own returns a space unique to itself.
using MemorySpace = const void*;
inline MemorySpace host_space() {
  return nullptr;
}

class Driver {
 public:
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;
  virtual ~Driver() = default;

  const Device& device() const { return device_; }
  std::string name() const { return device_.name(); }
  virtual Capabilities capabilities() const = 0;
  virtual MemorySpace memory_space() const = 0;
  bool can_address(MemorySpace space) const { return space == memory_space(); }
  // A one-line description for logs and device_query ("cpu: 2 threads, BLAS onednn").
  virtual std::string description() const { return name(); }

  // ---- memory -------------------------------------------------------------------------
  // allocate(0) returns nullptr; deallocate(nullptr) does nothing.
  void* allocate(std::size_t bytes);
  void deallocate(void* address) noexcept;
  void copy_from_host(void* dst, const void* host_src, std::size_t bytes);
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes);
  void copy(void* dst, const void* src, std::size_t bytes);  // within this driver's space
  void synchronize();
  // True when [address, address + bytes) lies in memory this driver may compute on.
  // Drivers that cannot tell return true; separate-memory drivers check their allocations.
  virtual bool owns(const void* address, std::size_t bytes) const = 0;
  const TransferStats& transfer_stats() const { return stats_; }
  void reset_transfer_stats() { stats_ = TransferStats{}; }

  // ---- GEMM: C = alpha * op(A) * op(B) + beta * C, row-major ------------------------
  // op(A) is m x k, op(B) is k x n, C is m x n. lda >= columns of A as stored.
  void gemm(Transpose trans_a, Transpose trans_b, index_t m, index_t n, index_t k, float alpha,
            const float* a, index_t lda, const float* b, index_t ldb, float beta, float* c,
            index_t ldc);

  // ---- lowering (layout in shapes.h) ------------------------------------------------
  void im2col(const LoweringShape& shape, const float* images, float* columns);
  // Overwrites `images` with the sum of every column entry that maps to each pixel.
  void col2im(const LoweringShape& shape, const float* columns, float* images);
  // dst[j][i][r] = src[i][j][r] for i < d0, j < d1, r < inner: moves a GEMM output laid
  // out [C_out][N][H*W] to NCHW and back ("lifting").
  void swap_axes(index_t d0, index_t d1, index_t inner, const float* src, float* dst);

  // CcT lowering type 3 ("lower the kernel, lift the output"), groups == 1 only. Given the
  // products P = X^T W' of the NHWC input (rows (n, ih, iw): batch*height*width) with the
  // kernel laid out [C][C_out][KH][KW] (columns (co, kh, kw)), lift overwrites
  //   y[n][co][oh][ow] = sum_{kh,kw} P[(n, ih, iw)][(co, kh, kw)],
  //   ih = oh*stride_h - pad_h + kh*dilation_h (terms outside the image are skipped).
  // lift_backward overwrites dP[(n, ih, iw)][(co, kh, kw)] = dy[n][co][oh][ow] for the
  // unique (oh, ow) that maps there, 0 where none does.
  void lift(const LoweringShape& shape, index_t out_channels, const float* products, float* y);
  void lift_backward(const LoweringShape& shape, index_t out_channels, const float* dy,
                     float* products_diff);

  // ---- direct convolution (optional: oneDNN on the CPU, cuDNN on CUDA) ---------------
  // NCHW x of `shape`, weights [out_channels][channels/groups][kernel_h][kernel_w], y
  // [batch][out_channels][out_h][out_w]. conv_forward overwrites y (bias may be null);
  // conv_backward_data overwrites dx; conv_backward_weights ADDS to dweights and, when not
  // null, to dbias (Caffe accumulates parameter gradients).
  void conv_forward(const LoweringShape& shape, index_t out_channels, const float* x,
                    const float* weights, const float* bias, float* y);
  void conv_backward_data(const LoweringShape& shape, index_t out_channels, const float* weights,
                          const float* dy, float* dx);
  void conv_backward_weights(const LoweringShape& shape, index_t out_channels, const float* x,
                             const float* dy, float* dweights, float* dbias);

  // ---- element-wise -------------------------------------------------------------------
  void fill(index_t n, float value, float* x);
  void scale(index_t n, float alpha, float* x);                              // x *= alpha
  void axpy(index_t n, float alpha, const float* x, float* y);               // y += a x
  void axpby(index_t n, float alpha, const float* x, float beta, float* y);  // y = a x + b y
  void mul(index_t n, const float* a, const float* b, float* y);             // y = a * b
  void add_scalar(index_t n, float alpha, float* x);                         // x += alpha
  void powx(index_t n, const float* x, float exponent, float* y);            // y = x^e
  // dst[r * dst_ld + c] = src[r * src_ld + c] for r < rows, c < cols (Concat, Slice).
  void copy_strided(index_t rows, index_t cols, const float* src, index_t src_ld, float* dst,
                    index_t dst_ld);
  // y[o][c][i] = x[o][c][i] * scale[c]; in place allowed.
  void scale_channels(const AxisShape& shape, const float* scale, const float* x, float* y);
  // Running element-wise maximum over inputs 0, 1, 2, ... (Eltwise MAX): index 0 copies x
  // into y and sets mask to 0; a later index replaces y and mask where x > y (first wins).
  void max_accumulate(index_t n, const float* x, std::int32_t index, float* y, std::int32_t* mask);
  // dx = mask == index ? dy : 0.
  void max_select(index_t n, const std::int32_t* mask, std::int32_t index, const float* dy,
                  float* dx);

  // ---- reductions (results return to the host; they synchronise) --------------------
  float dot(index_t n, const float* x, const float* y);
  float asum(index_t n, const float* x);
  float sum(index_t n, const float* x);
  // dbias[c] = beta * dbias[c] + sum over outer, inner of dy[o][c][i]
  void bias_backward(const AxisShape& shape, const float* dy, float beta, float* dbias);

  // ---- activations ------------------------------------------------------------------
  void bias_forward(const AxisShape& shape, const float* bias, float* y);  // y[o][c][i] += b[c]
  // y = x > 0 ? x : slope * x;  dx = dy * (x > 0 ? 1 : slope). In place (x == y) allowed.
  void relu_forward(index_t n, float negative_slope, const float* x, float* y);
  void relu_backward(index_t n, float negative_slope, const float* x, const float* dy, float* dx);
  void sigmoid_forward(index_t n, const float* x, float* y);
  void sigmoid_backward(index_t n, const float* y, const float* dy, float* dx);
  void tanh_forward(index_t n, const float* x, float* y);
  void tanh_backward(index_t n, const float* y, const float* dy, float* dx);

  // ---- pooling (backward overwrites dx) ---------------------------------------------
  // mask receives, per output, the input index h * width + w of the maximum (first wins).
  void pool_max_forward(const PoolShape& shape, const float* x, float* y, std::int32_t* mask);
  void pool_max_backward(const PoolShape& shape, const float* dy, const std::int32_t* mask,
                         float* dx);
  void pool_avg_forward(const PoolShape& shape, const float* x, float* y);
  void pool_avg_backward(const PoolShape& shape, const float* dy, float* dx);

  // ---- LRN: `scale` (count() floats) is written by forward and read by backward ------
  void lrn_forward(const LrnShape& shape, const float* x, float* y, float* scale);
  void lrn_backward(const LrnShape& shape, const float* x, const float* y, const float* scale,
                    const float* dy, float* dx);

  // ---- softmax over AxisShape::channels ---------------------------------------------
  void softmax_forward(const AxisShape& shape, const float* x, float* y);
  void softmax_backward(const AxisShape& shape, const float* y, const float* dy, float* dx);

  // ---- dropout: element i keeps when philox_uniform(seed, offset + i) >= ratio -------
  // mask[i] is 1 or 0; y = x * mask / (1 - ratio). The mask depends only on (seed, offset
  // + i), so every driver and every batch split draws the same one.
  void dropout_forward(index_t n, float ratio, std::uint64_t seed, std::uint64_t offset,
                       const float* x, float* y, float* mask);
  void dropout_backward(index_t n, float ratio, const float* mask, const float* dy, float* dx);

  // ---- losses -------------------------------------------------------------------------
  // Labels are floats holding integers (Caffe's convention). For every (outer, inner)
  // position p with label l = label[o*inner + i]:
  //   loss[p] = -log(max(prob[o][l][i], FLT_MIN)), valid[p] = 1,
  // or loss[p] = valid[p] = 0 where has_ignore_label and l == ignore_label.
  // A label outside [0, channels) is an hn::Error (reported at the call or, on
  // asynchronous drivers, at the next synchronising call).
  void softmax_loss_forward(const AxisShape& shape, const float* prob, const float* label,
                            bool has_ignore_label, int ignore_label, float* loss, float* valid);
  // dx = scale * (prob - onehot(label)), 0 at ignored positions. In place (dx == prob) allowed.
  void softmax_loss_backward(const AxisShape& shape, const float* prob, const float* label,
                             bool has_ignore_label, int ignore_label, float scale, float* dx);
  // Element-wise sigmoid cross-entropy of logits x against targets t in [0, 1], stably:
  //   loss = max(x, 0) - x*t + log(1 + exp(-|x|)), valid = 1;
  // both 0 where has_ignore_label and t == ignore_label.
  void sigmoid_cross_entropy_forward(index_t n, const float* x, const float* target,
                                     bool has_ignore_label, int ignore_label, float* loss,
                                     float* valid);
  // dx = scale * (sigmoid(x) - t), 0 where ignored.
  void sigmoid_cross_entropy_backward(index_t n, const float* x, const float* target,
                                      bool has_ignore_label, int ignore_label, float scale,
                                      float* dx);

  // ---- solver ---------------------------------------------------------------------------
  // One step of Caffe's update rule u.type on n parameters in a single pass (formulas in
  // shapes.h, SolverUpdate): reads grad, updates param and history (and history2 for
  // AdaDelta and Adam; it may be null for the others). The four arrays must be distinct.
  void solver_update(const SolverUpdate& u, index_t n, float* param, const float* grad,
                     float* history, float* history2);

 protected:
  explicit Driver(Device device) : device_(device) {}

  virtual void* do_allocate(std::size_t bytes) = 0;
  virtual void do_deallocate(void* address) noexcept = 0;
  virtual void do_copy_from_host(void* dst, const void* host_src, std::size_t bytes) = 0;
  virtual void do_copy_to_host(void* host_dst, const void* src, std::size_t bytes) = 0;
  virtual void do_copy(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void do_synchronize() = 0;

  // Optional calls: the defaults throw hn::Error ("<driver> does not support <call>").
  virtual void do_gemm(Transpose trans_a, Transpose trans_b, index_t m, index_t n, index_t k,
                       float alpha, const float* a, index_t lda, const float* b, index_t ldb,
                       float beta, float* c, index_t ldc);
  virtual void do_im2col(const LoweringShape& shape, const float* images, float* columns);
  virtual void do_col2im(const LoweringShape& shape, const float* columns, float* images);
  virtual void do_swap_axes(index_t d0, index_t d1, index_t inner, const float* src, float* dst);
  virtual void do_lift(const LoweringShape& shape, index_t out_channels, const float* products,
                       float* y);
  virtual void do_lift_backward(const LoweringShape& shape, index_t out_channels, const float* dy,
                                float* products_diff);
  virtual void do_conv_forward(const LoweringShape& shape, index_t out_channels, const float* x,
                               const float* weights, const float* bias, float* y);
  virtual void do_conv_backward_data(const LoweringShape& shape, index_t out_channels,
                                     const float* weights, const float* dy, float* dx);
  virtual void do_conv_backward_weights(const LoweringShape& shape, index_t out_channels,
                                        const float* x, const float* dy, float* dweights,
                                        float* dbias);
  virtual void do_fill(index_t n, float value, float* x);
  virtual void do_scale(index_t n, float alpha, float* x);
  virtual void do_axpy(index_t n, float alpha, const float* x, float* y);
  virtual void do_axpby(index_t n, float alpha, const float* x, float beta, float* y);
  virtual void do_mul(index_t n, const float* a, const float* b, float* y);
  virtual void do_add_scalar(index_t n, float alpha, float* x);
  virtual void do_powx(index_t n, const float* x, float exponent, float* y);
  virtual void do_copy_strided(index_t rows, index_t cols, const float* src, index_t src_ld,
                               float* dst, index_t dst_ld);
  virtual void do_scale_channels(const AxisShape& shape, const float* scale, const float* x,
                                 float* y);
  virtual void do_max_accumulate(index_t n, const float* x, std::int32_t index, float* y,
                                 std::int32_t* mask);
  virtual void do_max_select(index_t n, const std::int32_t* mask, std::int32_t index,
                             const float* dy, float* dx);
  virtual float do_dot(index_t n, const float* x, const float* y);
  virtual float do_asum(index_t n, const float* x);
  virtual float do_sum(index_t n, const float* x);
  virtual void do_bias_backward(const AxisShape& shape, const float* dy, float beta, float* dbias);
  virtual void do_bias_forward(const AxisShape& shape, const float* bias, float* y);
  virtual void do_relu_forward(index_t n, float negative_slope, const float* x, float* y);
  virtual void do_relu_backward(index_t n, float negative_slope, const float* x, const float* dy,
                                float* dx);
  virtual void do_sigmoid_forward(index_t n, const float* x, float* y);
  virtual void do_sigmoid_backward(index_t n, const float* y, const float* dy, float* dx);
  virtual void do_tanh_forward(index_t n, const float* x, float* y);
  virtual void do_tanh_backward(index_t n, const float* y, const float* dy, float* dx);
  virtual void do_pool_max_forward(const PoolShape& shape, const float* x, float* y,
                                   std::int32_t* mask);
  virtual void do_pool_max_backward(const PoolShape& shape, const float* dy,
                                    const std::int32_t* mask, float* dx);
  virtual void do_pool_avg_forward(const PoolShape& shape, const float* x, float* y);
  virtual void do_pool_avg_backward(const PoolShape& shape, const float* dy, float* dx);
  virtual void do_lrn_forward(const LrnShape& shape, const float* x, float* y, float* scale);
  virtual void do_lrn_backward(const LrnShape& shape, const float* x, const float* y,
                               const float* scale, const float* dy, float* dx);
  virtual void do_softmax_forward(const AxisShape& shape, const float* x, float* y);
  virtual void do_softmax_backward(const AxisShape& shape, const float* y, const float* dy,
                                   float* dx);
  virtual void do_dropout_forward(index_t n, float ratio, std::uint64_t seed, std::uint64_t offset,
                                  const float* x, float* y, float* mask);
  virtual void do_dropout_backward(index_t n, float ratio, const float* mask, const float* dy,
                                   float* dx);
  virtual void do_softmax_loss_forward(const AxisShape& shape, const float* prob,
                                       const float* label, bool has_ignore_label, int ignore_label,
                                       float* loss, float* valid);
  virtual void do_softmax_loss_backward(const AxisShape& shape, const float* prob,
                                        const float* label, bool has_ignore_label, int ignore_label,
                                        float scale, float* dx);
  virtual void do_sigmoid_cross_entropy_forward(index_t n, const float* x, const float* target,
                                                bool has_ignore_label, int ignore_label,
                                                float* loss, float* valid);
  virtual void do_sigmoid_cross_entropy_backward(index_t n, const float* x, const float* target,
                                                 bool has_ignore_label, int ignore_label,
                                                 float scale, float* dx);
  virtual void do_solver_update(const SolverUpdate& u, index_t n, float* param, const float* grad,
                                float* history, float* history2);

 private:
  // Throws hn::Error when [address, address + bytes) is not memory this driver owns.
  void check_range(const char* call, const char* argument, const void* address,
                   std::size_t bytes) const;
  void require(bool supported, const char* call) const;

  Device device_;
  TransferStats stats_;
};

}  // namespace hn
