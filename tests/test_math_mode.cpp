// Math modes (hn::MathMode, NetOptions::math, the prototxt's `math`): parsing, where a net's
// mode comes from, that a net sets it on its drivers before each layer it runs (drivers may
// serve nets of different modes), the drivers' notes, and on the CPU: TF32 computes the FP32
// results bitwise, BF16 its convolutions' products in BF16 where the CPU has it (within
// BF16's bound of FP32, split or not), else the FP32 results bitwise too.
// The GPU's TF32 and BF16 arithmetic is tested in tests/cuda.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/core/shapes.h"
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

double max_abs(const std::vector<float>& values) {
  double most = 0.0;
  for (const float v : values)
    most = std::max(most, static_cast<double>(std::fabs(v)));
  return most;
}

TEST_CASE(
    "on the CPU, TF32 nets compute the FP32 losses and gradients bitwise, BF16 nets the FP32 "
    "ones within BF16's rounding where the CPU has BF16 (else bitwise), unsplit and split "
    "between cpu and cpu:1",
    "[math]") {
  Runtime runtime;
  Driver& cpu = runtime.add(Device::parse("cpu"));
  runtime.add(Device::parse("cpu:1"));
  const bool bf16 = test::computes_bf16(cpu);
  WARN("cpu " << (bf16 ? "computes" : "has no")
              << " BF16 products: " << cpu.math_note(MathMode::bf16));
  // The note names the kernels' instructions: AMX where the CPU and the kernel have it (its
  // flag in /proc/cpuinfo; unless oneDNN is held below it), else AVX512_BF16.
  if (bf16 && std::getenv("ONEDNN_MAX_CPU_ISA") == nullptr) {
    std::ifstream cpuinfo("/proc/cpuinfo");
    const std::string flags((std::istreambuf_iterator<char>(cpuinfo)),
                            std::istreambuf_iterator<char>());
    const bool amx = flags.find(" amx_bf16") != std::string::npos;
    CHECK_THAT(cpu.math_note(MathMode::bf16), Catch::Contains(amx ? "(AMX)" : "(AVX512_BF16)"));
  }
  const char* file = "mnist_lenet_train_test.prototxt";
  std::vector<test::NetGradients> bf16_runs;
  for (const std::string split : {"", "cpu:0.625,cpu:1:0.375"}) {
    const test::NetGradients fp32 =
        test::net_gradients(runtime, cpu, file, "synthetic:1x28x28", 8, split, {}, MathMode::fp32);
    for (const MathMode mode : {MathMode::tf32, MathMode::bf16}) {
      INFO("split '" << split << "', " << math_mode_name(mode));
      const test::NetGradients other =
          test::net_gradients(runtime, cpu, file, "synthetic:1x28x28", 8, split, {}, mode);
      REQUIRE(other.gradients.size() == fp32.gradients.size());
      if (mode == MathMode::bf16 && bf16) {
        // conv2's inputs rounded to 8 significant bits, forward and backward: its output moves
        // by about 0.25 % (the bounds of each call are the next test's). The loss follows
        // closely. The gradients do not, element by element: where ReLU's input sits near 0
        // or two of a max pooling's inputs nearly tie, that rounding flips the mask or the
        // choice, and the whole gradient of that element moves (on an AMX Xeon, with every
        // forward output within 0.3 % of FP32's, the gradient of ip1's output moved by 5 %
        // of its norm and those below it by 8-10 %). So the gradients are held to their
        // norms, within 20 %.
        CHECK(std::fabs(other.loss - fp32.loss) <= 2e-2 * std::fabs(fp32.loss));
        bool differs = false;
        for (std::size_t g = 0; g < fp32.gradients.size(); ++g) {
          INFO("gradient " << g);
          double error = 0.0, norm = 0.0;
          for (std::size_t i = 0; i < fp32.gradients[g].size(); ++i) {
            const double d = static_cast<double>(other.gradients[g][i]) - fp32.gradients[g][i];
            error += d * d;
            norm += static_cast<double>(fp32.gradients[g][i]) * fp32.gradients[g][i];
          }
          CHECK(std::sqrt(error) <= 0.2 * std::sqrt(norm));
          differs = differs || !bitwise_equal(other.gradients[g], fp32.gradients[g]);
        }
        CHECK(differs);  // the BF16 kernels ran
        bf16_runs.push_back(other);
        continue;
      }
      CHECK(std::memcmp(&other.loss, &fp32.loss, sizeof(float)) == 0);
      for (std::size_t g = 0; g < fp32.gradients.size(); ++g) {
        INFO("gradient " << g);
        CHECK(bitwise_equal(other.gradients[g], fp32.gradients[g]));
      }
    }
  }
  // The split cuts the batch, not the rounding: BF16 split and unsplit differ only by the
  // order FP32 sums the weight gradients' slices in.
  if (bf16_runs.size() == 2) {
    const test::NetGradients& whole = bf16_runs[0];
    const test::NetGradients& cut = bf16_runs[1];
    CHECK(std::fabs(cut.loss - whole.loss) <= 1e-5 * std::fabs(whole.loss));
    for (std::size_t g = 0; g < whole.gradients.size(); ++g) {
      INFO("BF16 split against unsplit, gradient " << g);
      const double scale = max_abs(whole.gradients[g]);
      for (std::size_t i = 0; i < whole.gradients[g].size(); ++i)
        REQUIRE(std::fabs(cut.gradients[g][i] - whole.gradients[g][i]) <= 1e-4 * scale);
    }
  }
}

