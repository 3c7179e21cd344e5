// A structural check of an LMDB data file (data.mdb) before liblmdb walks it. liblmdb trusts
// its file: a flipped byte in a page header, a node offset or a page number makes it read
// outside its map and crash. The check walks the B-tree that a read-only cursor will walk
// and throws hn::Error naming the page and what is wrong with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hn::detail {

// What the check found in a sound file.
struct LmdbLayout {
  std::uint32_t page_size = 0;
  std::uint64_t txnid = 0;           // the snapshot a reader opens (the later meta page)
  std::uint64_t entries = 0;         // records in the main database
  std::uint32_t depth = 0;           // of its B-tree (0: empty)
  std::uint64_t tree_pages = 0;      // branch and leaf pages walked
  std::uint64_t overflow_pages = 0;  // pages that large values occupy (named, not read)
};

// Checks the bytes of a data.mdb file (`where` starts each error message). Reads the meta
// pages and every branch and leaf page of the main database's tree in the snapshot a
// reader opens: page numbers within the file, page headers, node offsets and sizes within
// their page, overflow runs within the file, no page reached twice, the depth and record
// count the meta page states. Values on overflow pages are not read (their extent is
// checked), so the cost is the tree's pages, a small part of an image database.
LmdbLayout check_lmdb_image(const std::uint8_t* bytes, std::size_t size, const std::string& where);

// check_lmdb_image on `dir`/data.mdb, mapped read-only. A missing or unreadable file is left
// to liblmdb's own error.
void check_lmdb_file(const std::string& dir, const std::string& context);

}  // namespace hn::detail
