// The option table (lib/solver/options.h): every option sets the structs of its kind by its
// key and no other, malformed values are errors naming the key, and the C ABI's header
// documents exactly the table's keys (and the net's own `weights`).
#include <catch2/catch.hpp>

#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "hybridnn/error.h"
#include "lib/core/text.h"
#include "lib/solver/options.h"

namespace hn {
namespace {

using Catch::Matchers::Contains;

// A valid value for an option that takes `value_name`.
std::string sample(const OptionSpec& spec) {
  const std::string name = spec.value_name;
  if (name == "on|off") return "off";
  if (name == "N") return "3";
  if (name == "MB") return "0.5";
  if (name == "train|test") return "test";
  if (name == "FP32|TF32|BF16") return "TF32";
  if (name == "nchw|blocked") return "blocked";
  if (name == "off|once|cached") return "once";
  if (name == "SPEC") return "cpu:0.5,cpu:1:0.5";
  if (name == "none|bf16") return "bf16";
  if (std::string(spec.key) == "split_file") return "";  // no file: no per-layer splits
  return "some_text";
}

// The keys a comment block of hybridnn_c.h lists: lines " *   key[, key]  ..." between the
// line holding `first` and the line holding `last`.
std::set<std::string> documented_keys(const std::string& first, const std::string& last) {
  std::ifstream in(std::string(HYBRIDNN_SOURCE_DIR) + "/include/hybridnn/hybridnn_c.h");
  std::set<std::string> keys;
  bool inside = false;
  const std::regex entry(R"(^ \*   ([a-z_]+(, [a-z_]+)*)[ ]+\S)");
  for (std::string line; std::getline(in, line);) {
    if (line.find(first) != std::string::npos) inside = true;
    if (!inside) continue;
    if (line.find(last) != std::string::npos) break;
    std::smatch match;
    if (!std::regex_search(line, match, entry)) continue;
    for (const std::string& key : detail::split_commas(match[1], detail::EmptyItems::drop))
      keys.insert(key.substr(key.find_first_not_of(' ')));
  }
  return keys;
}

std::set<std::string> table_keys(unsigned use) {
  std::set<std::string> keys;
  for (const OptionSpec& spec : option_specs())
    if ((spec.use & use) != 0) keys.insert(spec.key);
  return keys;
}

}  // namespace

TEST_CASE("every option sets the structs of its kind by its key, and no other", "[options]") {
  for (const OptionSpec& spec : option_specs()) {
    INFO(spec.key << " = '" << sample(spec) << "'");
    NetOptions net;
    SolverOptions solver;
    CHECK(set_option(net, spec.key, sample(spec)) == ((spec.use & kNetOption) != 0));
    CHECK(set_option(solver, spec.key, sample(spec)) == ((spec.use & kSolverOption) != 0));
    CHECK(std::string(spec.help).size() > 10);
  }
  NetOptions net;
  CHECK_FALSE(set_option(net, "bach", "3"));
  REQUIRE(set_option(net, "batch", "7"));
  CHECK(net.batch_size == 7);
  REQUIRE(set_option(net, "math", "bf16"));
  CHECK(net.math == MathMode::bf16);
  REQUIRE(set_option(net, "stage", "a,,b"));
  CHECK(net.state.stages == std::vector<std::string>{"a", "b"});
  SolverOptions solver;
  REQUIRE(set_option(solver, "layout", "blocked"));
  CHECK(solver.blocked_layout);
  REQUIRE(set_option(solver, "bucket_bytes", "4096"));
  CHECK(solver.bucket_bytes == 4096u);
  REQUIRE(set_option(solver, "bucket_mb", "1.5"));
  CHECK(solver.bucket_bytes == 3u * 512u * 1024u);
  CHECK(solver.grad_compress == GradCompression::none);
  REQUIRE(set_option(solver, "grad_compress", "bf16"));
  CHECK(solver.grad_compress == GradCompression::bf16);
  REQUIRE(set_option(solver, "model_parallel", "fc6,,fc7"));
  CHECK(solver.model_parallel == std::vector<std::string>{"fc6", "fc7"});
  REQUIRE(set_option(solver, "data", "synthetic:1x4x4"));
  CHECK(solver.data == "synthetic:1x4x4");
  CHECK(solver.train_data.empty());
  CHECK(option_keys(kNetOption).rfind("phase, level, stage, batch", 0) == 0);
}

TEST_CASE("a malformed option value is an error naming the key and what it takes", "[options]") {
  NetOptions net;
  CHECK_THROWS_WITH(set_option(net, "batch", "three"),
                    Contains("batch") && Contains("three") && Contains("integer"));
  CHECK_THROWS_WITH(set_option(net, "fuse", "maybe"), Contains("fuse") && Contains("on or off"));
  CHECK_THROWS_WITH(set_option(net, "math", "fp16"),
                    Contains("math") && Contains("FP32, TF32 or BF16"));
  CHECK_THROWS_WITH(set_option(net, "phase", "tset"), Contains("train or test"));
  SolverOptions solver;
  CHECK_THROWS_WITH(set_option(solver, "bucket_bytes", "0"), Contains("bucket_bytes"));
  for (const char* mb : {"0", "-1", "nan", "1e9", "2x", ""})
    CHECK_THROWS_WITH(set_option(solver, "bucket_mb", mb),
                      Contains("bucket_mb") && Contains("MiB"));
  CHECK_THROWS_AS(set_option(solver, "split", "cpu:0.5,cpu:0.5"), Error);
  CHECK_THROWS_WITH(set_option(solver, "grad_compress", "fp8"),
                    Contains("grad_compress") && Contains("none or bf16") && Contains("fp8"));
}

TEST_CASE("the C ABI's header documents exactly the table's keys", "[options]") {
  std::set<std::string> net = table_keys(kNetOption);
  net.insert("weights");  // the C ABI's own: caffemodels loaded once the net is built
  CHECK(documented_keys("Options of a net", "hn_net_options_create") == net);
  CHECK(documented_keys("Options of a solver", "hn_solver_options_create") ==
        table_keys(kSolverOption));
}

}  // namespace hn
