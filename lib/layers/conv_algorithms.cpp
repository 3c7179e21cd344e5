// The convolution algorithms in the order they are tried, ending with the plainest (as
// oneDNN's implementation lists are), and the look-up by Lowering.
#include "lib/layers/conv_algorithm.h"

namespace hn::detail {

const std::vector<const ConvAlgorithm*>& conv_algorithms() {
  static const std::vector<const ConvAlgorithm*> list{
      &conv_direct(),  // the driver's own convolution: moves no lowered bytes
      &conv_direct_plain(), &conv_winograd(),   &conv_pointwise(),
      &conv_direct_fp32(),  &conv_direct_1x1(), &conv_type3(),
      &conv_type1(),  // always applies
  };
  return list;
}

const ConvAlgorithm& conv_algorithm(Lowering lowering) {
  for (const ConvAlgorithm* algorithm : conv_algorithms()) {
    if (algorithm->id() == lowering) return *algorithm;
  }
  fail("internal error: no convolution algorithm for lowering {}", lowering_name(lowering));
}

}  // namespace hn::detail
