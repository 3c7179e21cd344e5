// The CUDA driver's calls cuDNN can run: cross-channel LRN, direct convolution and softmax
// (else our kernels or the generic path), and the cuDNN descriptors and convolution plans.
#include "lib/drivers/cuda/cuda_internal.h"

#include <cuda_runtime_api.h>
#if HYBRIDNN_WITH_CUDNN
#include <cudnn.h>
#endif

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "lib/core/check.h"
#include "lib/drivers/cuda/kernels/launchers.h"

namespace hn::detail {

namespace {

#if HYBRIDNN_WITH_CUDNN
// Batch slices of different sizes are different shapes: room for a few nets' worth.
constexpr std::size_t kMaxConvPlans = 64;

// Algorithms that sum the products as a GEMM does. FFT and Winograd transform the operands
// first: their results are 1e-4 to 1e-3 from the CPU's relative to the largest value (an H200
// measured 7e-4 on CIFAR-10 quick's conv1 weight gradient), too far for a split whose slices
// must agree with the CPU driver's to float rounding.
bool sums_directly(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
}
bool sums_directly(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
}
bool sums_directly(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
}

// Whether an algorithm's math suits the driver's mode: in FP32 only full-FP32 (FMA) math;
// in TF32 and BF16 tensor-op (TF32) math too.
bool math_allowed(cudnnMathType_t math, MathMode mode) {
  return math == CUDNN_FMA_MATH || mode != MathMode::fp32;
}

// Of cuDNN's ranking (by its heuristics, or by measured time), the first algorithm whose math
// the mode allows, that sums directly (or need not: HYBRIDNN_CUDNN_TRANSFORMS=1 lets FFT and
// Winograd in) and is deterministic (a run must be reproducible), or need not be
// (HYBRIDNN_CUDNN_DETERMINISTIC=0); else the first allowed one that sums directly; else the
// first allowed one; else the first.
template <class Perf>
const Perf& pick_algorithm(const Perf* results, int count, MathMode mode, bool deterministic,
                           bool transforms) {
  const Perf* direct = nullptr;
  const Perf* allowed = nullptr;
  for (int i = 0; i < count; ++i) {
    const Perf& r = results[i];
    if (r.status != CUDNN_STATUS_SUCCESS || !math_allowed(r.mathType, mode)) continue;
    if (allowed == nullptr) allowed = &r;
    if (!transforms && !sums_directly(r.algo)) continue;
    if (!deterministic || r.determinism == CUDNN_DETERMINISTIC) return r;
    if (direct == nullptr) direct = &r;
  }
  if (direct != nullptr) return *direct;
  return allowed != nullptr ? *allowed : results[0];
}

// True when pick_algorithm would choose an algorithm whose math the mode allows.
template <class Perf>
bool offers(const Perf* results, int count, MathMode mode) {
  for (int i = 0; i < count; ++i) {
    if (results[i].status == CUDNN_STATUS_SUCCESS && math_allowed(results[i].mathType, mode)) {
      return true;
    }
  }
  return false;
}

// HYBRIDNN_CUDNN_LOG=1: each convolution plan's candidates (cuDNN's ranking, with the
// measured times under HYBRIDNN_CUDNN_ALGO=find) and choices on stderr, for GPU sessions.
bool cudnn_logs() {
  const char* value = std::getenv("HYBRIDNN_CUDNN_LOG");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

// pick_algorithm's choice for one direction (`direction`: "forward", "backward data", ...),
// printed with the candidates it was chosen from where HYBRIDNN_CUDNN_LOG=1.
template <class Perf>
const Perf& choose_algorithm(const Perf* results, int count, MathMode mode, bool deterministic,
                             bool transforms, const std::string& what, const char* direction) {
  const Perf& best = pick_algorithm(results, count, mode, deterministic, transforms);
  if (!cudnn_logs()) return best;
  std::string candidates;
  for (int i = 0; i < count; ++i) {
    const Perf& r = results[i];
    if (r.status != CUDNN_STATUS_SUCCESS) continue;
    candidates += fmt::format(" {}:{:.3f}ms{}{}", static_cast<int>(r.algo), r.time,
                              r.determinism == CUDNN_DETERMINISTIC ? "" : "(nondet)",
                              r.mathType == CUDNN_FMA_MATH ? "" : "(tensor-op)");
  }
  fmt::print(stderr, "cuDNN {}: {} {} of{}\n", what, direction, static_cast<int>(best.algo),
             candidates);
  return best;
}

bool fits_int(index_t value) {
  return value >= 0 && value <= INT_MAX;
}
#endif

bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto a0 = reinterpret_cast<std::uintptr_t>(a), b0 = reinterpret_cast<std::uintptr_t>(b);
  return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

}  // namespace

// ---- LRN ----------------------------------------------------------------------------

void CudaDriver::do_lrn_forward(const LrnShape& shape, const float* x, float* y, float* scale) {
  activate();
#if HYBRIDNN_WITH_CUDNN
  if (cudnn_lrn_fits(shape) &&
      !overlaps(x, float_bytes(shape.count()), y, float_bytes(shape.count()))) {
    // cuDNN computes y; our kernel fills `scale`, which the interface promises backward.
    launched(cuda::launch_lrn_across_scale(stream(), shape, x, scale), "lrn_forward (scale)", "{}",
             shape.to_string());
    const TensorDescriptor desc = image_descriptor(shape);
    const LrnDescriptor lrn = lrn_descriptor(shape);
    const float one = 1.0f, zero = 0.0f;
    check_dnn(cudnnLRNCrossChannelForward(cudnn_.get(), lrn.get(), CUDNN_LRN_CROSS_CHANNEL_DIM1,
                                          &one, desc.get(), x, &zero, desc.get(), y),
              "lrn_forward: cudnnLRNCrossChannelForward", "{}", shape.to_string());
    return;
  }
#endif
  launched(cuda::launch_lrn_forward(stream(), shape, x, y, scale), "lrn_forward", "{}",
           shape.to_string());
}

// Each dx element reads dy (and x, y, scale) across a window, so a dx that aliases an
// input is computed into scratch first (the reference driver allows dx == dy).
void CudaDriver::do_lrn_backward(const LrnShape& shape, const float* x, const float* y,
                                 const float* scale, const float* dy, float* dx) {
  activate();
  const std::size_t bytes = float_bytes(shape.count());
  const bool aliased = overlaps(dx, bytes, x, bytes) || overlaps(dx, bytes, y, bytes) ||
                       overlaps(dx, bytes, scale, bytes) || overlaps(dx, bytes, dy, bytes);
  float* out = aliased ? scratch(bytes) : dx;
#if HYBRIDNN_WITH_CUDNN
  if (cudnn_lrn_fits(shape)) {
    const TensorDescriptor desc = image_descriptor(shape);
    const LrnDescriptor lrn = lrn_descriptor(shape);
    const float one = 1.0f, zero = 0.0f;
    check_dnn(cudnnLRNCrossChannelBackward(cudnn_.get(), lrn.get(), CUDNN_LRN_CROSS_CHANNEL_DIM1,
                                           &one, desc.get(), y, desc.get(), dy, desc.get(), x,
                                           &zero, desc.get(), out),
              "lrn_backward: cudnnLRNCrossChannelBackward", "{}", shape.to_string());
  } else
#endif
  {
    launched(cuda::launch_lrn_backward(stream(), shape, x, y, scale, dy, out), "lrn_backward", "{}",
             shape.to_string());
  }
  if (aliased) {
    check(cudaMemcpyAsync(dx, out, bytes, cudaMemcpyDeviceToDevice, stream()),
          "lrn_backward: cudaMemcpyAsync", "{} bytes from scratch", bytes);
  }
}

// ---- direct convolution: own depthwise kernels, cuDNN, or the generic one ----------

// Depthwise shapes run kernels/depthwise.cuh without cuDNN or with
// HYBRIDNN_CUDNN=own-depthwise.
bool CudaDriver::own_depthwise(const LoweringShape& shape, index_t out_channels) const {
#if HYBRIDNN_WITH_CUDNN
  if (cudnn_ && cudnn_depthwise_) return false;
#endif
  return cuda::is_depthwise(shape, out_channels);
}

void CudaDriver::do_conv_forward(const LoweringShape& shape, index_t out_channels, const float* x,
                                 const float* weights, const float* bias, float* y) {
  if (own_depthwise(shape, out_channels)) {
    activate();
    launched(cuda::launch_depthwise_forward(stream(), cuda::lowering_dims(shape), out_channels, x,
                                            weights, bias, y),
             "conv_forward (depthwise)", "{} out_channels={}", shape.to_string(), out_channels);
    return;
  }
#if HYBRIDNN_WITH_CUDNN
  if (cudnn_) {
    activate();
    const ConvPlan& plan = conv_plan("conv_forward", shape, out_channels);
    const float one = 1.0f, zero = 0.0f;
    check_dnn(cudnnConvolutionForward(cudnn_.get(), &one, plan.x.get(), x, plan.w.get(), weights,
                                      plan.conv.get(), plan.forward_algo,
                                      conv_workspace(plan.forward_bytes), plan.forward_bytes, &zero,
                                      plan.y.get(), y),
              "conv_forward: cudnnConvolutionForward", "{} out_channels={} algo={}",
              shape.to_string(), out_channels, static_cast<int>(plan.forward_algo));
    if (bias == nullptr) return;
    check_dnn(cudnnAddTensor(cudnn_.get(), &one, plan.bias.get(), bias, &one, plan.y.get(), y),
              "conv_forward: cudnnAddTensor", "bias of {} out_channels={}", shape.to_string(),
              out_channels);
    return;
  }
#endif
  Driver::do_conv_forward(shape, out_channels, x, weights, bias, y);
}

void CudaDriver::do_conv_backward_data(const LoweringShape& shape, index_t out_channels,
                                       const float* weights, const float* dy, float* dx) {
  if (own_depthwise(shape, out_channels)) {
    activate();
    launched(cuda::launch_depthwise_backward_data(stream(), cuda::lowering_dims(shape),
                                                  out_channels, weights, dy, dx),
             "conv_backward_data (depthwise)", "{} out_channels={}", shape.to_string(),
             out_channels);
    return;
  }
#if HYBRIDNN_WITH_CUDNN
  if (cudnn_) {
    activate();
    const ConvPlan& plan = conv_plan("conv_backward_data", shape, out_channels);
    const float one = 1.0f, zero = 0.0f;
    check_dnn(cudnnConvolutionBackwardData(cudnn_.get(), &one, plan.w.get(), weights, plan.y.get(),
                                           dy, plan.conv.get(), plan.data_algo,
                                           conv_workspace(plan.data_bytes), plan.data_bytes, &zero,
                                           plan.x.get(), dx),
              "conv_backward_data: cudnnConvolutionBackwardData", "{} out_channels={} algo={}",
              shape.to_string(), out_channels, static_cast<int>(plan.data_algo));
    return;
  }
#endif
  Driver::do_conv_backward_data(shape, out_channels, weights, dy, dx);
}

// Adds to the gradients, as Caffe accumulates them (beta = 1 for cuDNN and bias_backward).
void CudaDriver::do_conv_backward_weights(const LoweringShape& shape, index_t out_channels,
                                          const float* x, const float* dy, float* dweights,
                                          float* dbias) {
  if (own_depthwise(shape, out_channels)) {
    activate();
    launched(cuda::launch_depthwise_backward_weights(stream(), cuda::lowering_dims(shape),
                                                     out_channels, x, dy, dweights),
             "conv_backward_weights (depthwise)", "{} out_channels={}", shape.to_string(),
             out_channels);
    if (dbias == nullptr) return;
    const AxisShape planes{shape.batch, out_channels, shape.out_h() * shape.out_w()};
    launched(cuda::launch_bias_backward(stream(), planes, dy, 1.0f, dbias),
             "conv_backward_weights (depthwise bias)", "{} out_channels={}", shape.to_string(),
             out_channels);
    return;
  }
#if HYBRIDNN_WITH_CUDNN
  if (cudnn_) {
    activate();
    const ConvPlan& plan = conv_plan("conv_backward_weights", shape, out_channels);
    const float one = 1.0f;
    check_dnn(cudnnConvolutionBackwardFilter(cudnn_.get(), &one, plan.x.get(), x, plan.y.get(), dy,
                                             plan.conv.get(), plan.filter_algo,
                                             conv_workspace(plan.filter_bytes), plan.filter_bytes,
                                             &one, plan.w.get(), dweights),
              "conv_backward_weights: cudnnConvolutionBackwardFilter", "{} out_channels={} algo={}",
              shape.to_string(), out_channels, static_cast<int>(plan.filter_algo));
    if (dbias == nullptr) return;
    check_dnn(cudnnConvolutionBackwardBias(cudnn_.get(), &one, plan.y.get(), dy, &one,
                                           plan.bias.get(), dbias),
              "conv_backward_weights: cudnnConvolutionBackwardBias", "{} out_channels={}",
              shape.to_string(), out_channels);
    return;
  }
#endif
  Driver::do_conv_backward_weights(shape, out_channels, x, dy, dweights, dbias);
}

// ---- softmax ------------------------------------------------------------------------

void CudaDriver::do_softmax_forward(const AxisShape& shape, const float* x, float* y) {
  activate();
#if HYBRIDNN_WITH_CUDNN
  if (cudnn_axis_fits(shape) && x != y) {
    const TensorDescriptor desc = axis_descriptor(shape);
    const float one = 1.0f, zero = 0.0f;
    check_dnn(cudnnSoftmaxForward(cudnn_.get(), CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_CHANNEL,
                                  &one, desc.get(), x, &zero, desc.get(), y),
              "softmax_forward: cudnnSoftmaxForward", "{}", shape.to_string());
    return;
  }
#endif
  launched(cuda::launch_softmax_forward(stream(), shape, x, y), "softmax_forward", "{}",
           shape.to_string());
}

void CudaDriver::do_softmax_backward(const AxisShape& shape, const float* y, const float* dy,
                                     float* dx) {
  activate();
#if HYBRIDNN_WITH_CUDNN
  if (cudnn_axis_fits(shape) && dx != dy && dx != y) {
    const TensorDescriptor desc = axis_descriptor(shape);
    const float one = 1.0f, zero = 0.0f;
    check_dnn(cudnnSoftmaxBackward(cudnn_.get(), CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_CHANNEL,
                                   &one, desc.get(), y, desc.get(), dy, &zero, desc.get(), dx),
              "softmax_backward: cudnnSoftmaxBackward", "{}", shape.to_string());
    return;
  }
#endif
  launched(cuda::launch_softmax_backward(stream(), shape, y, dy, dx), "softmax_backward", "{}",
           shape.to_string());
}

// ---- cuDNN descriptors and convolution plans ----------------------------------------

#if HYBRIDNN_WITH_CUDNN
// cuDNN takes int dimensions, and its LRN window at most CUDNN_LRN_MAX_N wide.
bool CudaDriver::cudnn_axis_fits(const AxisShape& s) const {
  return cudnn_ && fits_int(s.outer) && fits_int(s.channels) && fits_int(s.inner) &&
         fits_int(s.count());
}

bool CudaDriver::cudnn_lrn_fits(const LrnShape& s) const {
  return cudnn_ && s.region == LrnRegion::across_channels && s.size >= CUDNN_LRN_MIN_N &&
         s.size <= CUDNN_LRN_MAX_N && s.k >= CUDNN_LRN_MIN_K && s.beta >= CUDNN_LRN_MIN_BETA &&
         fits_int(s.batch) && fits_int(s.channels) && fits_int(s.height) && fits_int(s.width) &&
         fits_int(s.count());
}

TensorDescriptor CudaDriver::tensor_descriptor(index_t n, index_t c, index_t h, index_t w,
                                               const std::string& what) const {
  cudnnTensorDescriptor_t raw = nullptr;
  check_dnn(cudnnCreateTensorDescriptor(&raw), "cudnnCreateTensorDescriptor", "{}", what);
  TensorDescriptor desc(raw);
  check_dnn(
      cudnnSetTensor4dDescriptor(raw, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, static_cast<int>(n),
                                 static_cast<int>(c), static_cast<int>(h), static_cast<int>(w)),
      "cudnnSetTensor4dDescriptor", "{}", what);
  return desc;
}

TensorDescriptor CudaDriver::axis_descriptor(const AxisShape& s) const {
  return tensor_descriptor(s.outer, s.channels, s.inner, 1, s.to_string());
}

TensorDescriptor CudaDriver::image_descriptor(const LrnShape& s) const {
  return tensor_descriptor(s.batch, s.channels, s.height, s.width, s.to_string());
}

void* CudaDriver::conv_workspace(std::size_t bytes) {
  return bytes == 0 ? nullptr : scratch(bytes);
}

const ConvPlan& CudaDriver::conv_plan(const char* call, const LoweringShape& s,
                                      index_t out_channels) {
  const ConvKey key = {
      s.batch,      s.channels,   s.height, s.width,      s.kernel_h,
      s.kernel_w,   s.pad_h,      s.pad_w,  s.stride_h,   s.stride_w,
      s.dilation_h, s.dilation_w, s.groups, out_channels, static_cast<index_t>(math_mode())};
  const auto found = conv_plans_.find(key);
  if (found != conv_plans_.end()) return found->second;
  ConvPlan plan = make_conv_plan(call, s, out_channels);
  if (conv_plans_.size() >= kMaxConvPlans) {
    conv_plans_.erase(conv_plan_order_.front());
    conv_plan_order_.erase(conv_plan_order_.begin());
  }
  conv_plan_order_.push_back(key);
  return conv_plans_.emplace(key, std::move(plan)).first->second;
}

ConvPlan CudaDriver::make_conv_plan(const char* call, const LoweringShape& s,
                                    index_t out_channels) const {
  const std::string what = fmt::format("{}: {} out_channels={}, {} math", call, s.to_string(),
                                       out_channels, math_mode_name(math_mode()));
  const index_t out_h = s.out_h(), out_w = s.out_w();
  HN_CHECK(cudnn_ != nullptr, "{}: cuDNN is off (HYBRIDNN_CUDNN=0)", what);
  HN_CHECK(fits_int(s.image_count()) && fits_int(s.batch * out_channels * out_h * out_w) &&
               fits_int(out_channels * (s.channels / s.groups) * s.kernel_h * s.kernel_w) &&
               fits_int(s.pad_h) && fits_int(s.pad_w) && fits_int(s.stride_h) &&
               fits_int(s.stride_w) && fits_int(s.dilation_h) && fits_int(s.dilation_w),
           "{}: sizes beyond cuDNN's int range", what);
  const auto i = [](index_t v) { return static_cast<int>(v); };
  ConvPlan plan;
  plan.x = tensor_descriptor(s.batch, s.channels, s.height, s.width, what);
  plan.y = tensor_descriptor(s.batch, out_channels, out_h, out_w, what);
  plan.bias = tensor_descriptor(1, out_channels, 1, 1, what);

  cudnnFilterDescriptor_t filter = nullptr;
  check_dnn(cudnnCreateFilterDescriptor(&filter), "cudnnCreateFilterDescriptor", "{}", what);
  plan.w.reset(filter);
  check_dnn(cudnnSetFilter4dDescriptor(filter, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, i(out_channels),
                                       i(s.channels / s.groups), i(s.kernel_h), i(s.kernel_w)),
            "cudnnSetFilter4dDescriptor", "{}", what);

  cudnnConvolutionDescriptor_t conv = nullptr;
  check_dnn(cudnnCreateConvolutionDescriptor(&conv), "cudnnCreateConvolutionDescriptor", "{}",
            what);
  plan.conv.reset(conv);
  // Caffe's layers compute a cross-correlation: in FP32 with FMA math (no TF32 tensor
  // cores); in TF32 and BF16 math on tensor cores where an algorithm has them (cuDNN has no
  // BF16 path from FP32 data: BF16 runs the convolutions in TF32).
  check_dnn(cudnnSetConvolution2dDescriptor(conv, i(s.pad_h), i(s.pad_w), i(s.stride_h),
                                            i(s.stride_w), i(s.dilation_h), i(s.dilation_w),
                                            CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
            "cudnnSetConvolution2dDescriptor", "{}", what);
  check_dnn(cudnnSetConvolutionGroupCount(conv, i(s.groups)), "cudnnSetConvolutionGroupCount", "{}",
            what);
  check_dnn(cudnnSetConvolutionMathType(
                conv, math_mode() == MathMode::fp32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH),
            "cudnnSetConvolutionMathType", "{}", what);
  int dims[4] = {0, 0, 0, 0};
  check_dnn(cudnnGetConvolutionNdForwardOutputDim(conv, plan.x.get(), plan.w.get(), 4, dims),
            "cudnnGetConvolutionNdForwardOutputDim", "{}", what);
  HN_CHECK(dims[0] == i(s.batch) && dims[1] == i(out_channels) && dims[2] == i(out_h) &&
               dims[3] == i(out_w),
           "{}: cuDNN's output {}x{}x{}x{} differs from {}x{}x{}x{}", what, dims[0], dims[1],
           dims[2], dims[3], s.batch, out_channels, out_h, out_w);

  cudnnHandle_t handle = cudnn_.get();
  int count = 0;
  {
    cudnnConvolutionFwdAlgoPerf_t results[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    const bool found =
        cudnn_find_ &&
        cudnnFindConvolutionForwardAlgorithm(handle, plan.x.get(), plan.w.get(), conv, plan.y.get(),
                                             CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count,
                                             results) == CUDNN_STATUS_SUCCESS &&
        offers(results, count, math_mode());
    if (!found) {
      // A failed measurement leaves the heuristics to choose (its error cleared: only a
      // failed cudnnFind can have set one here, the stream's work being checked at syncs).
      if (cudnn_find_) cudaGetLastError();
      check_dnn(cudnnGetConvolutionForwardAlgorithm_v7(
                    handle, plan.x.get(), plan.w.get(), conv, plan.y.get(),
                    CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, results),
                "cudnnGetConvolutionForwardAlgorithm_v7", "{}", what);
    }
    HN_CHECK(count > 0, "{}: cuDNN offers no forward algorithm", what);
    const auto& best = choose_algorithm(results, count, math_mode(), cudnn_deterministic_,
                                        cudnn_transforms_, what, "forward");
    plan.forward_algo = best.algo;
    check_dnn(cudnnGetConvolutionForwardWorkspaceSize(handle, plan.x.get(), plan.w.get(), conv,
                                                      plan.y.get(), best.algo, &plan.forward_bytes),
              "cudnnGetConvolutionForwardWorkspaceSize", "{}", what);
  }
  {
    cudnnConvolutionBwdDataAlgoPerf_t results[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    const bool found =
        cudnn_find_ &&
        cudnnFindConvolutionBackwardDataAlgorithm(
            handle, plan.w.get(), plan.y.get(), conv, plan.x.get(),
            CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, results) == CUDNN_STATUS_SUCCESS &&
        offers(results, count, math_mode());
    if (!found) {
      if (cudnn_find_) cudaGetLastError();
      check_dnn(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                    handle, plan.w.get(), plan.y.get(), conv, plan.x.get(),
                    CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, results),
                "cudnnGetConvolutionBackwardDataAlgorithm_v7", "{}", what);
    }
    HN_CHECK(count > 0, "{}: cuDNN offers no backward data algorithm", what);
    const auto& best = choose_algorithm(results, count, math_mode(), cudnn_deterministic_,
                                        cudnn_transforms_, what, "backward data");
    plan.data_algo = best.algo;
    check_dnn(
        cudnnGetConvolutionBackwardDataWorkspaceSize(handle, plan.w.get(), plan.y.get(), conv,
                                                     plan.x.get(), best.algo, &plan.data_bytes),
        "cudnnGetConvolutionBackwardDataWorkspaceSize", "{}", what);
  }
  {
    cudnnConvolutionBwdFilterAlgoPerf_t results[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    const bool found =
        cudnn_find_ &&
        cudnnFindConvolutionBackwardFilterAlgorithm(
            handle, plan.x.get(), plan.y.get(), conv, plan.w.get(),
            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, results) == CUDNN_STATUS_SUCCESS &&
        offers(results, count, math_mode());
    if (!found) {
      if (cudnn_find_) cudaGetLastError();
      check_dnn(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                    handle, plan.x.get(), plan.y.get(), conv, plan.w.get(),
                    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, results),
                "cudnnGetConvolutionBackwardFilterAlgorithm_v7", "{}", what);
    }
    HN_CHECK(count > 0, "{}: cuDNN offers no backward filter algorithm", what);
    const auto& best = choose_algorithm(results, count, math_mode(), cudnn_deterministic_,
                                        cudnn_transforms_, what, "backward filter");
    plan.filter_algo = best.algo;
    check_dnn(
        cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, plan.x.get(), plan.y.get(), conv,
                                                       plan.w.get(), best.algo, &plan.filter_bytes),
        "cudnnGetConvolutionBackwardFilterWorkspaceSize", "{}", what);
  }
  return plan;
}

LrnDescriptor CudaDriver::lrn_descriptor(const LrnShape& s) const {
  cudnnLRNDescriptor_t raw = nullptr;
  check_dnn(cudnnCreateLRNDescriptor(&raw), "cudnnCreateLRNDescriptor", "{}", s.to_string());
  LrnDescriptor desc(raw);
  // cuDNN divides alpha by the window width itself, as Caffe does.
  check_dnn(cudnnSetLRNDescriptor(raw, static_cast<unsigned>(s.size), s.alpha, s.beta, s.k),
            "cudnnSetLRNDescriptor", "{}", s.to_string());
  return desc;
}
#endif

}  // namespace hn::detail
