// The structural check of an LMDB data file (see lmdb_check.h). The layout is liblmdb 0.9's
// on a 64-bit little-endian host (mdb.c: MDB_page, MDB_meta, MDB_db, MDB_node), the format
// of every LMDB that Caffe and `hybridnn convert` write.
#include "lib/data/lmdb_check.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "lib/core/check.h"

namespace hn::detail {

namespace {

// Page header (MDB_page): page number, pad, flags, lower and upper bounds of the free space
// (an overflow page's page count in their place); then the node offsets (indx_t each).
constexpr std::size_t kHeader = 16;
constexpr std::size_t kFlagsAt = 10, kLowerAt = 12, kUpperAt = 14;
constexpr std::uint16_t kBranch = 0x01, kLeaf = 0x02, kOverflow = 0x04, kMeta = 0x08, kLeaf2 = 0x20,
                        kSubPage = 0x40;
constexpr std::uint16_t kKindFlags = kBranch | kLeaf | kOverflow | kMeta | kLeaf2 | kSubPage;

// Meta page (MDB_meta after the header): magic, version, fixed address, map size, the free
// and main databases (MDB_db, 48 bytes each), last page, transaction id.
constexpr std::size_t kMagicAt = 16, kVersionAt = 20, kFreeDbAt = 40, kMainDbAt = 88,
                      kLastPageAt = 136, kTxnAt = 144, kMetaEnd = 152;
constexpr std::uint32_t kMagic = 0xBEEFC0DE, kDataVersion = 1;
// MDB_db: pad (the page size, in the free database's), flags, depth, three page counts,
// entries, root.
constexpr std::size_t kDbFlagsAt = 4, kDbDepthAt = 6, kDbEntriesAt = 32, kDbRootAt = 40;
constexpr std::uint64_t kNoPage = ~std::uint64_t{0};
// Database flags that change the tree's structure (sorted duplicates in sub-pages or
// sub-trees); Caffe's databases have one value per key.
constexpr std::uint16_t kDupFlags = 0x04 | 0x10 | 0x20 | 0x40;
// Node (MDB_node): data size or child page (lo, hi, and flags as the page number's top
// bits), flags, key size, then key and data.
constexpr std::size_t kNodeHeader = 8;
constexpr std::uint16_t kBigData = 0x01, kSubData = 0x02, kDupData = 0x04;
// liblmdb's cursor stack (CURSOR_STACK): no deeper tree can be read.
constexpr unsigned kMaxDepth = 32;

template <class T>
T load(const std::uint8_t* at) {
  T value;
  std::memcpy(&value, at, sizeof value);
  return value;
}

class Checker {
 public:
  Checker(const std::uint8_t* bytes, std::size_t size, const std::string& where)
      : bytes_(bytes), size_(size), where_(where) {}

  LmdbLayout run() {
    HN_CHECK(size_ >= 2 * kMetaEnd, "{} is {} bytes: too short for an LMDB (two meta pages)",
             where_, size_);
    const std::uint32_t page_size = load<std::uint32_t>(bytes_ + kFreeDbAt);
    check_meta(0, 0);
    HN_CHECK(page_size >= 512 && page_size <= 65536 && (page_size & (page_size - 1)) == 0,
             "{}: meta page 0 states a page size of {} bytes (LMDB's are powers of two, 512 to "
             "65536)",
             where_, page_size);
    HN_CHECK(size_ / page_size >= 2, "{} is {} bytes: too short for two meta pages of {} bytes",
             where_, size_, page_size);
    psize_ = page_size;
    check_meta(1, page_size);
    const std::uint8_t* metas[2] = {bytes_, bytes_ + page_size};
    HN_CHECK(load<std::uint32_t>(metas[1] + kFreeDbAt) == page_size,
             "{}: meta pages 0 and 1 state different page sizes ({} and {} bytes)", where_,
             page_size, load<std::uint32_t>(metas[1] + kFreeDbAt));
    // The meta page a reader opens: without a lock file, the one with the later transaction
    // id (mdb_env_pick_meta); with one, the page of the later id's parity (the lock file
    // records that id, and a reader takes meta page `id & 1`). They are the same page in a
    // sound file; both are checked when a corrupt id makes them differ.
    const std::uint64_t txn0 = load<std::uint64_t>(metas[0] + kTxnAt);
    const std::uint64_t txn1 = load<std::uint64_t>(metas[1] + kTxnAt);
    const int later = txn0 < txn1 ? 1 : 0;
    const int by_parity = static_cast<int>(std::max(txn0, txn1) & 1);
    LmdbLayout layout = check_tree(later, metas[later]);
    if (by_parity != later) check_tree(by_parity, metas[by_parity]);
    return layout;
  }

