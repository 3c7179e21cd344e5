// A binary .solverstate restored into an SGD solver with momentum on kTrainNet, then one
// step: its iteration, history blobs and learned_net (a caffemodel path, looked up as
// written and beside the state; a valid one, fuzz_iter_1.caffemodel, lies beside it).
#include <memory>
#include <string>

#include "fuzz/fuzz.h"
#include "lib/core/runtime.h"
#include "lib/drivers/builtin.h"
#include "lib/solver/solver.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  hn::register_builtin_drivers();
  static hn::Runtime runtime;
  static hn::Driver& driver = runtime.add(hn::Device::parse("reference"));
  static const std::unique_ptr<hn::Solver> solver = [] {
    const std::string net = hn::fuzz::kTrainNet;
    hn::fuzz::write_file("net.prototxt", net.data(), net.size());
    const std::string dir = hn::fuzz::scratch_dir();
    const std::string text = "net: '" + dir + "/net.prototxt'\nbase_lr: 0.1\nmomentum: 0.9\n" +
                             "lr_policy: 'multistep'\nstepvalue: 2\nstepvalue: 4\ngamma: 0.5\n" +
                             "max_iter: 1\ndisplay: 0\nsnapshot_prefix: '" + dir + "/fuzz'\n";
    const std::string path = hn::fuzz::write_file("solver.prototxt", text.data(), text.size());
    auto made = std::make_unique<hn::Solver>(path, runtime, driver);
    made->solve();  // writes fuzz_iter_1.caffemodel and .solverstate
    return made;
  }();
  const std::string path = hn::fuzz::write_file("fuzz.solverstate", data, size);
  hn::fuzz::accept_errors([&] {
    solver->restore(path);
    solver->step(1);
  });
  return 0;
}
