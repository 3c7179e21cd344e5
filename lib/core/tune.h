// Measured choice of algorithm (as cuDNN's find and PyTorch's cudnn.benchmark): a layer
// with several ways to compute (a convolution: the driver's own kernel, lowering type 1 or
// type 3 with GEMM, 1x1 as GEMM) times them on each driver and slice size it runs with,
// keeps the fastest, and records it in a cache file keyed by the machine, the driver and
// the shape, so that later runs on the same machine skip the measurement.
//
// Results do not depend on the choice beyond float rounding. A run that measures may pick
// differently from the previous one where two candidates are close; `cached` keeps the
// first choice, `off` (the cost model) gives the same choice on every machine.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace hn {

class Driver;

enum class TuneMode {
  off,     // no measurement: each layer's cost model chooses
  once,    // measure at set-up (the first forward), every run; the cache is updated
  cached,  // use the cache where it has the shape, measure (and record) the others
};

const char* tune_mode_name(TuneMode mode);
// "off", "once" or "cached"; anything else is an hn::Error naming the value.
TuneMode parse_tune_mode(const std::string& text);

// The cache file used when none is given: $HYBRIDNN_TUNE_CACHE, else
// $XDG_CACHE_HOME/hybridnn/tune.txt, else $HOME/.cache/hybridnn/tune.txt (empty when none
// of them is set: nothing is cached).
std::string default_tune_cache_path();

// What a layer reports once it has chosen for one driver and slice size.
struct TuneReport {
  std::string layer;      // the layer's name
  std::string device;     // the driver's name ("cpu", "cuda:0")
  std::string algorithm;  // e.g. "forward direct, backward data type1, backward weights direct"
  bool measured = false;  // false: read from the cache
  double seconds = 0.0;   // time spent choosing
  // Set instead of the rest when the cache could not be written (the run goes on).
  std::string warning;
};

struct TuneOptions {
  TuneMode mode = TuneMode::off;
  std::string cache_path;  // empty: default_tune_cache_path(); "none": no file
  // Called for each layer as it has chosen (may be empty).
  std::function<void(const TuneReport&)> on_layer;
  // Given this process's choice (measured or cached), the choice to use: under data
  // parallelism the Solver sets it to rank 0's, broadcast (a collective: every rank's nets
  // choose in the same order), so that every rank computes alike and a run repeats
  // bitwise whatever each rank measured. Empty: this process's own.
  std::function<std::string(const std::string& choice)> agree;
};

// The measurements of one Net (or of a program running layers as kernels) and their
// cache. Entries are "machine | driver | key -> choice"; the file is read when the Tuner
// is made and merged with what is on disk when saved (written beside it and renamed, so
// runs sharing the file never see a torn one).
class Tuner {
 public:
  explicit Tuner(TuneOptions options);

  TuneMode mode() const { return options_.mode; }
  const std::string& cache_path() const { return path_; }

  // The choice recorded for `key` on `driver` (cached mode only; nullopt otherwise).
  std::optional<std::string> lookup(const Driver& driver, const std::string& key) const;
  void record(const Driver& driver, const std::string& key, const std::string& choice);
  // Writes the cache when something was recorded since the last save.
  void save();

  // Seconds `run` takes on `driver`: the best of a warm-up run and up to `repeats` more,
  // each followed by driver.synchronize(). A run over `give_up_after` seconds (a candidate
  // already slower than the best) is not repeated: its first call where that took more than
  // 4 times as long, else its second (the first pays one-time costs).
  static double time(Driver& driver, const std::function<void()>& run, int repeats = 3,
                     double give_up_after = 0.5);
  // Seconds each of `runs` (the candidates for one choice) takes on `driver` at its best,
  // measured in turns: a warm-up turn (each called once: the first call pays one-time
  // costs), then up to `rounds` turns in which each candidate still in the race is called
  // once, in order. Taking turns puts the machine's drift, seconds long on a shared host,
  // on every candidate alike, where timing one after another gave it all to whichever ran
  // in a slow moment. A candidate leaves the race after its warm-up where that took over 4
  // times the fastest warm-up, and after its second call where its best is over 1.5 times
  // the fastest best or over `give_up_after` seconds. Each call is followed by
  // driver.synchronize().
  static std::vector<double> race(Driver& driver, const std::vector<std::function<void()>>& runs,
                                  int rounds = 2, double give_up_after = 0.5);

  void report(const TuneReport& report) const;
  // TuneOptions::agree on `choice`, or `choice` itself.
  std::string agree(const std::string& choice) const {
    return options_.agree ? options_.agree(choice) : choice;
  }

 private:
  std::string entry_key(const Driver& driver, const std::string& key) const;

  TuneOptions options_;
  std::string path_;
  std::string machine_;
  std::map<std::string, std::string> entries_;
  std::map<std::string, std::string> recorded_;  // since the last save
};

}  // namespace hn