 private:
  // Checks the main database's tree of meta page `index`.
  LmdbLayout check_tree(int index, const std::uint8_t* meta) {
    meta_ = index;
    records_ = tree_pages_ = overflow_pages_ = 0;
    const std::uint64_t page_size = psize_;
    const std::uint64_t last_page = load<std::uint64_t>(meta + kLastPageAt);
    // liblmdb maps at least (last page + 1) pages; more than a process's address space
    // (2^47 bytes) is a corrupt count, not a database.
    HN_CHECK(last_page < (std::uint64_t{1} << 47) / page_size,
             "{}: meta page {} states {} as its last page: that many pages of {} bytes are more "
             "than can be mapped",
             where_, meta_, last_page, page_size);
    // Pages past the file's end cannot be read even where the meta page counts them.
    limit_ = std::min<std::uint64_t>(last_page + 1, size_ / page_size);

    LmdbLayout layout;
    layout.page_size = static_cast<std::uint32_t>(page_size);
    layout.txnid = load<std::uint64_t>(meta + kTxnAt);
    const std::uint8_t* db = meta + kMainDbAt;
    const auto flags = load<std::uint16_t>(db + kDbFlagsAt);
    HN_CHECK((flags & kDupFlags) == 0,
             "{}: the database sorts duplicate keys (flags 0x{:x}); a Datum database has one "
             "record per key",
             where_, flags);
    const auto depth = load<std::uint16_t>(db + kDbDepthAt);
    const auto entries = load<std::uint64_t>(db + kDbEntriesAt);
    const auto root = load<std::uint64_t>(db + kDbRootAt);
    layout.depth = depth;
    layout.entries = entries;
    if (root == kNoPage) {
      HN_CHECK(depth == 0 && entries == 0,
               "{}: meta page {} states an empty tree with depth {} and {} records", where_, meta_,
               depth, entries);
      return layout;
    }
    HN_CHECK(depth >= 1 && depth <= kMaxDepth,
             "{}: meta page {} states a tree of depth {} (1 to {} can be read)", where_, meta_,
             depth, kMaxDepth);
    depth_ = depth;
    check_page_number(root, "the root page of meta page " + std::to_string(meta_));
    walk(root);
    HN_CHECK(records_ == entries,
             "{}: the tree holds {} records, but meta page {} states {}; the file is corrupt",
             where_, records_, meta_, entries);
    layout.tree_pages = tree_pages_;
    layout.overflow_pages = overflow_pages_;
    return layout;
  }

  void check_meta(int index, std::size_t offset) {
    const std::uint8_t* page = bytes_ + offset;
    HN_CHECK((load<std::uint16_t>(page + kFlagsAt) & kMeta) != 0 &&
                 load<std::uint32_t>(page + kMagicAt) == kMagic,
             "{}: page {} is not an LMDB meta page (no LMDB magic number); not an LMDB file, or "
             "a corrupt one",
             where_, index);
    HN_CHECK(load<std::uint32_t>(page + kVersionAt) == kDataVersion,
             "{}: meta page {} states data format version {}; this LMDB reads version {}", where_,
             index, load<std::uint32_t>(page + kVersionAt), kDataVersion);
  }

  // `pgno`, reached from `from`, must be a page past the meta pages within the file.
  void check_page_number(std::uint64_t pgno, const std::string& from) const {
    HN_CHECK(pgno >= 2 && pgno < limit_,
             "{}: {} is page {}, outside the file's pages 2 to {}; the file is corrupt or "
             "truncated",
             where_, from, pgno, limit_ == 0 ? 0 : limit_ - 1);
  }

