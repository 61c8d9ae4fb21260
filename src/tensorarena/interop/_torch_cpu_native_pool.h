// A pool whose bookkeeping lives in C++ (tensorarena.torch.native_pool.NativePool), and what its
// two files share: _torch_cpu_native_pool.cpp keeps the books (the free extents, the live blocks,
// the route's take and give), _torch_cpu_native_pool_calls.cpp holds the module functions the
// Python side calls (native_pool_*). Every change to a pool is under pools_lock, and nothing
// holding it calls into Python or makes a Python object (_torch_cpu_native_pool.cpp).
#pragma once

#include "_torch_cpu_shim.h"

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

namespace tensorarena_shim {

// Live blocks by address: open addressing, linear probing, deletion by backward shift (no node
// allocated per block: a route's allocation and free cost no malloc here).
class LiveTable {
 public:
  struct Slot {
    uintptr_t key = 0;  // 0: empty (no block lives at address 0)
    uint64_t requested = 0, reserved = 0;
    Route* route = nullptr;  // a route took it: only the route frees it
  };

  LiveTable() { slots_.resize(size_t{1} << bits_); }

  Slot* find(uintptr_t key) {
    for (size_t i = index(key);; i = (i + 1) & mask()) {
      if (slots_[i].key == key) return &slots_[i];
      if (slots_[i].key == 0) return nullptr;
    }
  }

  void insert(const Slot& slot) {
    if (2 * (count_ + 1) > slots_.size()) grow();
    size_t i = index(slot.key);
    while (slots_[i].key != 0) i = (i + 1) & mask();
    slots_[i] = slot;
    count_++;
  }

  void erase(Slot* slot) {
    size_t hole = static_cast<size_t>(slot - slots_.data());
    for (size_t i = (hole + 1) & mask(); slots_[i].key != 0; i = (i + 1) & mask()) {
      size_t home = index(slots_[i].key);
      // slot i may move to the hole if its home is not in (hole, i] (cyclically)
      if (((i - home) & mask()) >= ((i - hole) & mask())) {
        slots_[hole] = slots_[i];
        hole = i;
      }
    }
    slots_[hole] = Slot{};
    count_--;
  }

  template <typename F>
  void each(F f) const {
    for (const Slot& slot : slots_) {
      if (slot.key != 0) f(slot);
    }
  }

 private:
  size_t mask() const { return slots_.size() - 1; }
  size_t index(uintptr_t key) const {
    return static_cast<size_t>((static_cast<uint64_t>(key) >> 6) * 0x9E3779B97F4A7C15ull >>
                               (64 - bits_));
  }
  void grow() {
    std::vector<Slot> old(size_t{1} << (bits_ + 1));
    old.swap(slots_);
    bits_++;
    count_ = 0;
    for (const Slot& slot : old) {
      if (slot.key != 0) insert(slot);
    }
  }

  unsigned bits_ = 10;
  size_t count_ = 0;
  std::vector<Slot> slots_;
};

struct NativePool {
  std::atomic<long> refs{1};
  uintptr_t base = 0;
  uint64_t capacity = 0;
  bool first_fit = false;
  bool closed = false;  // takes nothing more (the Python side closed it)
  std::map<uintptr_t, uint64_t> free_at;                 // free extents: start -> length
  std::set<std::pair<uint64_t, uintptr_t>> free_by_size;  // the same, by (length, start)
  LiveTable live;
  uint64_t blocks = 0, blocks_peak = 0, blocks_total = 0;
  uint64_t requested = 0, requested_peak = 0, requested_total = 0;
  uint64_t reserved = 0, reserved_peak = 0, reserved_total = 0;
  uint64_t ooms = 0;    // requests the arena had no room for
  uint64_t served = 0;  // blocks taken by a route, with no Python call
  size_t listed = 0;    // its place in pools (while its arena may hold a route's block)
};

constexpr uint64_t kGranule = 64;  // every extent starts and ends on it (torch's CPU alignment)

// The lock of every pool's state (held across fork: native_pools_before_fork).
extern std::mutex pools_lock;

// Status codes of a free (native_pool_deallocate's result).
enum Freed : int {
  kFreed = 0,
  kNotLive = 1,
  kForeign = 2,
  kSizeMismatch = 3,
  kInterior = 4,
  kRouted = 5  // a tensor's block: the route that took it frees it
};

// A new pool over [base, base + capacity) (checked by the caller: 64-aligned, a positive multiple
// of 64), listed for a route's free to find; its one reference is the caller's.
NativePool* native_pool_open(uintptr_t base, uint64_t capacity, bool first_fit);
// The Python side's door (each takes pools_lock): a block's address, or 0 where the arena has no
// room or the pool is closed (a refusal counted in ooms); and the free of the block at address,
// whose requested size must be nbytes and which no route may hold (a Freed code; nothing changed
// unless kFreed).
uintptr_t native_pool_allocate_block(NativePool* pool, uint64_t nbytes, uint64_t alignment);
int native_pool_free_block(NativePool* pool, uintptr_t address, uint64_t nbytes);

}  // namespace tensorarena_shim
