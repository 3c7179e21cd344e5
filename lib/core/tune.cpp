// The tuning cache: one line per measured choice, "machine<TAB>driver<TAB>key<TAB>choice",
// where machine is the CPU model, its widest vector extension, the library version and the
// kernels' revision (kKernelsRevision), and
// driver is the driver's description (its thread count, BLAS, GPU). The model name alone
// does not tell the machine: "AMD EPYC" is the model of EPYCs with AVX-512 and without,
// whose fastest algorithms differ (no Winograd without AVX-512).
#include "lib/core/tune.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "lib/core/check.h"
#include "lib/core/driver.h"
#include "lib/core/files.h"
#include "lib/core/text.h"
#include "lib/core/version.h"

namespace hn {

const char* tune_mode_name(TuneMode mode) {
  switch (mode) {
    case TuneMode::off:
      return "off";
    case TuneMode::once:
      return "once";
    case TuneMode::cached:
      return "cached";
  }
  return "unknown";
}

TuneMode parse_tune_mode(const std::string& text) {
  for (TuneMode mode : {TuneMode::off, TuneMode::once, TuneMode::cached}) {
    if (text == tune_mode_name(mode)) return mode;
  }
  detail::fail("tune mode '{}' is not one of off, once, cached", text);
}

std::string default_tune_cache_path() {
  const auto set = [](const char* name) -> std::string {
    const char* value = std::getenv(name);
    return value != nullptr ? value : "";
  };
  if (std::string path = set("HYBRIDNN_TUNE_CACHE"); !path.empty()) return path;
  if (std::string xdg = set("XDG_CACHE_HOME"); !xdg.empty()) return xdg + "/hybridnn/tune.txt";
  if (std::string home = set("HOME"); !home.empty()) return home + "/.cache/hybridnn/tune.txt";
  return "";
}

namespace {

// Bumped when a driver's kernels change which candidate wins, so that choices measured
// against the old kernels are measured again (2: the CPU driver's own depthwise weight
// gradient, where oneDNN's GEMM-based one had lost to direct_plain; 3: the activation fused
// into the convolution, and blocked calls kept blocked where channels-last reordered; 4: the
// CPU driver's Winograd convolution, and the weights measured with a version of their own; 5:
// its pointwise (1x1) convolution; 6: denormals flushed in the CPU driver's calls, whose
// assists had slowed some candidates 5x on Intel cores, and the fused ReLU's three passes; 7:
// the CPU driver's own depthwise forward and data gradient on NCHW operands; 8: the same with
// four accumulators, ahead of oneDNN's at every ShuffleNet shape; 9: the CPU driver's own
// convolution of few input channels with column strides, ShuffleNet v2's conv1, and its
// pointwise kernel in 12 rows on AVX-512; 10: its pointwise kernels on NCHW operands; 11: its
// pointwise weight gradient in 8 rows on AVX-512, and candidates judged on their second call
// where the first exceeded the bound; 12: BF16 forward convolutions on AMX, which had run
// FP32, and direct_fp32 among the candidates in BF16; 13: the data gradient of few input
// channels lowered where oneDNN took its GEMM-based kernel, CaffeNet conv1's on AVX2).
constexpr int kKernelsRevision = 13;

constexpr char kHeader[] =
    "# hybridnn tuning cache: the fastest algorithm measured per machine, driver and shape.\n"
    "# Delete this file (or run with --tune once) to measure again.\n";

// The value of the first "<name> : value" line of /proc/cpuinfo ("" when none).
std::string cpuinfo_field(const std::string& name) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind(name, 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos || line.find_first_not_of(" \t", name.size()) != colon) continue;
    const auto start = line.find_first_not_of(' ', colon + 1);
    return start == std::string::npos ? "" : line.substr(start);
  }
  return "";
}

// "AMD EPYC (avx2)": the CPU's model and the widest of the vector extensions the CPU
// driver's kernels choose between.
std::string cpu_model() {
  std::string model = cpuinfo_field("model name");
  if (model.empty()) model = "unknown cpu";
  std::istringstream flags(" " + cpuinfo_field("flags") + " ");
  std::vector<std::string> have{std::istream_iterator<std::string>(flags),
                                std::istream_iterator<std::string>()};
  for (const char* isa : {"avx512f", "avx2", "avx", "sse4_2"}) {
    if (std::find(have.begin(), have.end(), isa) != have.end()) return model + " (" + isa + ")";
  }
  return model;
}

bool printable(const std::string& field) {
  return !field.empty() && field.find_first_of("\t\r\n") == std::string::npos;
}

std::string sanitized(std::string field) {
  std::replace_if(
      field.begin(), field.end(), [](char c) { return c == '\t' || c == '\n' || c == '\r'; }, ' ');
  return field;
}