  void walk(std::uint64_t root) {
    std::vector<bool> seen(limit_, false);
    std::vector<std::pair<std::uint64_t, unsigned>> stack{{root, 0}};
    while (!stack.empty()) {
      const auto [pgno, level] = stack.back();
      stack.pop_back();
      HN_CHECK(!seen[pgno],
               "{}: page {} is reached twice in the tree (a cycle or a shared page); the file is "
               "corrupt",
               where_, pgno);
      seen[pgno] = true;
      ++tree_pages_;
      const bool leaf = level + 1 == depth_;
      const std::uint8_t* page = bytes_ + pgno * psize_;
      const std::string what = fmt::format("page {} ({} page at level {} of {})", pgno,
                                           leaf ? "leaf" : "branch", level + 1, depth_);
      HN_CHECK(load<std::uint64_t>(page) == pgno, "{}: {} is numbered {} in its header", where_,
               what, load<std::uint64_t>(page));
      const std::uint16_t kind = load<std::uint16_t>(page + kFlagsAt) & kKindFlags;
      HN_CHECK(kind == (leaf ? kLeaf : kBranch),
               "{}: {} has page flags 0x{:x}; the meta page's depth {} puts a {} page here", where_,
               what, load<std::uint16_t>(page + kFlagsAt), depth_, leaf ? "leaf" : "branch");
      const auto lower = load<std::uint16_t>(page + kLowerAt);
      const auto upper = load<std::uint16_t>(page + kUpperAt);
      HN_CHECK(
          lower >= kHeader + 2 && (lower - kHeader) % 2 == 0 && lower <= upper && upper <= psize_,
          "{}: {} has free space bounds {} to {} (a {} byte page with at least one node)", where_,
          what, lower, upper, psize_);
      const std::size_t nodes = (lower - kHeader) / 2;
      // Children are pushed last to first so that the walk reads pages in key order.
      const std::size_t pushed = stack.size();
      for (std::size_t i = 0; i < nodes; ++i) {
        const auto offset = load<std::uint16_t>(page + kHeader + 2 * i);
        HN_CHECK(offset >= upper && offset % 2 == 0 && offset + kNodeHeader <= psize_,
                 "{}: {}: node {} is at offset {}, outside the page's node space {} to {}", where_,
                 what, i, offset, upper, psize_);
        const std::uint8_t* node = page + offset;
        const auto lo = load<std::uint16_t>(node);
        const auto hi = load<std::uint16_t>(node + 2);
        const auto node_flags = load<std::uint16_t>(node + 4);
        const auto key_size = load<std::uint16_t>(node + 6);
        const std::size_t key_end = offset + kNodeHeader + key_size;
        HN_CHECK(key_end <= psize_, "{}: {}: node {}'s key of {} bytes runs past the page's end",
                 where_, what, i, key_size);
        if (!leaf) {
          const std::uint64_t child =
              lo | std::uint64_t{hi} << 16 | std::uint64_t{node_flags} << 32;
          check_page_number(child, fmt::format("{}: node {}'s child", what, i));
          stack.emplace_back(child, level + 1);
          continue;
        }
        const std::uint32_t data_size = lo | std::uint32_t{hi} << 16;
        HN_CHECK((node_flags & (kSubData | kDupData)) == 0,
                 "{}: {}: node {} has flags 0x{:x} (a sub-database or duplicates); a Datum "
                 "database has one record per key",
                 where_, what, i, node_flags);
        if ((node_flags & kBigData) == 0) {
          HN_CHECK(key_end + data_size <= psize_,
                   "{}: {}: node {}'s value of {} bytes runs past the page's end", where_, what, i,
                   data_size);
        } else {
          HN_CHECK(key_end + 8 <= psize_,
                   "{}: {}: node {}'s overflow page number runs past the page's end", where_, what,
                   i);
          const auto first = load<std::uint64_t>(bytes_ + pgno * psize_ + key_end);
          const std::uint64_t pages = (kHeader - 1 + std::uint64_t{data_size}) / psize_ + 1;
          check_page_number(first, fmt::format("{}: node {}'s value", what, i));
          HN_CHECK(first + pages <= limit_,
                   "{}: {}: node {}'s value of {} bytes on pages {} to {} runs past the file's "
                   "last page {}",
                   where_, what, i, data_size, first, first + pages - 1, limit_ - 1);
          overflow_pages_ += pages;
        }
        ++records_;
      }
      std::reverse(stack.begin() + static_cast<std::ptrdiff_t>(pushed), stack.end());
    }
  }

  const std::uint8_t* bytes_;
  std::size_t size_;
  const std::string& where_;
  std::uint64_t psize_ = 0;
  std::uint64_t limit_ = 0;  // pages that can be read: within the file and the meta's count
  unsigned depth_ = 0;
  int meta_ = 0;
  std::uint64_t records_ = 0, tree_pages_ = 0, overflow_pages_ = 0;
};

}  // namespace

LmdbLayout check_lmdb_image(const std::uint8_t* bytes, std::size_t size, const std::string& where) {
  return Checker(bytes, size, where).run();
}

void check_lmdb_file(const std::string& dir, const std::string& context) {
  const std::string path = dir + "/data.mdb";
  // Non-blocking: were data.mdb swapped for a FIFO after the source's check, opening it
  // here still returns at once (and fstat refuses it).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return;  // liblmdb says why
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode) || info.st_size == 0) {
    ::close(fd);
    return;
  }
  const auto size = static_cast<std::size_t>(info.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  HN_CHECK(map != MAP_FAILED, "{}: LMDB '{}': cannot map {} ({} bytes) to check it: {}", context,
           dir, path, size, std::strerror(errno));
  struct Unmap {
    void* map;
    std::size_t size;
    ~Unmap() { ::munmap(map, size); }
  } unmap{map, size};
  check_lmdb_image(static_cast<const std::uint8_t*>(map), size,
                   fmt::format("{}: LMDB '{}'", context, path));
}

}  // namespace hn::detail
