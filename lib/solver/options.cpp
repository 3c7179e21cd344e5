// The option table (options.h): one entry per option, with the setter of each struct that
// takes it.
#include "lib/solver/options.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>

#include "lib/core/check.h"
#include "lib/core/text.h"
#include "lib/core/tune.h"

namespace hn {

namespace {

bool on_off(const std::string& key, const std::string& value) {
  if (value == "on" || value == "true" || value == "1") return true;
  if (value == "off" || value == "false" || value == "0") return false;
  detail::fail("option {}: expected on or off, got '{}'", key, value);
}

long long integer(const std::string& key, const std::string& value, long long min, long long max) {
  std::size_t used = 0;
  long long number = 0;
  try {
    number = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  HN_CHECK(used != 0 && used == value.size() && number >= min && number <= max,
           "option {}: expected an integer in [{}, {}], got '{}'", key, min, max, value);
  return number;
}

bool blocked(const std::string& key, const std::string& value) {
  if (value == "blocked") return true;
  if (value == "nchw") return false;
  detail::fail("option {}: expected nchw or blocked, got '{}'", key, value);
}

Phase phase(const std::string& key, const std::string& value) {
  if (value == "train") return Phase::train;
  if (value == "test") return Phase::test;
  detail::fail("option {}: expected train or test, got '{}'", key, value);
}

// A positive number of MiB as bytes (at least 4: one float).
std::size_t megabytes(const std::string& key, const std::string& value) {
  char* end = nullptr;
  const double mb = std::strtod(value.c_str(), &end);
  HN_CHECK(end != value.c_str() && *end == '\0' && std::isfinite(mb) && mb > 0 && mb < 1e6,
           "option {}: expected a positive number of MiB, got '{}'", key, value);
  return static_cast<std::size_t>(std::max(4.0, mb * 1024.0 * 1024.0));
}

MathMode math(const std::string& key, const std::string& value) {
  try {
    return parse_math_mode(value);
  } catch (const Error& error) {
    detail::fail("option {}: {}", key, error.what());
  }
}

using NetSetter = void (*)(NetOptions&, const std::string& key, const std::string& value);
using SolverSetter = void (*)(SolverOptions&, const std::string& key, const std::string& value);

struct Entry {
  OptionSpec spec;
  NetSetter net;
  SolverSetter solver;
};

// The options both structs take, through the members they share.
template <class Options>
void set_split(Options& o, const std::string& k, const std::string& v) {
  try {
    o.split = v.empty() ? Split() : Split::parse(v);
  } catch (const Error& error) {
    detail::fail("option {}: {}", k, error.what());
  }
}
template <class Options>
void set_split_file(Options& o, const std::string&, const std::string& v) {
  o.layer_splits = v.empty() ? LayerSplits() : read_layer_splits(v);
}
template <class Options>
void set_tune(Options& o, const std::string& k, const std::string& v) {
  try {
    o.tune.mode = parse_tune_mode(v);
  } catch (const Error& error) {
    detail::fail("option {}: {}", k, error.what());
  }
}
template <class Options>
void set_tune_cache(Options& o, const std::string&, const std::string& v) {
  o.tune.cache_path = v;
}
template <class Options>
void set_layout(Options& o, const std::string& k, const std::string& v) {
  o.blocked_layout = blocked(k, v);
}
template <class Options>
void set_fuse(Options& o, const std::string& k, const std::string& v) {
  o.fuse_layers = on_off(k, v);
}
template <class Options>
void set_math(Options& o, const std::string& k, const std::string& v) {
  o.math = math(k, v);
}
template <class Options>
void set_mean_file(Options& o, const std::string&, const std::string& v) {
  o.mean_file = v;
}
template <class Options>
void set_seed(Options& o, const std::string& k, const std::string& v) {
  o.seed = static_cast<std::uint64_t>(integer(k, v, 0, 1LL << 62));
}

constexpr unsigned kBoth = kNetOption | kSolverOption;

const std::vector<Entry>& entries() {
  static const std::vector<Entry> table = {
      {{"phase", "train|test", "the net's phase (default train)", kNetOption},
       [](NetOptions& o, const std::string& k, const std::string& v) {
         o.state.phase = phase(k, v);
       },
       nullptr},
      {{"level", "N", "Caffe's NetState level (default 0)", kNetOption},
       [](NetOptions& o, const std::string& k, const std::string& v) {
         o.state.level = static_cast<int>(integer(k, v, -(1 << 30), 1 << 30));
       },
       nullptr},
      {{"stage", "S[,S2]", "Caffe's NetState stages, comma-separated", kNetOption},
       [](NetOptions& o, const std::string&, const std::string& v) {
         o.state.stages = detail::split_commas(v, detail::EmptyItems::drop);
       },
       nullptr},
      {{"batch", "N", "batch size of the Data and Input layers (default 0: the prototxt's)",
        kNetOption},
       [](NetOptions& o, const std::string& k, const std::string& v) {
         o.batch_size = static_cast<int>(integer(k, v, 0, 1 << 30));
       },
       nullptr},
      {{"data", "SRC",
        "source of every Data layer (LMDB dir, IDX or CIFAR-10 file, synthetic:CxHxW[:classes])",
        kBoth},
       [](NetOptions& o, const std::string&, const std::string& v) { o.data_source = v; },
       [](SolverOptions& o, const std::string&, const std::string& v) { o.data = v; }},
      {{"train_data", "SRC", "source of the training net's Data layers", kSolverOption},
       nullptr,
       [](SolverOptions& o, const std::string&, const std::string& v) { o.train_data = v; }},
      {{"test_data", "SRC", "source of the test nets' Data layers", kSolverOption},
       nullptr,
       [](SolverOptions& o, const std::string&, const std::string& v) { o.test_data = v; }},
      {{"mean_file", "FILE", "replaces transform_param.mean_file (none: drop it)", kBoth},
       set_mean_file<NetOptions>,
       set_mean_file<SolverOptions>},
      {{"force_backward", "on|off",
        "gradients for every blob, inputs included (default off: the prototxt's)", kNetOption},
       [](NetOptions& o, const std::string& k, const std::string& v) {
         o.force_backward = on_off(k, v);
       },
       nullptr},
      {{"reuse_memory", "on|off", "blobs share memory once their values are dead (default on)",
        kNetOption},
       [](NetOptions& o, const std::string& k, const std::string& v) {
         o.reuse_memory = on_off(k, v);
       },
       nullptr},
      {{"keep_blobs", "B[,B2]", "blobs whose memory is never reused, comma-separated", kNetOption},
       [](NetOptions& o, const std::string&, const std::string& v) {
         o.keep_blobs = detail::split_commas(v, detail::EmptyItems::drop);
       },
       nullptr},
      {{"snapshot_prefix", "PATH", "replaces the solver's snapshot_prefix", kSolverOption},
       nullptr,
       [](SolverOptions& o, const std::string&, const std::string& v) { o.snapshot_prefix = v; }},
      {{"max_iter", "N", "replaces the solver's max_iter (default 0: the solver's)", kSolverOption},
       nullptr,
       [](SolverOptions& o, const std::string& k, const std::string& v) {
         o.max_iter = static_cast<int>(integer(k, v, 0, 1LL << 30));
       }},
      {{"seed", "N", "the random seed (nets: 1701; solvers: 0, the solver's random_seed)", kBoth},
       set_seed<NetOptions>,
       set_seed<SolverOptions>},
      {{"split", "SPEC", "DEVICE:FRACTION,... or auto[:DEVICE,...]: the hybrid split", kBoth,
        nullptr,
        "split of each layer's batch among devices: DEVICE:FRACTION,... (e.g. "
        "cpu:0.5,reference:0.5), or auto[:DEVICE,...] to measure the fractions (auto: every "
        "device but the reference driver)"},
       set_split<NetOptions>,
       set_split<SolverOptions>},
      {{"split_file", "FILE", "per-layer splits saved by the tool's --split-save", kBoth, nullptr,
        "per-layer splits saved by --split-save (they override --split for their layers)"},
       set_split_file<NetOptions>,
       set_split_file<SolverOptions>},
      {{"tune", "off|once|cached",
        "measure each convolution's algorithms at the first forward (default off)", kBoth, "cached",
        "measure each convolution's algorithms at the first forward and keep the fastest: "
        "once (every run), cached (default: reuse the choices of earlier runs on this "
        "machine), off (the cost model)"},
       set_tune<NetOptions>,
       set_tune<SolverOptions>},
      {{"tune_cache", "FILE", "the file of the measured choices", kBoth, nullptr,
        "the file of cached choices (default $HYBRIDNN_TUNE_CACHE, else "
        "~/.cache/hybridnn/tune.txt; none: no file)"},
       set_tune_cache<NetOptions>,
       set_tune_cache<SolverOptions>},
      {{"layout", "nchw|blocked",
        "activations between CPU layers: nchw (default) or blocked (nChw16c/8c)", kBoth, "blocked",
        "activations between layers: blocked (default: nChw16c, or nChw8c without AVX-512, "
        "between the CPU layers that take it, reordered only at the edges) or nchw"},
       set_layout<NetOptions>,
       set_layout<SolverOptions>},
      {{"fuse", "on|off",
        "BatchNorm + Scale [+ ReLU] and Eltwise SUM + ReLU as one layer each (default on)", kBoth},
       set_fuse<NetOptions>,
       set_fuse<SolverOptions>},
      {{"math", "FP32|TF32|BF16",
        "how GEMMs and convolutions may round inside a call (default: the prototxt's math, "
        "else FP32; tensors stay FP32)",
        kBoth},
       set_math<NetOptions>,
       set_math<SolverOptions>},
      {{"model_parallel", "L[,L2]",
        "layers to cut across the ranks by their outputs, comma-separated (e.g. fc6,fc7,fc8): "
        "each rank holds its share of their weights, and activations move instead of their "
        "gradients",
        kBoth},
       [](NetOptions& o, const std::string&, const std::string& v) {
         o.model_parallel = detail::split_commas(v, detail::EmptyItems::drop);
       },
       [](SolverOptions& o, const std::string&, const std::string& v) {
         o.model_parallel = detail::split_commas(v, detail::EmptyItems::drop);
       }},
      {{"bucket_mb", "MB", "gradient bucket size for the allreduce in MiB (default 25)",
        kSolverOption},
       nullptr,
       [](SolverOptions& o, const std::string& k, const std::string& v) {
         o.bucket_bytes = megabytes(k, v);
       }},
      {{"grad_compress", "none|bf16",
        "gradients sent as BF16 with FP32 sums at every hop (half the bytes; the ring backend), "
        "or none (default)",
        kSolverOption},
       nullptr,
       [](SolverOptions& o, const std::string& k, const std::string& v) {
         if (v != "none" && v != "bf16")
           detail::fail("option {}: expected none or bf16, got '{}'", k, v);
         o.grad_compress = parse_grad_compression(v);
       }},
      {{"graphs", "on|off",
        "on a GPU alone, the training iterations after the first replay one recording of the "
        "forward and backward, a CUDA graph (default on)",
        kSolverOption},
       nullptr,
       [](SolverOptions& o, const std::string& k, const std::string& v) {
         o.graphs = on_off(k, v);
       }},
      {{"bucket_bytes", "N", "gradient bucket size for the allreduce (default 25 MiB)",
        kSolverOption},
       nullptr,
       [](SolverOptions& o, const std::string& k, const std::string& v) {
         o.bucket_bytes = static_cast<std::size_t>(integer(k, v, 1, 1LL << 40));
       }},
  };
  return table;
}

template <class Options, class Setter>
bool set(Options& options, Setter Entry::*setter, const std::string& key,
         const std::string& value) {
  for (const Entry& e : entries()) {
    if (key != e.spec.key || e.*setter == nullptr) continue;
    (e.*setter)(options, key, value);
    return true;
  }
  return false;
}

}  // namespace

const OptionSpec& option_spec(const std::string& key) {
  for (const OptionSpec& spec : option_specs()) {
    if (key == spec.key) return spec;
  }
  detail::fail("no option '{}' (options: {})", key, option_keys(kNetOption | kSolverOption));
}

const std::vector<OptionSpec>& option_specs() {
  static const std::vector<OptionSpec> specs = [] {
    std::vector<OptionSpec> out;
    for (const Entry& e : entries())
      out.push_back(e.spec);
    return out;
  }();
  return specs;
}

std::string option_keys(unsigned use) {
  std::string keys;
  for (const Entry& e : entries()) {
    if ((e.spec.use & use) == 0) continue;
    keys += (keys.empty() ? "" : ", ") + std::string(e.spec.key);
  }
  return keys;
}

bool set_option(NetOptions& options, const std::string& key, const std::string& value) {
  return set(options, &Entry::net, key, value);
}

bool set_option(SolverOptions& options, const std::string& key, const std::string& value) {
  return set(options, &Entry::solver, key, value);
}

}  // namespace hn
