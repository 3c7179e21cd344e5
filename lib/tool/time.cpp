// `hybridnn time`: Caffe's `caffe time`. A warm-up forward and backward, then per-layer
// forward and backward milliseconds averaged over the iterations, with the driver
// synchronised after each layer so every layer is charged its own work; with a split, also
// each device's share of every layer (rows, busy and waiting time, copies).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "hybridnn/error.h"
#include "lib/tool/tool.h"

namespace hn::tool {
namespace {

using Clock = std::chrono::steady_clock;

double milliseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

Phase parse_phase(const std::string& text) {
  if (text == "train" || text == "TRAIN") return Phase::train;
  if (text == "test" || text == "TEST") return Phase::test;
  throw UsageError(fmt::format("--phase expects train or test, got '{}'", text));
}

// --timeline: the spans of every rank, gathered on rank 0 and written as a Chrome trace
// (chrome://tracing, Perfetto): per rank (pid) a compute row (each layer's forward and
// backward) and a communication row (each bucket's allreduce).
class Timeline {
 public:
  enum Row { forward = 0, backward = 1, allreduce = 2 };

  explicit Timeline(Clock::time_point origin) : origin_(origin) {}
  void add(int name, Row row, Clock::time_point start, Clock::time_point end) {
    const double start_us = std::chrono::duration<double, std::micro>(start - origin_).count();
    const double duration_us = std::chrono::duration<double, std::micro>(end - start).count();
    // Six floats per span, each exact enough: a collective carries them unchanged.
    const auto push_split = [this](double us) {
      const double high = std::floor(us / 65536.0);
      spans_.push_back(static_cast<float>(high));
      spans_.push_back(static_cast<float>(us - high * 65536.0));
    };
    spans_.push_back(static_cast<float>(name));
    spans_.push_back(static_cast<float>(row));
    push_split(start_us);
    push_split(duration_us);
  }
  // Collective: rank 0 writes `path` with every rank's spans; `names` names the span ids.
  void write(Communicator& comm, Driver& driver, const std::string& path,
             const std::vector<std::string>& names) {
    const std::vector<float> counts =
        allgather_host(comm, driver, {static_cast<float>(spans_.size() / 6)});
    const float most = *std::max_element(counts.begin(), counts.end());
    const std::size_t width = static_cast<std::size_t>(most) * 6;
    std::vector<float> padded(spans_);
    padded.resize(width, 0.0f);
    const std::vector<float> all = allgather_host(comm, driver, padded);
    if (comm.rank() != 0) return;
    note_if_fifo("--timeline", path);
    std::FILE* file = std::fopen(path.c_str(), "w");
    if (file == nullptr) throw Error(fmt::format("--timeline: cannot write '{}'", path));
    static const char* const kRows[] = {"forward", "backward", "allreduce"};
    std::string text = "{\"traceEvents\":[\n";
    bool first = true;
    for (int r = 0; r < comm.size(); ++r) {
      for (int row = 0; row < 2; ++row) {
        text += fmt::format(R"({}{{"name":"thread_name","ph":"M","pid":{},"tid":{},)"
                            R"("args":{{"name":"{}"}}}})",
                            first ? "" : ",\n", r, row, row == 0 ? "compute" : "communication");
        first = false;
      }
      text += fmt::format(
          R"(,{}{{"name":"process_name","ph":"M","pid":{},"args":{{"name":"rank {}"}}}})", "\n", r,
          r);
      const float* spans = all.data() + static_cast<std::size_t>(r) * width;
      for (std::size_t k = 0; k < static_cast<std::size_t>(counts[r]); ++k) {
        const float* span = spans + 6 * k;
        const auto name = static_cast<std::size_t>(span[0]);
        const int row = static_cast<int>(span[1]);
        const double start = static_cast<double>(span[2]) * 65536.0 + span[3];
        const double duration = static_cast<double>(span[4]) * 65536.0 + span[5];
        text += fmt::format(
            R"(,{}{{"name":{},"cat":"{}","ph":"X","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f}}})",
            "\n", json_string(name < names.size() ? names[name] : "?"), kRows[row], r,
            row == allreduce ? 1 : 0, start, duration);
      }
    }
    text += "\n]}\n";
    const bool written = std::fputs(text.c_str(), file) >= 0;
    if (std::fclose(file) != 0 || !written) {
      throw Error(fmt::format("--timeline: writing '{}' failed", path));
    }
  }

 private:
  Clock::time_point origin_;
  std::vector<float> spans_;
};

