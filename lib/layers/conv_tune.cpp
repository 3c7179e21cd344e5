// Measured choice of a convolution's algorithms (ConvolutionLayer::tune): each candidate
// timed per direction on the layer's shapes, the fastest kept in the tuning cache.
#include "lib/layers/conv_algorithm.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "lib/core/check.h"
#include "lib/core/tensor.h"

namespace hn {

namespace {

// A candidate whose scratch would exceed this is not measured (type 3 of a large early layer
// asks for gigabytes); the cost model would not pick it either.
constexpr std::size_t kMaxTuneWorkspace = std::size_t{512} << 20;

// Deterministic values in [-1, 1) for the tensors the measurements run on.
std::vector<float> tune_values(index_t count, std::uint32_t seed) {
  std::vector<float> values(static_cast<std::size_t>(count));
  std::uint32_t state = seed * 2654435761u + 1u;
  for (float& v : values) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
  return values;
}

Buffer tune_buffer(Driver& driver, index_t count, std::uint32_t seed) {
  Buffer buffer(driver, detail::floats_bytes(count));
  if (count == 0) return buffer;
  if (seed == 0) {
    driver.fill(count, 0.0f, buffer.as<float>());
  } else {
    const std::vector<float> values = tune_values(count, seed);
    driver.copy_from_host(buffer.address(), values.data(), buffer.bytes());
  }
  return buffer;
}

}  // namespace

void ConvolutionLayer::tune(Driver& driver, index_t rows, Tuner& tuner) {
  if (tuner.mode() == TuneMode::off || rows <= 0) return;
  const ConvGeometry& geo = geometry_;
  const bool blocked = blocked_on(driver);
  std::vector<Lowering> options = candidates(driver);
  options.erase(
      std::remove_if(options.begin(), options.end(),
                     [&](Lowering l) { return workspace_for(l, rows) > kMaxTuneWorkspace; }),
      options.end());
  if (options.size() < 2) return;
  const std::string shape = fmt::format(
      "Convolution {}x{}x{}x{} out {} kernel {}x{} stride {}x{} pad {}x{} dilation {}x{} group "
      "{} bias {}",
      rows, geo.channels, geo.height, geo.width, config_.num_output, geo.kernel_h, geo.kernel_w,
      geo.stride_h, geo.stride_w, geo.pad_h, geo.pad_w, geo.dilation_h, geo.dilation_w,
      config_.group, has_bias() ? 1 : 0);
  // Blocked operands: their layouts (input, output) are part of the shape.
  const std::string layouts =
      blocked ? fmt::format(" layout {}/{}", layout_name(in_layout_), layout_name(out_layout_))
              : std::string();
  // A fused residual sum changes what the forward costs, by algorithm.
  const std::string sum = residual_ ? " residual" : "";
  const auto key = [&](ConvDirection d) { return shape + layouts + sum + " " + direction_name(d); };
  std::array<Lowering, 3> choice{};
  bool cached = true;
  for (ConvDirection d : kConvDirections) {
    const std::optional<std::string> hit = tuner.lookup(driver, key(d));
    const auto known = std::find_if(options.begin(), options.end(), [&](Lowering l) {
      return hit.has_value() && *hit == hn::lowering_name(l);
    });
    if (known == options.end()) {
      cached = false;
      break;
    }
    choice[static_cast<std::size_t>(d)] = *known;
  }
  const auto started = std::chrono::steady_clock::now();
  if (!cached) {
    const index_t in_count = rows * geo.channels * geo.height * geo.width;
    const index_t out_count = rows * config_.num_output * geo.out_h * geo.out_w;
    const index_t weight_count = params_[0].shape().count();
    const index_t bias_count = has_bias() ? config_.num_output : 0;
    std::size_t scratch = 0;
    for (Lowering l : options)
      scratch = std::max(scratch, workspace_for(l, rows));
    // y and dx are only written (by different directions): they share one buffer, which
    // keeps the measurements' memory below the net's own for its largest layers.
    const Buffer x = tune_buffer(driver, in_count, 1), dy = tune_buffer(driver, out_count, 2);
    const Buffer written = tune_buffer(driver, std::max(in_count, out_count), 0);
    const Buffer w = tune_buffer(driver, weight_count, 3),
                 dw = tune_buffer(driver, weight_count, 0);
    const Buffer b = tune_buffer(driver, bias_count, 4), db = tune_buffer(driver, bias_count, 0);
    const Buffer r = tune_buffer(driver, residual_ ? out_count : 0, 5);
    const Buffer workspace(driver, scratch);
    LayerSlice slice;
    slice.driver = &driver;
    slice.end = rows;
    slice.inputs = {Operand{Shape{rows, geo.channels, geo.height, geo.width}, x.pointer(),
                            written.pointer(), blocked ? in_layout_ : Layout::nchw}};
    slice.outputs = {Operand{Shape{rows, config_.num_output, geo.out_h, geo.out_w},
                             written.pointer(), dy.pointer(),
                             blocked ? out_layout_ : Layout::nchw}};
    if (residual_) {
      slice.inputs.push_back(
          Operand{slice.outputs[0].shape, r.pointer(), Pointer{}, slice.outputs[0].layout});
    }
    slice.params = {Operand{params_[0].shape(), w.pointer(), dw.pointer()}};
    // One version for the measurements' weights, as a net's have between two updates: what
    // a driver makes of them once per version (oneDNN's layout, Winograd's transformed
    // kernels) is made at the warm-up, as in inference, where it is made once for good.
    // (A training step pays it once per iteration: small against a batch's convolution.)
    slice.params[0].version = SyncedMemory::next_version();
    if (has_bias())
      slice.params.push_back(Operand{Shape{config_.num_output}, b.pointer(), db.pointer()});
    slice.propagate_down = {true};
    slice.workspace = workspace.pointer();
    // Each candidate's time per direction (its warm-up's where it was not timed again).
    std::vector<std::array<double, 3>> times(options.size());
    for (ConvDirection d : kConvDirections) {
      std::vector<std::function<void()>> runs;
      for (const Lowering l : options) {
        runs.emplace_back([&, l, d] {
          switch (d) {
            case ConvDirection::forward:
              run_forward(slice, l);
              break;
            case ConvDirection::backward_data:
              run_backward(slice, l, Wanted{true, false, false});
              break;
            case ConvDirection::backward_weights:
              run_backward(slice, l, Wanted{false, true, has_bias()});
              break;
          }
        });
      }
      // The candidates take turns (Tuner::race), so that a slow moment of the machine does
      // not fall on one of them alone.
      const std::vector<double> seconds = Tuner::race(driver, runs);
      const auto dir = static_cast<std::size_t>(d);
      std::size_t fastest = 0;
      for (std::size_t i = 0; i < options.size(); ++i) {
        times[i][dir] = seconds[i];
        if (seconds[i] < seconds[fastest]) fastest = i;
      }
      choice[dir] = options[fastest];
    }
    choose_joint_backward(slice, options, times, choice);
  }
  // Under data parallelism every rank takes rank 0's choice (TuneOptions::agree).
  for (ConvDirection d : kConvDirections) {
    Lowering& mine = choice[static_cast<std::size_t>(d)];
    const std::string agreed = tuner.agree(hn::lowering_name(mine));
    const auto known = std::find_if(options.begin(), options.end(),
                                    [&](Lowering l) { return agreed == hn::lowering_name(l); });
    HN_CHECK(known != options.end(),
             "{}: the {} algorithm agreed on, '{}', is not one that {} has for this shape",
             describe(), direction_name(d), agreed, driver.name());
    if (!cached || *known != mine) tuner.record(driver, key(d), agreed);
    mine = *known;
  }
  chosen_[driver.name()] = choice;
  TuneReport report;
  report.layer = name();
  report.device = driver.name();
  report.algorithm = algorithm(driver);
  report.measured = !cached;
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  tuner.report(report);
}

// One algorithm may compute both gradients in one call faster than the two apart (the CPU
// driver's NCHW pointwise kernels read dy once for both: its layers of few channels wait on
// memory). Where the directions' winners differ, each candidate whose two times sum to less
// than 1.5 times theirs is timed computing both, and the fastest way is kept.
void ConvolutionLayer::choose_joint_backward(const LayerSlice& slice,
                                             const std::vector<Lowering>& options,
                                             const std::vector<std::array<double, 3>>& times,
                                             std::array<Lowering, 3>& choice) const {
  const auto data = static_cast<std::size_t>(ConvDirection::backward_data);
  const auto weights = static_cast<std::size_t>(ConvDirection::backward_weights);
  if (choice[data] == choice[weights]) return;
  const auto time_of = [&](Lowering l, std::size_t d) {
    const auto at = std::find(options.begin(), options.end(), l);
    return times[static_cast<std::size_t>(at - options.begin())][d];
  };
  double best = time_of(choice[data], data) + time_of(choice[weights], weights);
  const double apart = best;
  for (std::size_t i = 0; i < options.size(); ++i) {
    if (!(times[i][data] + times[i][weights] < 1.5 * apart)) continue;
    const Lowering l = options[i];
    const double seconds = Tuner::time(
        *slice.driver,
        [&] {
          run_backward(slice, l, Wanted{true, true, has_bias()});
        },
        2, std::min(0.5, 1.5 * best));
    if (seconds < best) {
      best = seconds;
      choice[data] = choice[weights] = l;
    }
  }
}

}  // namespace hn
