// The commands of the `hybridnn` tool and what they share: choosing the device (--device,
// --gpu, --split, --split-file, --split-save, --threads, --blas), measuring automatic splits,
// and formatting numbers for people and for JSON.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <cstddef>
#include <initializer_list>
#include <memory>

#include "lib/capi/hybridnn.h"
#include "lib/tool/flags.h"

namespace hn::tool {

Command train_command();
Command test_command();
Command time_command();
Command device_query_command();
Command convert_command();

// The flag of an option of the library's table (lib/solver/options.h): the key with '-'
// for '_', its value name and help (the tool's help where the table has one).
FlagSpec table_flag(const char* key);
// Sets the table's options `keys`: the tool's default where it has one, then the flag's
// value where given; a malformed value is a UsageError naming the flag.
void set_table_options(NetOptions& options, const Args& args,
                       std::initializer_list<const char*> keys);
void set_table_options(SolverOptions& options, const Args& args,
                       std::initializer_list<const char*> keys);

// --device, --gpu, --split, --split-file, --split-save, --threads, --blas.
std::vector<FlagSpec> device_flags();

// --data, --mean-file, --batch, --level, --stage: how `test` and `time` build a net; and
// --tune, --tune-cache, --layout, --fuse, --math: the measured choice of algorithms, the
// activations' layout, the fusion of layers and the math mode. Both are the library's
// option table's (lib/solver/options.h), with the tool's defaults (tuned, cached; blocked).
// Measured choices are reported on stderr by rank 0 ("Tuned conv1 on cpu in 0.84 s: direct").
std::vector<FlagSpec> net_flags();
std::vector<FlagSpec> tune_flags();
NetOptions net_options(const Args& args, Phase phase);
void apply_tune_flags(SolverOptions& options, const Args& args);
// By rank 0 on stderr, a "Note: " line for each driver of `net` that computes something
// else in the net's math mode.
void print_math_notes(const Net& net);

// Whether --split or --split-file cuts layers among devices.
bool splits_chosen(const Args& args);

// The device of the Net's own driver (data, losses, batch statistics): --device or --gpu,
// else the first device of `split` (an automatic split's first GPU), else the first device
// of `layer_splits`' first layer, else cpu; the splits as the options' table read them from
// --split and --split-file. Throws UsageError for malformed flags.
Device chosen_device(const Args& args, const Split& split, const LayerSplits& layer_splits);
// --threads, --blas and --reference-memory as the options of the drivers `runtime` makes,
// and the ranks an MPI launcher started on this node as the processes sharing its cores.
// The Net or Solver made on chosen_device() then gives every device it names a driver.
void configure_runtime(Runtime& runtime, const Args& args);

// --comm, --comm-timeout, --bucket-mb: data parallelism under mpirun.
std::vector<FlagSpec> comm_flags();
// The communicator of --comm (default: hn::default_communicator()) with --comm-timeout.
// It becomes the active communicator, kept until exit, which main() uses to end every rank
// when this one fails. On ranks other than 0 stdout goes to /dev/null: rank 0 reports.
Communicator& chosen_communicator(const Args& args);
std::size_t chosen_bucket_bytes(const Args& args);
// --grad-compress (SolverOptions::grad_compress), for a GradientSync of the tool's own.
GradCompression chosen_grad_compression(const Args& args);
Communicator* active_communicator();

// Measures the net's automatic splits (--split auto) before the command's work starts,
// printing each layer's choice as it is made ("Measuring the split of conv1...
// cpu:0.97,reference:0.03") and then the chosen splits ("Chosen split:" and one
// "LAYER SPLIT" line per layer). With `json`, stdout gets one line
// {"split":true,"layer","split_spec"} per layer instead and the progress goes to stderr.
// Then writes net.layer_splits() to --split-save when given.
void settle_splits(Net& net, const Args& args, bool json = false);

// Shortest text that reads back as the same float ("0.8934", "1e-05", "nan").
std::string format_float(double value);
// A JSON number (shortest float text), or null when not finite.
std::string json_number(double value);
std::string json_string(const std::string& text);
// Caffe's note after a loss output: " (* WEIGHT = WEIGHT*VALUE loss)"; empty for weight 0.
std::string loss_note(float weight, float value);
// "1h02m03s", "4m05s", "12s".
std::string format_duration(double seconds);

// Creates the directory that will hold files named `prefix`* (a snapshot prefix or an
// output path); does nothing when it exists or the prefix has no directory part.
void create_parent_directory(const std::string& prefix);
// Says on stderr when an output file the tool is about to open is a FIFO (`flag` names it):
// opening it for writing waits until a reader opens the other end.
void note_if_fifo(const std::string& flag, const std::string& path);

}  // namespace hn::tool