// Entries of the cache file at `path` (none when it does not exist); a malformed line is an
// error naming the file and line.
std::map<std::string, std::string> read_cache(const std::string& path) {
  std::map<std::string, std::string> entries;
  if (!detail::input_exists(path)) return entries;
  std::ifstream file = detail::open_input_file(path, "tuning cache");
  std::string line;
  for (int number = 1; std::getline(file, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    const auto last_tab = line.rfind('\t');
    std::size_t tabs = static_cast<std::size_t>(std::count(line.begin(), line.end(), '\t'));
    HN_CHECK(tabs == 3 && last_tab + 1 < line.size(),
             "tuning cache '{}' line {}: expected 'machine<TAB>driver<TAB>shape<TAB>choice', got "
             "'{}' (delete the file to measure again)",
             path, number, detail::excerpt(line));
    entries[line.substr(0, last_tab)] = line.substr(last_tab + 1);
  }
  HN_CHECK(!file.bad(), "tuning cache '{}': read error", path);
  return entries;
}

// Seconds one call of `run` takes on `driver`, until the driver has finished it.
double seconds_of(Driver& driver, const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  driver.synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

Tuner::Tuner(TuneOptions options) : options_(std::move(options)) {
  path_ = options_.cache_path.empty() ? default_tune_cache_path() : options_.cache_path;
  if (path_ == "none") path_.clear();
  machine_ = sanitized(cpu_model() + ", hybridnn " + version() + " kernels " +
                       std::to_string(kKernelsRevision));
  if (options_.mode == TuneMode::cached && !path_.empty()) entries_ = read_cache(path_);
}

std::string Tuner::entry_key(const Driver& driver, const std::string& key) const {
  HN_ASSERT(printable(key));
  // A choice measured in one math mode is not the fastest in another (TF32 and BF16 run
  // on tensor cores); FP32 entries keep the form they had before modes existed.
  const std::string mode = driver.math_mode() == MathMode::fp32
                               ? std::string()
                               : std::string(", ") + math_mode_name(driver.math_mode()) + " math";
  return machine_ + '\t' + sanitized(driver.tuning_identity() + mode) + '\t' + key;
}

std::optional<std::string> Tuner::lookup(const Driver& driver, const std::string& key) const {
  if (options_.mode != TuneMode::cached) return std::nullopt;
  const auto found = entries_.find(entry_key(driver, key));
  if (found == entries_.end()) return std::nullopt;
  return found->second;
}

void Tuner::record(const Driver& driver, const std::string& key, const std::string& choice) {
  HN_CHECK(printable(choice), "tuning: choice '{}' for '{}' cannot be cached", choice, key);
  const std::string k = entry_key(driver, key);
  entries_[k] = choice;
  recorded_[k] = choice;
}

void Tuner::save() {
  if (recorded_.empty() || path_.empty()) return;
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  std::error_code ignored;
  if (!parent.empty()) std::filesystem::create_directories(parent, ignored);
  // Merge with what other runs wrote since this one read the file.
  std::map<std::string, std::string> merged = read_cache(path_);
  for (const auto& [key, choice] : recorded_)
    merged[key] = choice;
  std::ostringstream text;
  text << kHeader;
  for (const auto& [key, choice] : merged)
    text << key << '\t' << choice << '\n';
  detail::replace_file(path_, text.str(), "tuning cache");
  recorded_.clear();
}

double Tuner::time(Driver& driver, const std::function<void()>& run, int repeats,
                   double give_up_after) {
  constexpr double kFarOut = 4.0;  // a first call this many times the bound: not called again
  const auto once = [&] { return seconds_of(driver, run); };
  double best = once();  // warm-up: creates primitives, touches memory
  if (best > give_up_after) {
    // The first call pays what later ones do not (first touch of its buffers, a kernel's
    // layout of the weights): a candidate is judged on its second call, unless its first is
    // far out of the running. (The CPU driver's Winograd forward on ResNet-50's res5 layers,
    // AVX2: 81 ms first, 30 after, against 62 for the direct kernel; dropped at its first
    // call, it lost to a kernel half its speed in one net of three.)
    if (best > kFarOut * give_up_after) return best;
    best = once();
    if (best > give_up_after) return best;
  } else {
    best = std::min(best, once());
  }
  for (int i = 1; i < repeats; ++i)
    best = std::min(best, once());
  return best;
}

std::vector<double> Tuner::race(Driver& driver, const std::vector<std::function<void()>>& runs,
                                int rounds, double give_up_after) {
  constexpr double kFarOut = 4.0;  // a warm-up this many times the fastest: out of the race
  constexpr double kBehind = 1.5;  // a best this many times the fastest: out after 2 calls
  const auto once = [&](std::size_t i) { return seconds_of(driver, runs[i]); };
  std::vector<double> best(runs.size());
  for (std::size_t i = 0; i < runs.size(); ++i)
    best[i] = once(i);
  if (runs.empty()) return best;
  const double fastest_warm_up = *std::min_element(best.begin(), best.end());
  std::vector<bool> racing(runs.size());
  for (std::size_t i = 0; i < runs.size(); ++i)
    racing[i] = best[i] <= kFarOut * fastest_warm_up;
  for (int round = 0; round < rounds; ++round) {
    const double fastest = *std::min_element(best.begin(), best.end());
    for (std::size_t i = 0; i < runs.size(); ++i) {
      if (!racing[i]) continue;
      // Round 0 is every candidate's second call, which judges it (see time()).
      if (round > 0 && (best[i] > kBehind * fastest || best[i] > give_up_after)) {
        racing[i] = false;
        continue;
      }
      best[i] = std::min(best[i], once(i));
    }
  }
  return best;
}

void Tuner::report(const TuneReport& report) const {
  if (options_.on_layer) options_.on_layer(report);
}

}  // namespace hn