// The CPU driver's BF16 convolutions against the reference driver's FP32 ones: each
// product's inputs rounded to BF16 (8 significant bits: a relative error of at most 2^-8
// each), the sums in FP32, so |bf16 - fp32| <= (2^-7 + 2^-6 K 2^-24) sum |a b| over the
// products summed (bounded by the same convolution of the absolute values). Not bitwise
// FP32 anywhere the CPU has BF16; bitwise FP32 again in FP32 after.
TEST_CASE(
    "a CPU driver in BF16 math rounds its convolutions' inputs to BF16, within BF16's "
    "bound of FP32, computes FP32 bitwise again in FP32, and in BF16 where a call asks for "
    "FP32",
    "[math]") {
  Runtime runtime;
  Driver& cpu = runtime.add(Device::parse("cpu"));
  Driver& reference = runtime.add(Device::parse("reference"));
  const bool bf16 = test::computes_bf16(cpu);
  const auto shape = [](index_t batch, index_t channels, index_t size, index_t kernel, index_t pad,
                        index_t stride) {
    LoweringShape s;
    s.batch = batch;
    s.channels = channels;
    s.height = s.width = size;
    s.kernel_h = s.kernel_w = kernel;
    s.pad_h = s.pad_w = pad;
    s.stride_h = s.stride_w = stride;
    return s;
  };
  const std::pair<LoweringShape, index_t> cases[] = {{shape(4, 32, 12, 3, 1, 1), 32},
                                                     {shape(2, 64, 7, 1, 0, 1), 48},
                                                     {shape(3, 16, 11, 5, 2, 2), 32}};
  std::uint32_t seed = 91;
  for (const auto& conv_case : cases) {
    // Named, not bound: lambdas below capture them (C++17 cannot capture structured bindings).
    const LoweringShape& s = conv_case.first;
    const index_t out = conv_case.second;
    INFO(s.to_string() << " out_channels=" << out);
    const std::size_t x_count = static_cast<std::size_t>(s.image_count());
    const std::size_t w_count =
        static_cast<std::size_t>(out * s.channels * s.kernel_h * s.kernel_w);
    const std::size_t y_count = static_cast<std::size_t>(s.batch * out * s.out_h() * s.out_w());
    const std::vector<float> x = test::random_floats(x_count, seed++);
    const std::vector<float> w = test::random_floats(w_count, seed++);
    const std::vector<float> bias = test::random_floats(static_cast<std::size_t>(out), seed++);
    const std::vector<float> dy = test::random_floats(y_count, seed++);
    const auto absolute = [](std::vector<float> v) {
      for (float& e : v)
        e = std::fabs(e);
      return v;
    };
    // Each call on `driver` in `mode`, and its bound: the reference on absolute values.
    struct Results {
      std::vector<float> y, dx, dw, db;
    };
    const auto run_shape = [&](Driver& driver, MathMode mode, const LoweringShape& on,
                               const std::vector<float>& xs, const std::vector<float>& ws,
                               const std::vector<float>& bs, const std::vector<float>& dys) {
      driver.set_math_mode(mode);
      Results r{std::vector<float>(y_count), std::vector<float>(x_count),
                std::vector<float>(w_count, 0.0f),
                std::vector<float>(static_cast<std::size_t>(out), 0.0f)};
      driver.conv_forward(on, out, xs.data(), ws.data(), bs.data(), r.y.data());
      driver.conv_backward_data(on, out, ws.data(), dys.data(), r.dx.data());
      driver.conv_backward_weights(on, out, xs.data(), dys.data(), r.dw.data(), r.db.data());
      driver.set_math_mode(MathMode::fp32);
      return r;
    };
    const auto run = [&](Driver& driver, MathMode mode, const std::vector<float>& xs,
                         const std::vector<float>& ws, const std::vector<float>& bs,
                         const std::vector<float>& dys) {
      return run_shape(driver, mode, s, xs, ws, bs, dys);
    };
    const Results exact = run(reference, MathMode::fp32, x, w, bias, dy);
    const Results bound =
        run(reference, MathMode::fp32, absolute(x), absolute(w), absolute(bias), absolute(dy));
    const Results fp32 = run(cpu, MathMode::fp32, x, w, bias, dy);
    const Results half = run(cpu, MathMode::bf16, x, w, bias, dy);
    const Results again = run(cpu, MathMode::fp32, x, w, bias, dy);
    // The measured choice's direct_fp32: the FP32 calls, bitwise, in BF16 math.
    LoweringShape fp32_kernel = s;
    fp32_kernel.fp32_kernel = true;
    const Results asked_fp32 = run_shape(cpu, MathMode::bf16, fp32_kernel, x, w, bias, dy);
    const std::pair<const char*, std::vector<float> Results::*> outputs[] = {
        {"y", &Results::y},
        {"dx", &Results::dx},
        {"dweights", &Results::dw},
        {"dbias", &Results::db}};
    for (const auto& [name, member] : outputs) {
      INFO(name);
      CHECK(bitwise_equal(again.*member, fp32.*member));
      CHECK(bitwise_equal(asked_fp32.*member, fp32.*member));
      // Where the CPU has BF16 kernels every direction runs one (the bias gradient may come
      // from FP32 sums of dy): AMX's forward kernels (oneDNN's brgconv) were once taken for
      // FP32 ones and left out, so the forward computed FP32 there.
      if (member != &Results::db) CHECK(bitwise_equal(half.*member, fp32.*member) == !bf16);
      const std::vector<float>& got = half.*member;
      const std::vector<float>& want = exact.*member;
      const std::vector<float>& sums = bound.*member;
      for (std::size_t i = 0; i < got.size(); ++i) {
        const double allowed = (bf16 ? 0x1p-7 : 0.0) * sums[i] + 1e-5 * sums[i] + 1e-6;
        if (std::fabs(static_cast<double>(got[i]) - want[i]) > allowed) {
          FAIL_CHECK("element " << i << ": " << got[i] << ", the reference's " << want[i]
                                << ", allowed " << allowed);
          break;
        }
      }
    }
  }
}

}  // namespace hn
