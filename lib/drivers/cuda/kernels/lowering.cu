// Launchers of the lowering kernels: im2col per lowered element, col2im per image pixel
// (a gather, so no atomics), swap_axes per destination element, lift per output (a gather)
// and lift_backward per product entry.
#include "lib/drivers/cuda/kernels/launchers.h"
#include "lib/drivers/cuda/kernels/lowering.cuh"
#include "lib/drivers/cuda/launch.cuh"

namespace hn::detail::cuda {

namespace {

struct Im2col {
  LoweringDims d;
  const float* images;
  float* columns;
  __device__ void operator()(index_t i) const { im2col_element(i, d, images, columns); }
};

struct Col2im {
  LoweringDims d;
  const float* columns;
  float* images;
  __device__ void operator()(index_t i) const { col2im_element(i, d, columns, images); }
};

struct SwapAxes {
  index_t d0, d1, inner;
  const float* src;
  float* dst;
  __device__ void operator()(index_t k) const { swap_axes_element(k, d0, d1, inner, src, dst); }
};

struct Lift {
  LoweringDims d;
  index_t out_channels;
  const float* products;
  float* y;
  __device__ void operator()(index_t i) const { lift_element(i, d, out_channels, products, y); }
};

struct LiftBackward {
  LoweringDims d;
  index_t out_channels;
  const float* dy;
  float* products_diff;
  __device__ void operator()(index_t i) const {
    lift_backward_element(i, d, out_channels, dy, products_diff);
  }
};

}  // namespace

cudaError_t launch_im2col(cudaStream_t stream, const LoweringDims& d, const float* images,
                          float* columns) {
  return launch_for_each(stream, d.rows() * d.cols(), Im2col{d, images, columns});
}

cudaError_t launch_col2im(cudaStream_t stream, const LoweringDims& d, const float* columns,
                          float* images) {
  return launch_for_each(stream, d.batch * d.channels * d.height * d.width,
                         Col2im{d, columns, images});
}

cudaError_t launch_swap_axes(cudaStream_t stream, index_t d0, index_t d1, index_t inner,
                             const float* src, float* dst) {
  return launch_for_each(stream, d0 * d1 * inner, SwapAxes{d0, d1, inner, src, dst});
}

cudaError_t launch_lift(cudaStream_t stream, const LoweringDims& d, index_t out_channels,
                        const float* products, float* y) {
  return launch_for_each(stream, d.batch * out_channels * d.out_h * d.out_w,
                         Lift{d, out_channels, products, y});
}

cudaError_t launch_lift_backward(cudaStream_t stream, const LoweringDims& d, index_t out_channels,
                                 const float* dy, float* products_diff) {
  return launch_for_each(stream,
                         d.batch * d.height * d.width * out_channels * d.kernel_h * d.kernel_w,
                         LiftBackward{d, out_channels, dy, products_diff});
}

}  // namespace hn::detail::cuda
