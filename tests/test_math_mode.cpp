// Math modes (hn::MathMode, NetOptions::math, the prototxt's `math`): parsing, where a net's
// mode comes from, that a net sets it on its drivers before each layer it runs (drivers may
// serve nets of different modes), the drivers' notes, and that on the CPU, which computes
// FP32 in every mode, TF32 and BF16 nets compute the FP32 results bitwise, split or not.
// The GPU's TF32 and BF16 arithmetic is tested in tests/cuda.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/net/net.h"
#include "tests/net_runs.h"
#include "tests/support.h"

namespace hn {
namespace {

std::string lenet_path() {
  return fmt::format("{}/mnist_lenet_train_test.prototxt", HYBRIDNN_MODELS_DIR);
}

// LeNet's prototxt with `math: MODE` added, in `dir`.
std::string lenet_with_math(const test::TempDir& dir, const std::string& mode) {
  std::ifstream in(lenet_path());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return dir.write("lenet_" + mode + ".prototxt", "math: " + mode + "\n" + text);
}

NetOptions synthetic(std::optional<MathMode> math = std::nullopt) {
  NetOptions options;
  options.data_source = "synthetic:1x28x28";
  options.batch_size = 4;
  options.math = math;
  return options;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("math modes parse in any case, and anything else is an error naming the choices",
          "[math]") {
  CHECK(parse_math_mode("fp32") == MathMode::fp32);
  CHECK(parse_math_mode("TF32") == MathMode::tf32);
  CHECK(parse_math_mode("Bf16") == MathMode::bf16);
  for (const MathMode mode : {MathMode::fp32, MathMode::tf32, MathMode::bf16})
    CHECK(parse_math_mode(math_mode_name(mode)) == mode);
  CHECK_THROWS_WITH(parse_math_mode("fp16"),
                    Catch::Contains("'fp16'") && Catch::Contains("FP32, TF32 or BF16"));
  CHECK_THROWS_AS(parse_math_mode(""), Error);
}

TEST_CASE(
    "a net's math mode comes from its options, else its prototxt, else FP32, and is set on its "
    "drivers before each layer",
    "[math]") {
  const test::TempDir dir;
  Runtime runtime;
  Driver& cpu = runtime.add(Device::parse("cpu"));
  Net plain(lenet_path(), runtime, cpu, synthetic());
  CHECK(plain.math_mode() == MathMode::fp32);
  CHECK(plain.math_notes().empty());
  Net from_file(lenet_with_math(dir, "BF16"), runtime, cpu, synthetic());
  CHECK(from_file.math_mode() == MathMode::bf16);
  Net overridden(lenet_with_math(dir, "BF16"), runtime, cpu, synthetic(MathMode::tf32));
  CHECK(overridden.math_mode() == MathMode::tf32);
  // The CPU has no TF32: it says it computes FP32.
  const std::vector<std::string> notes = overridden.math_notes();
  REQUIRE(notes.size() == 1);
  CHECK_THAT(notes[0],
             Catch::Contains("cpu") && Catch::Contains("computes FP32") && Catch::Contains("TF32"));
  // One driver, three nets: each sets its own mode as it runs.
  from_file.forward();
  CHECK(cpu.math_mode() == MathMode::bf16);
  overridden.forward_layer(0);
  CHECK(cpu.math_mode() == MathMode::tf32);
  plain.forward();
  plain.backward();
  CHECK(cpu.math_mode() == MathMode::fp32);
  from_file.backward_layer(from_file.num_layers() - 1);
  CHECK(cpu.math_mode() == MathMode::bf16);
}

TEST_CASE(
    "on the CPU, TF32 and BF16 nets compute the FP32 losses and gradients bitwise, unsplit and "
    "split between cpu and cpu:1",
    "[math]") {
  Runtime runtime;
  Driver& cpu = runtime.add(Device::parse("cpu"));
  runtime.add(Device::parse("cpu:1"));
  const char* file = "mnist_lenet_train_test.prototxt";
  for (const std::string split : {"", "cpu:0.625,cpu:1:0.375"}) {
    const test::NetGradients fp32 =
        test::net_gradients(runtime, cpu, file, "synthetic:1x28x28", 8, split, {}, MathMode::fp32);
    for (const MathMode mode : {MathMode::tf32, MathMode::bf16}) {
      INFO("split '" << split << "', " << math_mode_name(mode));
      const test::NetGradients other =
          test::net_gradients(runtime, cpu, file, "synthetic:1x28x28", 8, split, {}, mode);
      CHECK(std::memcmp(&other.loss, &fp32.loss, sizeof(float)) == 0);
      REQUIRE(other.gradients.size() == fp32.gradients.size());
      for (std::size_t g = 0; g < fp32.gradients.size(); ++g) {
        INFO("gradient " << g);
        CHECK(bitwise_equal(other.gradients[g], fp32.gradients[g]));
      }
    }
  }
}

}  // namespace hn