// The net's image inputs (Input layers' tops of 4 axes with more than one value per image)
// filled with uniform values in [-1, 1), the same every run, so kernels are timed on data
// like a real input's: on zeros every activation is zero, and costs that depend on the
// values (denormals on Intel cores) never show. Other inputs (labels, indices) keep their
// zeros. Returns the names filled.
std::vector<std::string> fill_image_inputs(Net& net) {
  std::vector<std::string> filled;
  for (const std::string& name : net.input_blob_names()) {
    const BlobRef blob = net.blob(name);
    const Shape& shape = *blob.shape;
    if (shape.axes() != 4 || shape.count() <= shape[0]) continue;
    std::mt19937 bits(0x1A9E5);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    float* data = blob.host_data_mut();
    for (index_t i = 0; i < blob.count(); ++i)
      data[i] = uniform(bits);
    filled.push_back(name);
  }
  return filled;
}

// The runs of layers cut alike that whole iterations make (the per-layer timing waits
// after every layer).
void print_layer_runs(const Net& net) {
  for (const bool backward : {false, true}) {
    std::string text;
    for (const std::vector<std::string>& run : net.layer_runs(backward))
      text += fmt::format("{}{}..{} ({} layers)", text.empty() ? "" : ", ", run.front(), run.back(),
                          run.size());
    fmt::print("Runs of layers cut alike in the total, {}: {}\n", backward ? "backward" : "forward",
               text.empty() ? "none (a wait after every layer)" : text);
  }
}

// Per layer and device, from the Net's split profile, averaged over `iterations`.
void print_split_profile(const Net& net, int iterations, bool json) {
  const double n = iterations;
  if (!json) {
    fmt::print("Split per layer and device:\n");
    fmt::print("{:>10}  {:<10} {:>6} {:>15} {:>16} {:>11} {:>9} {:>8}\n", "layer", "device", "rows",
               "forward busy ms", "backward busy ms", "waiting ms", "copy MB", "copy ms");
  }
  for (const LayerProfile& layer : net.profile()) {
    for (const SliceProfile& slice : layer.devices) {
      const double forward_busy = slice.forward_busy * 1e3 / n;
      const double backward_busy = slice.backward_busy * 1e3 / n;
      const double waiting = slice.waiting * 1e3 / n;
      const double copy_bytes = static_cast<double>(slice.copy_bytes) / n;
      const double copy_ms = slice.copy_seconds * 1e3 / n;
      if (json) {
        fmt::print(R"({{"layer":{},"device":{},"rows":{},"forward_busy_ms":{},)"
                   R"("backward_busy_ms":{},"waiting_ms":{},"copy_bytes":{},"copy_ms":{}}})"
                   "\n",
                   json_string(layer.name), json_string(slice.device.name()), slice.rows,
                   json_number(forward_busy), json_number(backward_busy), json_number(waiting),
                   json_number(copy_bytes), json_number(copy_ms));
      } else {
        fmt::print("{:>10}  {:<10} {:>6} {:>15.4f} {:>16.4f} {:>11.4f} {:>9.3f} {:>8.4f}\n",
                   layer.name, slice.device.name(), slice.rows, forward_busy, backward_busy,
                   waiting, copy_bytes / 1e6, copy_ms);
      }
    }
  }
}

