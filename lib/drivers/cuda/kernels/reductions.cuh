// Bodies of the CUDA reductions (dot, asum, sum, bias_backward). Deterministic by
// construction: the grid depends only on the problem size, every thread sums a fixed
// strided set of terms in double, and each block combines its threads in a fixed tree
// (tree_step), so two runs, on any GPU, add the same numbers in the same order.
#pragma once

#include "lib/core/philox.h"
#include "lib/core/shapes.h"

namespace hn::detail::cuda {

constexpr int kReduceThreads = 256;    // threads per block; a power of two (tree_step)
constexpr int kReduceMaxBlocks = 256;  // first-pass blocks, i.e. partials to combine

// Blocks of the first pass for n terms.
inline int reduce_blocks(index_t n) {
  const index_t blocks = (n + kReduceThreads - 1) / kReduceThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > kReduceMaxBlocks ? kReduceMaxBlocks : blocks));
}

enum class ReduceOp { dot, asum, sum };

HN_HOST_DEVICE inline double reduce_term(ReduceOp op, index_t i, const float* x, const float* y) {
  switch (op) {
    case ReduceOp::dot:
      return static_cast<double>(x[i]) * static_cast<double>(y[i]);
    case ReduceOp::asum:
      return x[i] < 0.0f ? -static_cast<double>(x[i]) : static_cast<double>(x[i]);
    case ReduceOp::sum:
      break;
  }
  return static_cast<double>(x[i]);
}

// First pass: the partial of global thread `thread` of `threads`.
HN_HOST_DEVICE inline double reduce_thread_partial(ReduceOp op, index_t thread, index_t threads,
                                                   index_t n, const float* x, const float* y) {
  double sum = 0.0;
  for (index_t i = thread; i < n; i += threads)
    sum += reduce_term(op, i, x, y);
  return sum;
}

// Second pass (one block): thread t's share of the first pass's partials.
HN_HOST_DEVICE inline double partials_thread_sum(int thread, int count, const double* partials) {
  double sum = 0.0;
  for (int i = thread; i < count; i += kReduceThreads)
    sum += partials[i];
  return sum;
}

// One step of the in-block tree: for stride = kReduceThreads / 2, ..., 1, every thread
// t < stride adds values[t + stride]; after the last step values[0] holds the block's sum.
HN_HOST_DEVICE inline void tree_step(int thread, int stride, double* values) {
  if (thread < stride) values[thread] += values[thread + stride];
}

#ifdef __CUDACC__
// The whole tree over values[0, kReduceThreads) in shared memory, every thread of the block
// taking part: values[0] holds the block's sum after it.
__device__ inline void block_tree(double* values) {
  __syncthreads();
  for (int stride = kReduceThreads / 2; stride > 0; stride /= 2) {
    tree_step(static_cast<int>(threadIdx.x), stride, values);
    __syncthreads();
  }
}
#endif

// bias_backward, one block per channel c: thread t's share of sum_{o,i} dy[o][c][i], the
// terms j = t, t + kReduceThreads, ... of the channel's outer * inner in that order. The
// position (o, i) of each j advances by a fixed step instead of a 64-bit division per term,
// and the loads of kBiasUnroll terms are issued before they are added (in the same order, so
// the sum is the same): with one block per channel (64 for ResNet's scale_conv1) each thread
// walks about 1,600 terms, and one load at a time left the GPU waiting on memory latency.
constexpr int kBiasUnroll = 8;

HN_HOST_DEVICE inline double bias_backward_partial(index_t c, int thread, const AxisShape& shape,
                                                   const float* dy) {
  const index_t inner = shape.inner;
  const index_t terms = shape.outer * inner;
  if (terms <= thread) return 0.0;  // inner == 0 included
  const index_t step_o = kReduceThreads / inner, step_r = kReduceThreads % inner;
  const index_t plane = shape.channels * inner;
  const float* channel = dy + c * inner;
  index_t o = thread / inner, r = thread % inner;
  const auto next = [&] {  // (o, r) of j + kReduceThreads
    o += step_o;
    r += step_r;
    if (r >= inner) {
      r -= inner;
      ++o;
    }
  };
  double sum = 0.0;
  index_t j = thread;
  for (; j + (kBiasUnroll - 1) * index_t{kReduceThreads} < terms;
       j += kBiasUnroll * index_t{kReduceThreads}) {
    float values[kBiasUnroll];
    for (int u = 0; u < kBiasUnroll; ++u) {
      values[u] = channel[o * plane + r];
      next();
    }
    for (int u = 0; u < kBiasUnroll; ++u)
      sum += static_cast<double>(values[u]);
  }
  for (; j < terms; j += kReduceThreads) {
    sum += static_cast<double>(channel[o * plane + r]);
    next();
  }
  return sum;
}

// dbias[c] = beta * dbias[c] + total; beta == 0 does not read dbias.
HN_HOST_DEVICE inline void bias_backward_finish(index_t c, double total, float beta, float* dbias) {
  const float sum = static_cast<float>(total);
  dbias[c] = beta == 0.0f ? sum : beta * dbias[c] + sum;
}

}  // namespace hn::detail::cuda
