// Copies between two memory spaces given the drivers that own them (nullptr = plain host
// memory): directly when one side is host memory or both share a space, else staged
// through a host buffer.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "lib/core/driver.h"

namespace hn::detail {

// Returns true when a DeferTransfers scope took the copy instead (below).
bool transfer(Driver* dst_driver, void* dst, Driver* src_driver, const void* src,
              std::size_t bytes);

// What transfer() has moved on the calling thread: the split scheduler reads it around the
// operand resolution of each slice to charge the copies to that slice's device.
struct TransferTally {
  std::size_t bytes = 0;
  double seconds = 0.0;
};
TransferTally& transfer_tally();

// Copies into one driver's memory, left for that driver's thread to make (the split
// scheduler's operands: each device copies its own while the others compute). Only copies
// from host memory, or within the driver's own space, are deferred: one needing another
// device's driver is made at once, on the calling thread, while every driver is idle.
//
// Whoever deferred a copy has already counted its bytes as current where they go: a copy
// never made (its slice never ran, or an earlier copy failed) runs its `unmade` action
// (SyncedMemory::refresh's puts the currency back), so no stale bytes pass for current.
class DeferredCopies {
 public:
  DeferredCopies() = default;
  DeferredCopies(DeferredCopies&& other) noexcept;
  DeferredCopies& operator=(DeferredCopies&& other) noexcept;
  DeferredCopies(const DeferredCopies&) = delete;
  DeferredCopies& operator=(const DeferredCopies&) = delete;
  ~DeferredCopies();  // undoes the copies not made

  std::size_t bytes() const { return bytes_; }
  bool empty() const { return copies_.empty(); }
  // Makes the copies in the order they were asked for, on the calling thread (the driver's),
  // and forgets them; returns the seconds taken. When one fails, it and the rest are undone
  // and the error propagates.
  double make();
  // Gives the copy just deferred on this thread an action for when it is never made.
  static void on_unmade(std::function<void()> undo);

 private:
  friend bool transfer(Driver*, void*, Driver*, const void*, std::size_t);
  friend class DeferTransfers;
  struct Copy {
    Driver* dst_driver;
    void* dst;
    Driver* src_driver;
    const void* src;
    std::size_t bytes;
    std::function<void()> unmade;
  };
  void undo_from(std::size_t first) noexcept;
  Driver* driver_ = nullptr;  // whose memory the copies fill
  std::vector<Copy> copies_;
  std::size_t bytes_ = 0;
};

// While alive, transfer() on this thread into `on`'s memory appends to `into` where it may
// (see DeferredCopies) instead of copying. Scopes do not nest.
class DeferTransfers {
 public:
  DeferTransfers(DeferredCopies& into, Driver& on);
  ~DeferTransfers();
  DeferTransfers(const DeferTransfers&) = delete;
  DeferTransfers& operator=(const DeferTransfers&) = delete;
};

}  // namespace hn::detail
