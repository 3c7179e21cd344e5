// Writing LMDB databases of Datum records for `convert` (the reader is a RecordSource, see
// source.h). LMDB types stay in lmdb_store.cpp.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace hn::detail {

// Appends key/value pairs to a new LMDB in the existing directory `dir`. Destroying the
// writer drops the puts not yet committed.
class LmdbWriter {
 public:
  // The map (address space, not disk) starts at initial_map_size (0: 64 MiB) and doubles
  // whenever a commit needs more.
  LmdbWriter(const std::string& dir, std::string context, std::size_t initial_map_size = 0);
  ~LmdbWriter();
  LmdbWriter(const LmdbWriter&) = delete;
  LmdbWriter& operator=(const LmdbWriter&) = delete;

  // Keys must arrive in increasing byte order (they are appended). Puts are held in memory
  // until the next commit.
  void put(const std::string& key, const std::string& value);
  // Writes the puts since the last commit in one transaction, growing the map as needed.
  void commit();
  std::size_t map_size() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hn::detail
