// Caffe's DataTransformer for the Data layer: value = (pixel - mean) * scale, with mean_file
// (a 1xCxHxW BlobProto) or mean_value, crop_size (random offsets in train, centred in test)
// and mirror (random in train). The random choices of a record depend only on the seed and
// the record's position in the stream, so any batch can be recomputed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hybridnn.pb.h"
#include "lib/data/data.h"
#include "lib/data/source.h"

namespace hn::detail {

class Transformer {
 public:
  // `record` is the source's (pre-crop) shape; errors start with `context`.
  Transformer(const hybridnn::proto::LayerParameter& layer, const FeedOptions& options,
              RecordShape record, const std::string& context);

  RecordShape output_shape() const { return out_; }
  // Writes output_shape().count() floats of `record`, at stream position `position`, to dst.
  void apply(const RecordView& record, std::uint64_t position, float* dst) const;

 private:
  template <class Pixel>
  void apply_to(const Pixel* src, int h_off, int w_off, bool mirror, float* dst) const;

  RecordShape in_, out_;
  float scale_ = 1;
  std::vector<float> mean_;  // per input pixel (CxHxW); zeros without a mean
  bool random_ = false;      // train phase: random crop offsets and mirror
  bool mirror_ = false;
  std::uint64_t seed_ = 0;
};

}  // namespace hn::detail
