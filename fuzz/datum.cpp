// One LMDB value as a Caffe Datum record (the Data layer's decode of each record), as the
// first record and as a later one that must match a 3x32x32 first record.
#include <string>

#include "fuzz/fuzz.h"
#include "hybridnn.pb.h"
#include "lib/data/source.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  hybridnn::proto::Datum datum;
  const auto check_view = [&](const hn::detail::RecordView& view) {
    // Exactly one of bytes and floats, pointing into the Datum.
    if ((view.bytes == nullptr) == (view.floats == nullptr)) std::abort();
  };
  hn::fuzz::accept_errors(
      [&] { check_view(hn::detail::decode_datum(data, size, datum, nullptr, "record 0")); });
  const hn::detail::RecordShape first{3, 32, 32};
  hn::fuzz::accept_errors(
      [&] { check_view(hn::detail::decode_datum(data, size, datum, &first, "record 1")); });
  return 0;
}
