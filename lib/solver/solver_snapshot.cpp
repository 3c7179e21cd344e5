// The Solver's snapshots (.caffemodel + .solverstate), restore, the snapshot prefix, and the
// checks that every rank trains the same net and solver and holds the same weights.
#include "lib/solver/solver_impl.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "lib/core/check.h"
#include "lib/core/version.h"
#include "lib/proto/prototxt.h"

namespace hn {

namespace fs = std::filesystem;

// ---- the ranks' agreement ---------------------------------------------------------------

std::vector<std::pair<int, std::size_t>> Solver::Impl::fingerprints_differing(
    const std::vector<std::uint64_t>& fingerprints) {
  // Four 16-bit pieces of each, exact as floats, so that a collective on floats carries
  // them unchanged.
  std::vector<float> mine;
  for (const std::uint64_t value : fingerprints) {
    for (int i = 0; i < 4; ++i)
      mine.push_back(static_cast<float>((value >> (16 * i)) & 0xFFFFu));
  }
  const std::vector<float> all = allgather_host(*comm, *driver, mine);
  std::vector<std::pair<int, std::size_t>> differing;
  for (int r = 1; r < comm->size(); ++r) {
    for (std::size_t i = 0; i < fingerprints.size(); ++i) {
      const float* theirs = all.data() + static_cast<std::size_t>(r) * mine.size() + 4 * i;
      if (!std::equal(theirs, theirs + 4, all.data() + 4 * i)) differing.emplace_back(r, i);
    }
  }
  return differing;
}

std::uint64_t fnv1a(const void* data, std::size_t bytes,
                    std::uint64_t hash = 1469598103934665603u) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i)
    hash = (hash ^ p[i]) * 1099511628211u;
  return hash;
}

std::uint64_t fnv1a(const std::string& text, std::uint64_t hash = 1469598103934665603u) {
  return fnv1a(text.data(), text.size(), hash);
}

void Solver::Impl::check_ranks_agree() {
  const int ranks = comm->size();
  if (ranks == 1) return;
  // What each rank compares, and its fingerprint.
  std::vector<std::pair<std::string, std::uint64_t>> items;
  items.emplace_back(fmt::format("library version ({})", version()), fnv1a(version()));
  // The solver's settings, not where its files lie on each rank (the nets' contents are
  // compared below).
  pb::SolverParameter settings = param;
  settings.clear_net();
  settings.clear_train_net();
  settings.clear_net_param();
  settings.clear_train_net_param();
  settings.clear_test_net();
  settings.clear_snapshot_prefix();
  items.emplace_back("solver parameters", fnv1a(text_of(settings)));
  items.emplace_back("training net prototxt", fnv1a(net_text));
  const std::vector<NetParam>& params = net->learnable_params();
  items.emplace_back(fmt::format("number of learnable parameters ({})", params.size()),
                     params.size());
  std::uint64_t shapes = fnv1a("shapes");
  for (const NetParam& np : params) {
    // A layer cut across ranks: each rank's rows differ, the whole does not.
    const std::string shape =
        np.shard.ranks > 1
            ? fmt::format("{} cut among {} ranks", np.shard.whole.to_string(), np.shard.ranks)
            : np.tensor->shape().to_string();
    shapes = fnv1a(np.layer + "/" + np.name + ":" + shape, shapes);
  }
  items.emplace_back("parameter shapes", shapes);
  std::vector<std::uint64_t> fingerprints;
  for (const auto& item : items)
    fingerprints.push_back(item.second);
  std::string differences;
  for (const auto& [r, i] : fingerprints_differing(fingerprints))
    differences += fmt::format("\n  rank {}: {} differs from rank 0's", r, items[i].first);
  HN_CHECK(differences.empty(),
           "{}: the {} ranks do not all train the same net with the same solver (this is rank "
           "{}; net '{}', {} learnable parameters):{}",
           origin, ranks, comm->rank(), net->name(), params.size(), differences);
}