int run_time(const Args& args) {
  const std::string model = args.required_text("model");
  const int iterations = static_cast<int>(args.integer("iterations", 50, 1, 1 << 30));
  const bool json = args.boolean("json", false);
  const Phase phase = parse_phase(args.text("phase", "train"));
  NetOptions options = net_options(args, phase);
  set_table_options(options, args, {"model_parallel"});
  options.force_backward = args.boolean("force-backward", true);
  const std::string graphs_flag = args.text("graphs", "on");
  if (graphs_flag != "on" && graphs_flag != "off")
    throw UsageError(fmt::format("--graphs: expected on or off, got '{}'", graphs_flag));
  const bool graphs = graphs_flag == "on";

  // Under mpirun: every rank times its own net, and backward overlaps the gradients'
  // allreduce as in training; rank 0 reports.
  Communicator& comm = chosen_communicator(args);
  const bool ranks = comm.size() > 1;
  options.communicator = &comm;
  Runtime runtime;
  configure_runtime(runtime, args);
  Net net(model, runtime, chosen_device(args, options.split, options.layer_splits), options);
  Driver& driver = net.driver();
  print_math_notes(net);
  const int layers = net.num_layers();
  std::unique_ptr<detail::GradientSync> sync;
  if (ranks)
    sync = std::make_unique<detail::GradientSync>(net, comm, chosen_bucket_bytes(args),
                                                  chosen_grad_compression(args));
  const std::string timeline_path = args.text("timeline");

  if (!json) {
    fmt::print("Timing {} ({} phase, batch {}) on {}{}\n", net.name(),
               phase == Phase::train ? "TRAIN" : "TEST", net.batch_size(), driver.description(),
               ranks ? fmt::format(", {} ranks ({}), {} gradient buckets", comm.size(), comm.name(),
                                   sync->num_buckets())
                     : std::string());
  }
  const std::vector<std::string> filled = fill_image_inputs(net);
  if (!json && !filled.empty()) {
    const bool one = filled.size() == 1;
    fmt::print("Input{} {} hold{} uniform random values in [-1, 1)\n", one ? "" : "s",
               fmt::join(filled, ", "), one ? "s" : "");
  }
  settle_splits(net, args, json);
  if (!json) fmt::print("Performing Forward\n");
  const float initial_loss = net.forward();
  if (!json) fmt::print("Initial loss: {}\nPerforming Backward\n", format_float(initial_loss));
  if (sync) {
    sync->backward(initial_loss, false);
    sync->wait();
    sync->take_stats();
    comm.barrier();  // the ranks start timing together
  } else {
    net.backward();
  }
  driver.synchronize();
  // The total: whole iterations as training runs them, the drivers waited for once per
  // iteration (the per-layer passes below wait after each layer where there are no marks,
  // which a split or a CPU pays and a GPU alone would not). Under mpirun the per-layer
  // iterations are the total.
  double whole_ms = 0.0;
  // On a driver that records (a GPU), the whole iterations replay one recording of the
  // layers (a CUDA graph; --graphs off: the calls one by one).
  std::unique_ptr<Driver::Recording> recording;
  if (!sync) {
    net.forward();  // a second warm-up: the first timed iterations still varied by 2x
    net.backward();
    driver.synchronize();
    if (graphs && driver.records() && !splits_chosen(args)) {
      std::string why;
      recording = net.record_iteration(why);
      if (recording) {
        net.replay_iteration(*recording);  // the graph's first launch uploads it
        driver.synchronize();
      } else {
        fmt::print(stderr,
                   "Note: {}: iterations not recorded as one graph ({}); timed call by call\n",
                   driver.name(), why);
      }
    }
    const auto whole_start = Clock::now();
    for (int it = 0; it < iterations; ++it) {
      if (recording) {
        net.replay_iteration(*recording);
      } else {
        net.forward();
        net.backward();
      }
      driver.synchronize();
    }
    whole_ms = milliseconds_since(whole_start);
  }
  net.reset_profile();  // the split profile leaves out the warm-up and the whole iterations
  net.reset_comm_bytes();
  const bool split = splits_chosen(args);

  if (!json) fmt::print("*** Benchmark begins ***\nTesting for {} iterations.\n", iterations);
  std::vector<double> forward_ms(layers, 0.0), backward_ms(layers, 0.0);
  // Each layer's fastest iteration too: on a noisy machine the mean hides what a layer
  // costs when nothing else runs (as a layer bench's best of its rounds reports it).
  constexpr double kNone = std::numeric_limits<double>::infinity();
  std::vector<double> forward_best(layers, kNone), backward_best(layers, kNone);
  const auto add_forward = [&](int i, double ms) {
    forward_ms[i] += ms;
    forward_best[i] = std::min(forward_best[i], ms);
  };
  const auto add_backward = [&](int i, double ms) {
    backward_ms[i] += ms;
    backward_best[i] = std::min(backward_best[i], ms);
  };
  double forward_total = 0.0, backward_total = 0.0;
  const auto all_start = Clock::now();
  Timeline timeline(all_start);
  const bool tracing = !timeline_path.empty();
  // On a driver with marks (a GPU's events) alone, the layers are timed on the device and
  // the driver waited for once per iteration, as a training step does; else each layer is
  // timed on the host, the driver synchronised after it.
  std::unique_ptr<Driver::Marks> marks;
  if (!split && !sync && !tracing) marks = driver.make_marks(2 * layers + 1);
  for (int it = 0; it < iterations && marks; ++it) {
    const auto iteration_start = Clock::now();
    // Mark 0 starts the forward, mark i + 1 ends layer i's forward; then each backward's end.
    marks->record(0);
    for (int i = 0; i < layers; ++i) {
      net.forward_layer(i);
      marks->record(i + 1);
    }
    std::vector<std::pair<int, int>> backward_marks;  // (layer, its mark)
    int next = layers + 1;
    for (int i = layers - 1; i >= 0; --i) {
      if (!net.layer_needs_backward(i)) continue;
      net.backward_layer(i);
      backward_marks.emplace_back(i, next);
      marks->record(next++);
    }
    driver.synchronize();
    for (int i = 0; i < layers; ++i)
      add_forward(i, marks->elapsed_ms(i, i + 1));
    int previous = layers;
    for (const auto& [layer, mark] : backward_marks) {
      add_backward(layer, marks->elapsed_ms(previous, mark));
      previous = mark;
    }
    forward_total += marks->elapsed_ms(0, layers);
    backward_total += marks->elapsed_ms(layers, previous);
    if (!json) {
      fmt::print("Iteration: {} forward-backward time: {:.3f} ms.\n", it + 1,
                 milliseconds_since(iteration_start));
    }
  }
  for (int it = 0; it < iterations && !marks; ++it) {
    const auto iteration_start = Clock::now();
    auto pass_start = Clock::now();
    for (int i = 0; i < layers; ++i) {
      const auto start = Clock::now();
      net.forward_layer(i);
      driver.synchronize();
      add_forward(i, milliseconds_since(start));
      if (tracing) timeline.add(i, Timeline::forward, start, Clock::now());
    }
    forward_total += milliseconds_since(pass_start);
    pass_start = Clock::now();
    if (sync) {
      sync->backward(net.loss(), false, [&](int i, Clock::time_point start, Clock::time_point end) {
        add_backward(i, std::chrono::duration<double, std::milli>(end - start).count());
        if (tracing) timeline.add(i, Timeline::backward, start, end);
      });
      sync->wait();
      if (tracing) {
        for (const detail::GradientSync::Record& record : sync->records()) {
          const int name = layers + (record.bucket < 0 ? sync->num_buckets() : record.bucket);
          timeline.add(name, Timeline::allreduce, record.start, record.end);
        }
      }
    } else {
      for (int i = layers - 1; i >= 0; --i) {
        if (!net.layer_needs_backward(i)) continue;
        const auto start = Clock::now();
        net.backward_layer(i);
        driver.synchronize();
        add_backward(i, milliseconds_since(start));
        if (tracing) timeline.add(i, Timeline::backward, start, Clock::now());
      }
    }
    backward_total += milliseconds_since(pass_start);
    if (!json) {
      fmt::print("Iteration: {} forward-backward time: {:.3f} ms.\n", it + 1,
                 milliseconds_since(iteration_start));
    }
  }
  const double total_ms = sync ? milliseconds_since(all_start) : whole_ms;
  // Data parallelism: the allreduce time, the part of it backward did not hide, and the
  // overlap efficiency 1 - exposed / allreduce.
  detail::GradientSync::Stats comm_stats;
  if (sync) comm_stats = sync->take_stats();
  const double allreduce_ms = comm_stats.allreduce_seconds * 1e3 / iterations;
  const double exposed_ms = comm_stats.exposed_seconds * 1e3 / iterations;
  const double overlap = allreduce_ms > 0 ? 1.0 - exposed_ms / allreduce_ms : 0.0;
  // Bytes this rank sent per iteration: the gradients' allreduce, and the layers cut across
  // ranks.
  const double allreduce_sent = static_cast<double>(comm_stats.sent_bytes) / iterations;
  const double model_parallel_sent = static_cast<double>(net.comm_bytes()) / iterations;
  if (tracing) {
    std::vector<std::string> names;
    for (int i = 0; i < layers; ++i)
      names.push_back(net.layer_name(i));
    for (int b = 0; b < (sync ? sync->num_buckets() : 0); ++b) {
      names.push_back(fmt::format("allreduce bucket {} ({:.2f} MB)", b,
                                  static_cast<double>(sync->bucket_bytes(b)) / 1e6));
    }
    names.emplace_back("allreduce loss");
    timeline.write(comm, driver, timeline_path, names);
  }

  const double n = iterations;
  // Memory: the process's resident high-water mark, the parameters (values and gradients,
  // one copy each however many layers share them) and the activations (values and
  // gradients, after reuse).
  std::size_t param_bytes = 0;
  for (const NetParam& param : net.learnable_params())
    param_bytes += 2 * sizeof(float) * static_cast<std::size_t>(param.tensor->count());
  const std::size_t peak_rss = peak_resident_bytes();
  const std::size_t activation_bytes = net.activation_bytes();
  if (json) {
    // Each layer's learnable parameters (a shared one counted with the first layer that has
    // it): what its gradients add to the allreduce.
    std::map<std::string, std::size_t> layer_param_bytes;
    for (const NetParam& param : net.learnable_params()) {
      const auto floats = static_cast<std::size_t>(param.tensor->count());
      layer_param_bytes[param.layer] += sizeof(float) * floats;
    }
    for (int i = 0; i < layers; ++i) {
      const std::string algorithm = net.layer_algorithm(i);
      const double flops = net.layer_forward_flops(i);
      const auto owned = layer_param_bytes.find(net.layer_name(i));
      // A layer without a backward pass has no fastest backward: 0, as its mean.
      const auto best = [](double ms) { return json_number(std::isinf(ms) ? 0.0 : ms); };
      fmt::print(R"({{"layer":{},"type":{},"forward_ms":{},"backward_ms":{},)"
                 R"("forward_best_ms":{},"backward_best_ms":{}{}{}{}}})"
                 "\n",
                 json_string(net.layer_name(i)), json_string(net.layer_type(i)),
                 json_number(forward_ms[i] / n), json_number(backward_ms[i] / n),
                 best(forward_best[i]), best(backward_best[i]),
                 algorithm.empty() ? "" : ",\"algorithm\":" + json_string(algorithm),
                 flops > 0 ? ",\"forward_flops\":" + json_number(flops) : "",
                 owned == layer_param_bytes.end()
                     ? ""
                     : fmt::format(",\"param_bytes\":{}", owned->second));
    }
    if (split) print_split_profile(net, iterations, json);
    const std::string comm_fields =
        ranks
            ? fmt::format(
                  R"(,"ranks":{},"comm":"{}","buckets":{},"allreduce_bytes":{},"allreduce_ms":{},)"
                  R"("exposed_comm_ms":{},"compute_ms":{},"overlap_efficiency":{},)"
                  R"("allreduce_sent_bytes":{},"model_parallel_sent_bytes":{},"comm_bytes":{})",
                  comm.size(), comm.name(), sync->num_buckets(),
                  comm_stats.bytes / static_cast<std::size_t>(iterations),
                  json_number(allreduce_ms), json_number(exposed_ms),
                  json_number(total_ms / n - exposed_ms), json_number(overlap),
                  json_number(allreduce_sent), json_number(model_parallel_sent),
                  json_number(allreduce_sent + model_parallel_sent))
            : std::string();
    // With a split, "device" is the Net's driver (losses and whole-batch layers) and "split_spec"
    // says how the rest was cut.
    const std::string split_field =
        !split ? std::string()
               : fmt::format(R"(,"split_spec":{})",
                             json_string(args.has("split") ? args.text("split")
                                                           : "file " + args.text("split-file")));
    fmt::print(R"({{"total":true,"model":{},"phase":"{}","device":{}{},"math":"{}","batch":{},)"
               R"("iterations":{},"graphs":{},)"
               R"("forward_ms":{},"backward_ms":{},"forward_backward_ms":{},"peak_rss_bytes":{},)"
               R"("param_bytes":{},"activation_bytes":{}{}}})"
               "\n",
               json_string(model), phase == Phase::train ? "train" : "test",
               json_string(driver.name()), split_field, math_mode_name(net.math_mode()),
               net.batch_size(), iterations, recording ? "true" : "false",
               json_number(forward_total / n), json_number(backward_total / n),
               json_number(total_ms / n), peak_rss, param_bytes, activation_bytes, comm_fields);
    return 0;
  }
  fmt::print("Average time per layer:\n");
  for (int i = 0; i < layers; ++i) {
    fmt::print("{:>10}\tforward: {:.4f} ms.\n", net.layer_name(i), forward_ms[i] / n);
    fmt::print("{:>10}\tbackward: {:.4f} ms.\n", net.layer_name(i), backward_ms[i] / n);
    const std::string algorithm = net.layer_algorithm(i);
    if (!algorithm.empty()) fmt::print("{:>10}\talgorithm: {}\n", net.layer_name(i), algorithm);
  }
  if (split) {
    print_split_profile(net, iterations, json);
    print_layer_runs(net);
  }
  fmt::print("Average Forward pass: {:.4f} ms.\n", forward_total / n);
  fmt::print("Average Backward pass: {:.4f} ms.\n", backward_total / n);
  fmt::print("Average Forward-Backward: {:.4f} ms.\n", total_ms / n);
  fmt::print(
      "Peak resident memory: {} (parameters and their gradients {}, activations and "
      "their gradients {})\n",
      format_bytes(peak_rss), format_bytes(param_bytes), format_bytes(activation_bytes));
  if (ranks) {
    fmt::print(
        "Per iteration on rank 0 of {}: compute {:.4f} ms, allreduce {:.4f} ms ({:.2f} MB in "
        "{} buckets), exposed communication {:.4f} ms, overlap efficiency {:.3f}\n",
        comm.size(), total_ms / n - exposed_ms, allreduce_ms,
        static_cast<double>(comm_stats.bytes) / iterations / 1e6, sync->num_buckets(), exposed_ms,
        overlap);
    fmt::print(
        "Bytes sent per iteration by rank 0: {:.2f} MB (allreduce {:.2f} MB, layers cut across "
        "ranks {:.2f} MB)\n",
        (allreduce_sent + model_parallel_sent) / 1e6, allreduce_sent / 1e6,
        model_parallel_sent / 1e6);
  }
  if (tracing) fmt::print("Timeline written to {}\n", timeline_path);
  fmt::print("Total Time: {:.3f} ms.\n*** Benchmark ends ***\n", total_ms);
  return 0;
}

}  // namespace

