// The Layer base class: the error-message prefix and the input-count check every layer uses;
// the totals of batch sums.
#include "lib/layers/layer.h"

#include <fmt/format.h>

#include "lib/core/check.h"

namespace hn {

std::string Layer::describe() const {
  return fmt::format("layer '{}' ({})", name_, type());
}

void Layer::check_input_count(const std::vector<Shape>& inputs, int min_count,
                              int max_count) const {
  const int count = static_cast<int>(inputs.size());
  if (min_count == max_count) {
    HN_CHECK(count == min_count, "{}: takes {} input{}, got {}", describe(), min_count,
             min_count == 1 ? "" : "s", count);
  } else {
    HN_CHECK(count >= min_count && count <= max_count, "{}: takes {} to {} inputs, got {}",
             describe(), min_count, max_count, count);
  }
}

void Layer::fuse_norm(std::optional<FusedNorm> fused) {
  HN_CHECK(!fused, "{}: cannot run a norm chain as its calls", describe());
}

void Layer::fuse_relu(std::optional<FusedRelu> fused) {
  HN_CHECK(!fused, "{}: cannot run a rectifier as its calls", describe());
}

void Layer::fuse_activation(std::optional<FusedActivation> fused) {
  HN_CHECK(!fused, "{}: cannot run an activation as its calls", describe());
}

void Layer::fuse_residual(std::optional<FusedResidual> fused) {
  HN_CHECK(!fused, "{}: cannot run a residual sum as its calls", describe());
}

void Layer::fold_norm(std::optional<FoldedNorm> folded) {
  HN_CHECK(!folded, "{}: cannot take a norm chain into its weights", describe());
}

void sum_rows(Driver& driver, index_t rows, index_t width, const float* row_sums, float* total) {
  if (width == 0) return;
  if (rows == 0) {
    driver.fill(width, 0.0f, total);
    return;
  }
  // Per column over the rows: bias_backward's sum over [rows][width][1].
  driver.bias_backward(AxisShape{rows, width, 1}, row_sums, 0.0f, total);
}

}  // namespace hn
