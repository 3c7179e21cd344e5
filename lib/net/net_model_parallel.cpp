// Layers cut across ranks (NetOptions::model_parallel, model parallelism between processes):
// rank r of R holds outputs [N*r/R, N*(r+1)/R) of an InnerProduct's weights and bias and
// computes them for the rows of every rank, so the layer sees the batch one process would
// (every rank's rows, rank by rank). Forward: allgather the input rows, compute this rank's
// outputs of every row, allgatherv the outputs and keep this rank's rows of each block.
// Backward: allgather the output gradient rows, compute this rank's weight and bias
// gradients and its share of every row's input gradient, reduce_scatterv the shares so that
// each rank gets the sum for its own rows. The weights never move; their gradients are
// those of the sum of every rank's loss (the Solver divides them by R). A `split_axis:
// OUTPUT` split cuts the rank's outputs further among its devices (the parts).
#include "lib/net/net_impl.h"

namespace hn {

namespace {

std::size_t float_bytes(index_t count) {
  return static_cast<std::size_t>(count) * sizeof(float);
}

// The blocks of every rank's outputs, [rows x w_q] floats for rank q (w_q: its outputs);
// for a parameter, `rows` is the values per output.
std::vector<std::size_t> output_blocks(index_t outputs, index_t rows, int ranks) {
  std::vector<std::size_t> counts;
  for (int q = 0; q < ranks; ++q) {
    const auto [begin, end] = rank_outputs(outputs, q, ranks);
    counts.push_back(static_cast<std::size_t>(rows * (end - begin)));
  }
  return counts;
}

}  // namespace

void Net::Impl::run_rank_cut(int index, bool backward) {
  NetLayer& nl = layers[index];
  Driver& home = *driver;
  const int bottom = nl.bottoms[0], top = nl.tops[0];
  const Shape& out = blobs[top].shape;
  const index_t outputs = out[out.axes() - 1];
  const index_t rows = out.count() / std::max<index_t>(outputs, 1);  // this rank's
  const index_t all_rows = rows * ranks;
  const index_t input_count = blobs[bottom].shape.count();  // this rank's
  const index_t width = nl.rank_end - nl.rank_begin;
  // A failed collective names the layer and stays a CommunicatorError, so that the Solver
  // adds the iteration and the tool ends every rank.
  const auto rank_fails = [&](const Error& error) {
    throw CommunicatorError(fmt::format("{}: {}", where(index), error.what()));
  };
  if (!backward) {
    try {
      // Every rank's input rows, rank by rank.
      comm->allgather(home, static_cast<const float*>(data_of(bottom).read(home)),
                      static_cast<std::size_t>(input_count),
                      static_cast<float*>(nl.gathered.data().overwrite(home)));
      comm_bytes += float_bytes(input_count) * static_cast<std::size_t>(ranks - 1);
      run_cut_parts(index, false, &nl.gathered.data(), nl.gathered.shape());
      // This rank's outputs of every row, the parts' columns side by side.
      const float* mine = nullptr;
      if (nl.parts.size() == 1) {
        mine = nl.parts[0].output.data_read(home);
      } else if (!nl.parts.empty()) {
        float* joined = static_cast<float*>(nl.rank_output.data().overwrite(home));
        for (NetLayer::Part& part : nl.parts) {
          home.copy_strided(all_rows, part.end - part.begin, part.output.data_read(home),
                            part.end - part.begin, joined + (part.begin - nl.rank_begin), width);
        }
        mine = joined;
      }
      // Every rank's outputs, block by block; this rank keeps its rows of each.
      float* blocks = static_cast<float*>(nl.exchange.data().overwrite(home));
      const std::vector<std::size_t> counts = output_blocks(outputs, all_rows, ranks);
      comm->allgatherv(home, mine, counts, blocks);
      comm_bytes += float_bytes(all_rows * width) * static_cast<std::size_t>(ranks - 1);
      float* y = static_cast<float*>(data_of(top).overwrite(home));
      std::size_t offset = 0;
      for (int q = 0; q < ranks; ++q) {
        const auto [begin, end] = rank_outputs(outputs, q, ranks);
        if (end > begin) {
          home.copy_strided(rows, end - begin, blocks + offset + rank * rows * (end - begin),
                            end - begin, y + begin, outputs);
        }
        offset += counts[static_cast<std::size_t>(q)];
      }
    } catch (const CommunicatorError& error) {
      rank_fails(error);
    }
    return;
  }
  try {
    // Every rank's output gradient rows; each part takes its columns of them.
    float* gradients = static_cast<float*>(nl.exchange.diff().overwrite(home));
    comm->allgather(home, static_cast<const float*>(diff_of(top).read(home)),
                    static_cast<std::size_t>(rows * outputs), gradients);
    comm_bytes += float_bytes(rows * outputs) * static_cast<std::size_t>(ranks - 1);
    for (NetLayer::Part& part : nl.parts) {
      const index_t part_width = part.end - part.begin;
      home.copy_strided(all_rows, part_width, gradients + part.begin, outputs,
                        static_cast<float*>(part.output.diff().overwrite(home)), part_width);
    }
    run_cut_parts(index, true, &nl.gathered.data(), nl.gathered.shape());
    if (!nl.propagate_down[0]) return;
    // This rank's share of every row's input gradient; each rank gets the sum of its rows'.
    float* shares = static_cast<float*>(nl.gathered.diff().overwrite(home));
    if (nl.parts.empty()) {
      home.fill(nl.gathered.count(), 0.0f, shares);
    } else {
      add_input_diffs(index, shares);
    }
    comm->reduce_scatterv(home, shares,
                          std::vector<std::size_t>(static_cast<std::size_t>(ranks),
                                                   static_cast<std::size_t>(input_count)),
                          static_cast<float*>(diff_of(bottom).overwrite(home)));
    comm_bytes += float_bytes(input_count) * static_cast<std::size_t>(ranks - 1);
  } catch (const CommunicatorError& error) {
    rank_fails(error);
  }
}

std::vector<float> Net::whole_values(const WholeParam& whole,
                                     const std::vector<const float*>& values) const {
  const std::vector<NetParam>& params = impl_->learnable;
  HN_CHECK(whole.first < whole.last && whole.last <= params.size() &&
               values.size() == whole.last - whole.first,
           "Net::whole_values: {} values for parameters [{}, {}) of {}", values.size(), whole.first,
           whole.last, params.size());
  std::vector<float> result(static_cast<std::size_t>(whole.shape.count()), 0.0f);
  const NetParam& first = params[whole.first];
  if (first.shard.ranks <= 1) {
    for (std::size_t i = whole.first; i < whole.last; ++i)
      shard_to_whole(params[i], values[i - whole.first], result.data());
    return result;
  }
  // This rank's outputs as one shard, gathered from every rank.
  const int ranks = first.shard.ranks;
  const int axis = first.shard.axis;
  const index_t outputs = whole.shape[axis];
  const index_t per_output = whole.shape.count() / std::max<index_t>(outputs, 1);
  const auto shard_of_rank = [&](int q) {
    NetParam np;
    np.shard = first.shard;
    std::tie(np.shard.begin, np.shard.end) = rank_outputs(outputs, q, ranks);
    return np;
  };
  const NetParam mine = shard_of_rank(impl_->rank);
  std::vector<index_t> own_dims = whole.shape.dims();
  own_dims[static_cast<std::size_t>(axis)] = mine.shard.end - mine.shard.begin;
  const Shape own_shape(own_dims);
  std::vector<float> own(static_cast<std::size_t>(own_shape.count()));
  for (std::size_t i = whole.first; i < whole.last; ++i) {
    NetParam relative = params[i];
    relative.shard.begin -= mine.shard.begin;
    relative.shard.end -= mine.shard.begin;
    relative.shard.whole = own_shape;
    shard_to_whole(relative, values[i - whole.first], own.data());
  }
  const std::vector<std::size_t> counts = output_blocks(outputs, per_output, ranks);
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  Driver& home = *impl_->driver;
  Tensor sent(Shape{std::max<index_t>(static_cast<index_t>(own.size()), 1)});
  std::copy(own.begin(), own.end(), sent.host_data_mut());
  Tensor received(Shape{static_cast<index_t>(total)});
  impl_->comm->allgatherv(home, sent.data_read(home), counts,
                          static_cast<float*>(received.data().overwrite(home)));
  const float* gathered = received.host_data();
  for (int q = 0; q < ranks; ++q) {
    shard_to_whole(shard_of_rank(q), gathered, result.data());
    gathered += counts[static_cast<std::size_t>(q)];
  }
  return result;
}

int Net::model_parallel_ranks() const {
  for (const NetLayer& nl : impl_->layers) {
    if (nl.across_ranks) return impl_->ranks;
  }
  return 1;
}

bool Net::layer_communicates(int index) const {
  return impl_->layers.at(static_cast<std::size_t>(index)).across_ranks;
}

std::size_t Net::comm_bytes() const {
  return impl_->comm_bytes;
}

void Net::reset_comm_bytes() {
  impl_->comm_bytes = 0;
}

}  // namespace hn