Command time_command() {
  Command command;
  command.name = "time";
  command.summary = "time a model's layers forward and backward (Caffe's caffe time)";
  command.synopsis =
      "--model FILE [--iterations N] [--split SPEC | --split-file FILE] [--split-save FILE] "
      "[--json] [--data SRC] [--batch N] [flags]";
  command.details =
      "Runs one forward and backward to warm up, then times every layer's forward and\n"
      "backward and reports the means per iteration: on a GPU from events on its stream,\n"
      "waiting for it once per iteration; on a CPU, with a split or with --timeline, on\n"
      "the host, the drivers synchronised after each layer. The forward-backward total\n"
      "then comes from as many whole iterations, run as training runs them (no wait\n"
      "between layers; under mpirun, the per-layer iterations themselves); on a GPU alone\n"
      "they replay one recording of the layers after the data layers, a CUDA graph, where\n"
      "every layer's calls can be recorded (else a note says why; --graphs off: call by\n"
      "call). The total line's \"graphs\" says which.\n"
      "The backward is complete, data gradients included (Caffe's force_backward), unless\n"
      "--no-force-backward. --json prints one line per layer {\"layer\",\"type\",\n"
      "\"forward_ms\",\"backward_ms\",\"forward_best_ms\",\"backward_best_ms\"} (the means and\n"
      "the fastest iteration's; convolutions add \"algorithm\", convolutions and\n"
      "inner products \"forward_flops\", layers with parameters \"param_bytes\") and a\n"
      "total line {\"total\":true,...,\"device\"\n"
      "(the Net's driver), \"split_spec\" (with --split: its SPEC; --split-file F: \"file F\"),\n"
      "\"forward_ms\",\"backward_ms\",\"forward_backward_ms\",\"peak_rss_bytes\",\"param_bytes\",\n"
      "\"activation_bytes\"}.\n"
      "\n"
      "Before its first forward each convolution measures its algorithms (the driver's\n"
      "own on blocked or NCHW activations, lowering type 1 or 3 with GEMM, 1x1 as GEMM)\n"
      "per direction and keeps the fastest (--tune once), or reads the choice of an\n"
      "earlier run on this machine from the cache (--tune cached, the default;\n"
      "--tune-cache FILE); --tune off leaves the choice to the cost model. The text\n"
      "report names each convolution's algorithm.\n"
      "\n"
      "--split cuts every layer's batch among devices; the slices run at the same time.\n"
      "--split auto (or auto:DEVICE,...) first measures each layer on every device and\n"
      "prints the chosen fractions (\"Chosen split:\", a line per layer; --json: lines\n"
      "{\"split\":true,\"layer\",\"split_spec\"}); --split-save FILE keeps them and\n"
      "--split-file FILE runs with them again. With a split, the report adds per layer and\n"
      "device, per iteration: the slice's rows, forward and backward busy ms, ms spent\n"
      "waiting for the other devices, and the MB and ms of copies between devices (--json:\n"
      "lines {\"layer\",\"device\",\"rows\",\"forward_busy_ms\",\"backward_busy_ms\",\n"
      "\"waiting_ms\",\"copy_bytes\",\"copy_ms\"} before the total line).\n"
      "\n"
      "Under mpirun every rank times its net and backward overlaps the gradients' allreduce\n"
      "as in training (--comm, --bucket-mb); rank 0 adds per iteration the compute time, the\n"
      "allreduce time, the exposed communication (time waited for it) and the overlap\n"
      "efficiency 1 - exposed / allreduce (--json: \"allreduce_ms\", \"exposed_comm_ms\",\n"
      "\"compute_ms\", \"overlap_efficiency\" in the total line). --timeline FILE writes a\n"
      "Chrome trace with each rank's layers and allreduces.";
  command.flags = {
      {"model", FlagKind::text, "FILE", "the net prototxt or ONNX model (.onnx) (required)"},
      {"iterations", FlagKind::integer, "N", "timed iterations (default 50)"},
      {"phase", FlagKind::text, "train|test", "the net's phase (default train, as Caffe)"},
      {"json", FlagKind::boolean, "", "print JSON lines instead of Caffe's text"},
      {"force-backward", FlagKind::boolean, "",
       "backward into every blob, inputs included (default; --no-force-backward: off)"},
      {"graphs", FlagKind::text, "on|off",
       "on a GPU alone, the whole iterations replay one recording of the layers, a CUDA graph "
       "(default on)"},
  };
  for (FlagSpec& flag : tune_flags())
    command.flags.push_back(flag);
  for (FlagSpec& flag : net_flags())
    command.flags.push_back(std::move(flag));
  for (FlagSpec& flag : device_flags())
    command.flags.push_back(std::move(flag));
  for (FlagSpec& flag : comm_flags())
    command.flags.push_back(std::move(flag));
  command.flags.push_back({"timeline", FlagKind::text, "FILE",
                           "write a Chrome trace (chrome://tracing, Perfetto) of every layer and "
                           "allreduce, per rank"});
  command.run = run_time;
  return command;
}

}  // namespace hn::tool