void Solver::Impl::check_weights_agree(const char* when) {
  const int ranks = comm->size();
  if (ranks == 1) return;
  std::uint64_t hash = fnv1a("weights");
  for (const NetParam& np : net->learnable_params()) {
    if (np.shard.ranks > 1) continue;  // each rank's own rows
    hash = fnv1a(np.tensor->host_data(),
                 static_cast<std::size_t>(np.tensor->count()) * sizeof(float), hash);
  }
  const auto differing = fingerprints_differing({hash});
  HN_CHECK(differing.empty(),
           "{}: {} at iteration {}: the weights of rank {} differ from rank 0's (checksums "
           "compared on all {} ranks; this is rank {}); the ranks no longer train the same model",
           origin, when, iter, differing.empty() ? 0 : differing[0].first, ranks, comm->rank());
}

// ---- snapshots -----------------------------------------------------------------------

// Caffe's snapshot_prefix rules (upgrade_proto.cpp): unset, the solver file without its
// extension; a directory, the solver file's stem inside it.
std::string Solver::Impl::prefix() const {
  std::string prefix =
      options.snapshot_prefix.empty() ? param.snapshot_prefix() : options.snapshot_prefix;
  if (prefix.empty()) return fs::path(origin).replace_extension().string();
  if (fs::is_directory(prefix)) return (fs::path(prefix) / fs::path(origin).stem()).string();
  return prefix;
}

std::string Solver::snapshot_prefix() const {
  return impl_->prefix();
}

