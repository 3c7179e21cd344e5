// Convolution chunking: how many images the lowerings (type 1 and type 3) lower at a time,
// from the bytes one image lowers to.
#include "lib/layers/conv_algorithm.h"

#include <algorithm>
#include <cstddef>

namespace hn {

namespace {

// Chunking (type 1 and type 3): a slice is lowered a chunk of images at a time, so the
// workspace stays bounded whatever the batch and the lowered data is read back by the
// GEMM soon after it is written. The chunk is the largest number of images whose lowered
// data fits kChunkTargetBytes (at least one image). 18 MiB was the best single target for
// forward and backward over CaffeNet's conv1..conv5 at batch 32 on the development
// machine (2 cores, 2 MiB L2 each, oneDNN sgemm; docs/layers.md): chunks of 1-2 images
// starve the GEMMs of 13x13 layers (169 columns per image, weights repacked per call),
// chunks beyond ~20 MiB spill the lowered matrix further out of cache.
constexpr std::size_t kChunkTargetBytes = std::size_t{18} << 20;
// Forward runs image by image when one image already lowers to this much (CaffeNet's conv2:
// 7 MB, 729 columns): its GEMM is large enough alone, and chunks of two measured ~8 %
// slower (the transpose to NCHW, and twice the lowered data out of cache). Backward keeps
// the chunks: its weight-gradient GEMM gains from the longer inner dimension.
constexpr std::size_t kLargeImageBytes = std::size_t{6} << 20;

}  // namespace

// Per-image lowered bytes: type 1 columns, or type 3 products and NHWC input.
std::size_t ConvolutionLayer::lowered_bytes_per_image(Lowering lowering) const {
  const ConvGeometry& geo = geometry_;
  return detail::floats_bytes(
      lowering == Lowering::type3
          ? geo.height * geo.width *
                (config_.num_output * geo.kernel_h * geo.kernel_w + geo.channels)
          : geo.channels * geo.kernel_h * geo.kernel_w * geo.out_h * geo.out_w);
}

index_t ConvolutionLayer::chunk_for(Lowering lowering, index_t rows, std::size_t target) const {
  if (lowering == Lowering::direct_1x1 || rows <= 1) return 1;
  const index_t fit = static_cast<index_t>(target / lowered_bytes_per_image(lowering));
  return std::clamp<index_t>(fit, 1, rows);
}

index_t ConvolutionLayer::forward_chunk(Lowering lowering, index_t rows) const {
  if (config_.chunk_bytes > 0) return chunk_for(lowering, rows, config_.chunk_bytes);
  if (lowered_bytes_per_image(lowering) >= kLargeImageBytes) return 1;
  return chunk_for(lowering, rows, kChunkTargetBytes);
}

index_t ConvolutionLayer::backward_chunk(Lowering lowering, index_t rows) const {
  return chunk_for(lowering, rows,
                   config_.chunk_bytes > 0 ? config_.chunk_bytes : kChunkTargetBytes);
}

index_t ConvolutionLayer::forward_chunk(index_t rows) const {
  return forward_chunk(lowering_, rows);
}

index_t ConvolutionLayer::backward_chunk(index_t rows) const {
  return backward_chunk(lowering_, rows);
}

}  // namespace hn
