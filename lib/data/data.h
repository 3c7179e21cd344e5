// Data feeds: what a Net's Data layer reads. A feed opens a source (an LMDB of Caffe Datum
// records, IDX files as MNIST / Fashion-MNIST ship them, CIFAR-10 binary files, or
// generated images), applies Caffe's transform_param and prepares batches on a background
// thread. Batch b always holds records [b*batch, (b+1)*batch) modulo the source's size (one
// shard of them under data parallelism: FeedOptions::shard), and
// its random crops and mirrors depend only on the seed and the record's position, so a run
// resumed at batch b sees exactly what an uninterrupted run saw.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hybridnn.pb.h"
#include "lib/core/phase.h"
#include "lib/core/tensor.h"

namespace hn::detail {

struct FeedOptions {
  Phase phase = Phase::train;  // train: random crop/mirror; test: centre crop, no mirror
  std::string source;          // non-empty: replaces data_param.source
  std::string mean_file;       // non-empty: replaces transform_param.mean_file ("none": drop)
  int batch_size = 0;          // > 0: replaces data_param.batch_size
  std::uint64_t seed = 0;
  int prefetch = 3;  // batches prepared ahead (0: synchronous, no thread)
  // Data parallelism: this feed is shard `shard` of `shards`, and its batch b holds the
  // records at stream positions (b * batch + i) * shards + shard: rank r of N reads r, r + N,
  // r + 2N, ..., so the N feeds together read what one feed of N * batch reads.
  int shard = 0;
  int shards = 1;
};

class DataFeed {
 public:
  virtual ~DataFeed() = default;
  // {batch, channels, height, width} and, when the layer has a second top, {batch}.
  virtual std::vector<Shape> top_shapes() const = 0;
  // Waits for the next batch and copies it to `tops` (host memory, top_shapes() counts).
  // Errors met by the background thread (a truncated record, ...) are rethrown here.
  virtual void next(const std::vector<float*>& tops) = 0;
  // The next call to next() returns batch number `batch`.
  virtual void seek(std::uint64_t batch) = 0;
  // "layer 'mnist' (Data) reading IDX '/path/train-images-idx3-ubyte.gz' (60000 records)".
  virtual std::string describe() const = 0;
};

// Opens the feed of a Data layer. Throws hn::Error naming the layer and the path for a
// missing, truncated or unrecognised source, a record whose shape differs from the first,
// a missing or mis-shaped mean file, or a crop larger than the image.
std::unique_ptr<DataFeed> open_data_feed(const hybridnn::proto::LayerParameter& layer,
                                         const FeedOptions& options);

}  // namespace hn::detail
