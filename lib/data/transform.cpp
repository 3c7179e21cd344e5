// Caffe's DataTransformer::Transform(Datum) for the Data layer, with its randomness drawn
// from philox keyed by (seed, stream position) instead of a stateful generator.
#include "lib/data/transform.h"

#include "lib/core/check.h"
#include "lib/core/philox.h"
#include "lib/proto/prototxt.h"

namespace hn::detail {

namespace {

// The mean image of a mean_file: a BlobProto of 1xCxHxW (legacy num/channels/height/width
// as compute_image_mean writes it, or shape), matching the record before cropping.
std::vector<float> read_mean_file(const std::string& path, RecordShape record,
                                  const std::string& context) {
  hybridnn::proto::BlobProto blob;
  try {
    read_binary_proto(path, blob);
  } catch (const Error& error) {
    fail("{}: mean_file: {}", context, error.what());
  }
  std::vector<std::int64_t> dims;
  if (blob.has_num() || blob.has_channels() || blob.has_height() || blob.has_width()) {
    dims = {blob.num(), blob.channels(), blob.height(), blob.width()};
  } else {
    dims.assign(blob.shape().dim().begin(), blob.shape().dim().end());
  }
  std::string found;
  for (std::size_t i = 0; i < dims.size(); ++i)
    found += (i > 0 ? "x" : "") + std::to_string(dims[i]);
  const std::vector<std::int64_t> expected = {1, record.channels, record.height, record.width};
  HN_CHECK(dims == expected,
           "{}: mean_file '{}' is {}, but the records are {}: the mean must be 1x{}", context, path,
           found.empty() ? "empty" : found, record.to_string(), record.to_string());
  const std::size_t count = record.count();
  std::vector<float> mean(count);
  if (static_cast<std::size_t>(blob.data_size()) == count) {
    std::copy(blob.data().begin(), blob.data().end(), mean.begin());
  } else {
    HN_CHECK(static_cast<std::size_t>(blob.double_data_size()) == count,
             "{}: mean_file '{}' is 1x{} but holds {} values ({} double values); it needs {}",
             context, path, record.to_string(), blob.data_size(), blob.double_data_size(), count);
    for (std::size_t i = 0; i < count; ++i)
      mean[i] = static_cast<float>(blob.double_data(i));
  }
  return mean;
}

}  // namespace

Transformer::Transformer(const hybridnn::proto::LayerParameter& layer, const FeedOptions& options,
                         RecordShape record, const std::string& context)
    : in_(record), out_(record), mean_(record.count(), 0.0f) {
  const auto& transform = layer.transform_param();
  // DataParameter's legacy scale / mean_file / crop_size / mirror apply where
  // transform_param leaves them unset, as Caffe's upgrade of old nets moves them.
  const auto& legacy = layer.data_param();
  scale_ = transform.has_scale() ? transform.scale() : legacy.scale();
  mirror_ = transform.has_mirror() ? transform.mirror() : legacy.mirror();
  const std::uint32_t crop = transform.has_crop_size() ? transform.crop_size() : legacy.crop_size();
  std::string mean_file = transform.has_mean_file() ? transform.mean_file() : legacy.mean_file();
  if (!options.mean_file.empty()) mean_file = options.mean_file == "none" ? "" : options.mean_file;
  random_ = options.phase == Phase::train;
  seed_ = options.seed;

  if (crop > 0) {
    HN_CHECK(crop <= static_cast<std::uint32_t>(record.height) &&
                 crop <= static_cast<std::uint32_t>(record.width),
             "{}: crop_size {} is larger than the {} records", context, crop, record.to_string());
    out_.height = out_.width = static_cast<int>(crop);
  }
  const int values = transform.mean_value_size();
  if (!mean_file.empty()) {
    HN_CHECK(values == 0,
             "{}: transform_param has both mean_file '{}' and mean_value; give only one", context,
             mean_file);
    mean_ = read_mean_file(mean_file, record, context);
  } else if (values > 0) {
    HN_CHECK(values == 1 || values == record.channels,
             "{}: transform_param has {} mean_value entries; give 1, or one per channel ({})",
             context, values, record.channels);
    const std::size_t plane = static_cast<std::size_t>(record.height) * record.width;
    for (int c = 0; c < record.channels; ++c) {
      std::fill_n(mean_.begin() + c * plane, plane, transform.mean_value(values == 1 ? 0 : c));
    }
  }
}

template <class Pixel>
void Transformer::apply_to(const Pixel* src, int h_off, int w_off, bool mirror, float* dst) const {
  const float scale = scale_;
  const int out_w = out_.width;
  for (int c = 0; c < out_.channels; ++c) {
    for (int h = 0; h < out_.height; ++h) {
      // (pixel - mean) * scale with the mean of the uncropped position, as Caffe computes it.
      const std::size_t row = (static_cast<std::size_t>(c) * in_.height + h_off + h) * in_.width +
                              static_cast<std::size_t>(w_off);
      const Pixel* in = src + row;
      const float* mean = mean_.data() + row;
      float* out = dst + (static_cast<std::size_t>(c) * out_.height + h) * out_w;
      if (mirror) {
        for (int w = 0; w < out_w; ++w) {
          out[out_w - 1 - w] = (static_cast<float>(in[w]) - mean[w]) * scale;
        }
      } else {
        for (int w = 0; w < out_w; ++w)
          out[w] = (static_cast<float>(in[w]) - mean[w]) * scale;
      }
    }
  }
}

void Transformer::apply(const RecordView& record, std::uint64_t position, float* dst) const {
  int h_off = (in_.height - out_.height) / 2;
  int w_off = (in_.width - out_.width) / 2;
  bool mirror = false;
  if (random_) {
    // Three draws per position: Caffe's Rand(n) = rng() % n for the offsets, Rand(2) to mirror.
    const std::uint64_t counter = position * 3;
    h_off = static_cast<int>(philox_bits(seed_, counter) %
                             static_cast<std::uint32_t>(in_.height - out_.height + 1));
    w_off = static_cast<int>(philox_bits(seed_, counter + 1) %
                             static_cast<std::uint32_t>(in_.width - out_.width + 1));
    mirror = mirror_ && (philox_bits(seed_, counter + 2) & 1u) != 0;
  }
  if (record.bytes != nullptr) {
    apply_to(record.bytes, h_off, w_off, mirror, dst);
  } else {
    apply_to(record.floats, h_off, w_off, mirror, dst);
  }
}

}  // namespace hn::detail
