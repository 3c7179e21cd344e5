// Writing LMDB databases of Datum records for `convert` (the reader is a RecordSource, see
// source.h). LMDB types stay in lmdb_store.cpp.
#pragma once

#include <memory>
#include <string>

namespace hn::detail {

// Appends key/value pairs to a new LMDB in the existing directory `dir`. Destroying the
// writer drops the puts not yet committed.
class LmdbWriter {
 public:
  LmdbWriter(const std::string& dir, std::string context);
  ~LmdbWriter();
  LmdbWriter(const LmdbWriter&) = delete;
  LmdbWriter& operator=(const LmdbWriter&) = delete;

  // Keys must arrive in increasing byte order (they are appended).
  void put(const std::string& key, const std::string& value);
  // Commits the open transaction, if any; later puts start a new one.
  void commit();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hn::detail