void Solver::Impl::check_snapshot_prefix() const {
  if (comm->rank() != 0) return;  // rank 0 writes the snapshots
  const std::string p = prefix();
  const fs::path parent = fs::path(p).parent_path();
  HN_CHECK(parent.empty() || fs::is_directory(parent),
           "{}: snapshot_prefix '{}' lies in '{}', which is not a directory; create it or set "
           "another prefix",
           origin, p, parent.string());
  // Writable now, not only hours later at the first snapshot: create and remove a file
  // beside the snapshots (permission bits do not tell for root or a read-only mount).
  const std::string probe = fmt::format("{}.write-test.{}", p, static_cast<long>(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  HN_CHECK(fd >= 0, "{}: cannot write snapshots with snapshot_prefix '{}': creating '{}': {}",
           origin, p, probe, std::strerror(errno));
  ::close(fd);
  std::remove(probe.c_str());
}

std::string Solver::Impl::snapshot() {
  HN_CHECK(param.snapshot_format() == pb::SolverParameter::BINARYPROTO,
           "{}: snapshot_format HDF5 is not supported; use BINARYPROTO", origin);
  const std::string base = fmt::format("{}_iter_{}", prefix(), iter);
  const std::string model = base + ".caffemodel";
  check_weights_agree("snapshot");
  // Rank 0 writes them; with layers cut across ranks every rank takes part in gathering
  // their rows first.
  const bool gathered = net->model_parallel_ranks() > 1;
  if (comm->rank() != 0 && !gathered) return model;
  net->save(model, param.snapshot_diff());
  pb::SolverState state;
  state.set_iter(iter);
  state.set_learned_net(model);
  state.set_current_step(current_step);
  // Caffe's layout: one blob per whole parameter, the shards of a layer cut by outputs
  // joined.
  const std::vector<NetParam>& params = net->learnable_params();
  auto add = [&](std::vector<std::unique_ptr<Tensor>>& arrays) {
    if (arrays.empty()) return;  // a solver without a second history
    for (const WholeParam& whole : whole_params(params)) {
      pb::BlobProto* blob = state.add_history();
      for (index_t d : whole.shape.dims())
        blob->mutable_shape()->add_dim(d);
      std::vector<const float*> shards;
      for (std::size_t i = whole.first; i < whole.last; ++i)
        shards.push_back(arrays[i]->host_data());
      const std::vector<float> values = net->whole_values(whole, shards);
      blob->mutable_data()->Add(values.begin(), values.end());
    }
  };
  add(history);
  add(history2);
  if (comm->rank() != 0) return model;
  detail::write_binary_proto(base + ".solverstate", state);
  SolverEvent e = event(Phase::train);
  e.loss = smoothed_loss;
  e.snapshot = model;
  emit(e);
  return model;
}

void Solver::restore(const std::string& solverstate_path) {
  Impl& s = *impl_;
  HN_CHECK(fs::exists(solverstate_path), "restore: solver state '{}' does not exist",
           solverstate_path);
  pb::SolverState state;
  detail::read_binary_proto(solverstate_path, state);
  HN_CHECK(state.iter() >= 0, "{}: iteration {} is negative", solverstate_path, state.iter());
  // The multistep policy's position among the solver's stepvalues (0 for the others).
  HN_CHECK(state.current_step() >= 0 && state.current_step() <= s.param.stepvalue_size(),
           "{}: current_step {} is outside [0, {}] (the solver has {} stepvalue{})",
           solverstate_path, state.current_step(), s.param.stepvalue_size(),
           s.param.stepvalue_size(), s.param.stepvalue_size() == 1 ? "" : "s");

  // Check everything before changing anything.
  const std::vector<NetParam>& params = s.net->learnable_params();
  // One blob per whole parameter (the shards of a layer cut by outputs joined).
  const std::vector<WholeParam> wholes = whole_params(params);
  const std::size_t expected = wholes.size() * (s.history2.empty() ? 1 : 2);
  HN_CHECK(static_cast<std::size_t>(state.history_size()) == expected,
           "{}: holds {} history blobs, but the {} solver of net '{}' keeps {} ({} learnable "
           "parameters{}); was it written for another net or solver type?",
           solverstate_path, state.history_size(), update_type_name(s.type), s.net->name(),
           expected, wholes.size(), s.history2.empty() ? "" : " x 2");
  for (int i = 0; i < state.history_size(); ++i) {
    const pb::BlobProto& blob = state.history(i);
    const NetParam& np = params[wholes[static_cast<std::size_t>(i) % wholes.size()].first];
    const Shape& shape = wholes[static_cast<std::size_t>(i) % wholes.size()].shape;
    HN_CHECK(detail::blob_shape_matches(blob, shape),
             "{}: history blob {} has shape {}, but parameter '{}' of layer '{}' is {}",
             solverstate_path, i, detail::blob_shape(blob).to_string(), np.name, np.layer,
             shape.to_string());
    const index_t values = blob.double_data_size() > 0 ? blob.double_data_size() : blob.data_size();
    HN_CHECK(values == shape.count(),
             "{}: history blob {} (parameter '{}' of layer '{}', shape {}) holds {} values, its "
             "shape needs {}",
             solverstate_path, i, np.name, np.layer, shape.to_string(), values, shape.count());
  }
  std::string model;
  if (state.has_learned_net() && !state.learned_net().empty()) {
    model = state.learned_net();
    if (!fs::exists(model)) {
      const fs::path beside = fs::path(solverstate_path).parent_path() / fs::path(model).filename();
      HN_CHECK(fs::exists(beside),
               "{}: its weights '{}' do not exist, neither as written nor beside the solver "
               "state ('{}')",
               solverstate_path, model, beside.string());
      model = beside.string();
    }
  }

  if (!model.empty()) s.net->copy_trained_layers_from(model);
  for (int i = 0; i < state.history_size(); ++i) {
    const pb::BlobProto& blob = state.history(i);
    const WholeParam& whole = wholes[static_cast<std::size_t>(i) % wholes.size()];
    auto& arrays = static_cast<std::size_t>(i) < wholes.size() ? s.history : s.history2;
    std::vector<float> data(static_cast<std::size_t>(whole.shape.count()));
    if (blob.double_data_size() > 0) {
      for (int k = 0; k < blob.double_data_size(); ++k)
        data[static_cast<std::size_t>(k)] = static_cast<float>(blob.double_data(k));
    } else {
      std::copy(blob.data().begin(), blob.data().end(), data.begin());
    }
    for (std::size_t p = whole.first; p < whole.last; ++p)
      whole_to_shard(params[p], data.data(), arrays[p]->host_data_mut());
  }
  s.iter = state.iter();
  s.current_step = state.current_step();
}

}  // namespace hn
