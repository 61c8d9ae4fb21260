// A pool whose bookkeeping lives in C++ (tensorarena.torch.native_pool.NativePool): one arena
// (memory the Python side owns and gives back), carved by best fit (or first fit) over the free
// extents, kept by address and coalesced with their neighbours as blocks come back.
//
// Two doors lead to the same state:
//  * Python's NativePool.allocate/deallocate/statistics call native_pool_* below (one Python
//    call each, as any resource's methods are);
//  * a torch CPU route to the pool (tensorarena.torch.use(pool)) carries the pool
//    (route_attach_pool) and takes each block with native_pool_take and gives it back with
//    native_pool_give: no Python call. Where the arena has no room, the route makes its one
//    Python call, to NativePool.allocate (whose fallback, if any, serves it).
// A route's block is found by its address (native_pool_give: the pools whose arena holds it, a few,
// then the pool's own live table), so a route keeps no table of its own for them.
// Every change is under one process-wide mutex (pools_lock), so a free may come from any thread,
// with or without the GIL; it is held across fork (native_pools_before_fork), so a child finds
// every pool consistent. Nothing here calls into Python or makes a Python object while holding
// it: a collection run inside such a call could free a routed block on this very thread, which
// would take the lock again.
// A live block's bytes are never handed out again: a block is taken out of the free extents
// before it is given and put back only when it is freed once; a free of an address that is not a
// live block's start changes nothing and says why (DoubleFreeError etc. on the Python side).
// Lifetime: counted (std::atomic): the Python capsule holds one reference, each route that
// carries the pool one. The arena's memory is the Python side's, which keeps it until the pool
// is collected: a route holds the pool's bound methods, so the pool outlives its routed blocks.
#include "_torch_cpu_shim.h"

#include <algorithm>
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

namespace {

constexpr const char* kCapsule = "tensorarena.native_pool";
constexpr uint64_t kGranule = 64;  // every extent starts and ends on it (torch's CPU alignment)

std::mutex pools_lock;
std::vector<NativePool*> pools;  // every live pool, for a route's free to find its block's

// Status codes of a free (native_pool_deallocate's result).
enum Freed : int {
  kFreed = 0,
  kNotLive = 1,
  kForeign = 2,
  kSizeMismatch = 3,
  kInterior = 4,
  kRouted = 5  // a tensor's block: the route that took it frees it
};

uint64_t round_up(uint64_t value, uint64_t to) { return (value + to - 1) & ~(to - 1); }

// The extent at `at` (in free_at) becomes (start, length): its nodes are moved, not reallocated.
void move_extent(NativePool* pool, std::map<uintptr_t, uint64_t>::iterator at, uintptr_t start,
                 uint64_t length) {
  auto sized = pool->free_by_size.extract({at->second, at->first});
  sized.value() = {length, start};
  pool->free_by_size.insert(std::move(sized));
  if (at->first == start) {
    at->second = length;
    return;
  }
  auto node = pool->free_at.extract(at);
  node.key() = start;
  node.mapped() = length;
  pool->free_at.insert(std::move(node));
}

void erase_extent(NativePool* pool, std::map<uintptr_t, uint64_t>::iterator at) {
  pool->free_by_size.erase({at->second, at->first});
  pool->free_at.erase(at);
}

// [start, start + length) is free again, merged with the free extents it touches; pools_lock held.
void add_free(NativePool* pool, uintptr_t start, uint64_t length) {
  auto next = pool->free_at.lower_bound(start);
  bool merge_next = next != pool->free_at.end() && next->first == start + length;
  auto before = next;
  bool merge_before = next != pool->free_at.begin() &&
                      (--before, before->first + before->second == start);
  if (merge_before && merge_next) {
    uint64_t grown = before->second + length + next->second;
    erase_extent(pool, next);
    move_extent(pool, before, before->first, grown);
  } else if (merge_before) {
    move_extent(pool, before, before->first, before->second + length);
  } else if (merge_next) {
    move_extent(pool, next, start, length + next->second);
  } else {
    pool->free_at.emplace(start, length);
    pool->free_by_size.emplace(length, start);
  }
}

// Where a block of size bytes (a granule multiple) aligned to align fits in extent (start, length),
// or 0.
uintptr_t fit(uintptr_t start, uint64_t length, uint64_t size, uint64_t align) {
  uintptr_t at = round_up(start, align);
  if (at < start || at - start > length || length - (at - start) < size) return 0;
  return at;
}

// A block's address, or 0 where no extent holds it (refusals counted if count_refusal).
uintptr_t take_locked(NativePool* pool, uint64_t nbytes, uint64_t alignment, bool count_refusal,
                      Route* routed) {
  if (pool->closed) return 0;
  uint64_t align = std::max<uint64_t>(alignment, kGranule);
  if (nbytes > pool->capacity) {
    pool->ooms += count_refusal;
    return 0;
  }
  uint64_t size = round_up(std::max<uint64_t>(nbytes, 1), kGranule);
  uintptr_t start = 0, at = 0;
  uint64_t length = 0;
  if (pool->first_fit) {  // the lowest-addressed extent that holds it
    for (const auto& [lo, len] : pool->free_at) {
      if ((at = fit(lo, len, size, align)) != 0) {
        start = lo;
        length = len;
        break;
      }
    }
  } else {  // the smallest extent that holds it (then the lowest address)
    for (auto it = pool->free_by_size.lower_bound({size, 0}); it != pool->free_by_size.end();
         ++it) {
      if ((at = fit(it->second, it->first, size, align)) != 0) {
        start = it->second;
        length = it->first;
        break;
      }
    }
  }
  if (at == 0) {
    pool->ooms += count_refusal;
    return 0;
  }
  // The extent keeps its nodes for what is left of it: before the block if anything is, else
  // after it; a remainder on both sides adds one extent.
  auto extent = pool->free_at.find(start);
  uintptr_t end = at + size;
  if (at > start) {
    move_extent(pool, extent, start, at - start);
    if (end < start + length) add_free(pool, end, start + length - end);
  } else if (end < start + length) {
    move_extent(pool, extent, end, start + length - end);
  } else {
    erase_extent(pool, extent);
  }
  pool->live.insert(LiveTable::Slot{at, nbytes, size, routed});
  pool->blocks++;
  pool->blocks_total++;
  pool->blocks_peak = std::max(pool->blocks_peak, pool->blocks);
  pool->requested += nbytes;
  pool->requested_total += nbytes;
  pool->requested_peak = std::max(pool->requested_peak, pool->requested);
  pool->reserved += size;
  pool->reserved_total += size;
  pool->reserved_peak = std::max(pool->reserved_peak, pool->reserved);
  return at;
}

// Free the block at address; a status code. From Python (check), the block's requested size must
// be nbytes and no route may hold it; from a route, the table proved it is the route's.
int give_locked(NativePool* pool, uintptr_t address, bool check, uint64_t nbytes) {
  LiveTable::Slot* found = pool->live.find(address);
  if (found == nullptr) {
    if (address < pool->base || address - pool->base >= pool->capacity) return kForeign;
    auto extent = pool->free_at.upper_bound(address);  // the first extent starting after it
    if (extent != pool->free_at.begin()) {
      --extent;
      if (address < extent->first + extent->second) return kNotLive;  // inside a free extent
    }
    return kInterior;  // inside a live block, not its start
  }
  if (check && found->route != nullptr) return kRouted;
  if (check && found->requested != nbytes) return kSizeMismatch;
  LiveTable::Slot block = *found;
  pool->live.erase(found);
  pool->blocks--;
  pool->requested -= block.requested;
  pool->reserved -= block.reserved;
  add_free(pool, address, block.reserved);
  return kFreed;
}

NativePool* pool_of(PyObject* capsule) {
  return static_cast<NativePool*>(PyCapsule_GetPointer(capsule, kCapsule));
}

void drop_capsule(PyObject* capsule) {
  NativePool* pool = pool_of(capsule);
  if (pool != nullptr) native_pool_release(pool);
  else PyErr_Clear();
}

bool unsigned_arg(PyObject* arg, uint64_t* out) {
  *out = PyLong_AsUnsignedLongLong(arg);
  return !(*out == static_cast<uint64_t>(-1) && PyErr_Occurred());
}

// native_pool_new(base, capacity, first_fit) -> capsule
PyObject* native_pool_new(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  uint64_t base, capacity;
  if (nargs != 3 || !unsigned_arg(args[0], &base) || !unsigned_arg(args[1], &capacity)) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "native_pool_new(base, capacity, first_fit)");
    return nullptr;
  }
  if (base == 0 || base % kGranule != 0 || capacity < kGranule || capacity % kGranule != 0 ||
      base + capacity < base) {
    PyErr_SetString(PyExc_ValueError, "native_pool_new takes a 64-aligned base and a capacity "
                    "that is a positive multiple of 64");
    return nullptr;
  }
  int first = PyObject_IsTrue(args[2]);
  if (first < 0) return nullptr;
  auto* pool = new NativePool();
  pool->base = base;
  pool->capacity = capacity;
  pool->first_fit = first != 0;
  pool->free_at.emplace(base, capacity);
  pool->free_by_size.emplace(capacity, base);
  {
    std::lock_guard<std::mutex> guard(pools_lock);
    pool->listed = pools.size();
    pools.push_back(pool);
  }
  PyObject* capsule = PyCapsule_New(pool, kCapsule, drop_capsule);
  if (capsule == nullptr) native_pool_release(pool);
  return capsule;
}

bool parse(PyObject* const* args, Py_ssize_t nargs, Py_ssize_t want, NativePool** pool,
           uint64_t* first, uint64_t* second) {
  if (nargs != want) {
    PyErr_SetString(PyExc_TypeError, "wrong number of arguments");
    return false;
  }
  *pool = pool_of(args[0]);
  if (*pool == nullptr) return false;
  if (want > 1 && !unsigned_arg(args[1], first)) return false;
  if (want > 2 && !unsigned_arg(args[2], second)) return false;
  return true;
}

// native_pool_allocate(capsule, nbytes, alignment) -> address, or None where the arena has no
// room (or the pool is closed)
PyObject* native_pool_allocate(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  NativePool* pool;
  uint64_t nbytes, alignment;
  if (!parse(args, nargs, 3, &pool, &nbytes, &alignment)) return nullptr;
  uintptr_t at;
  {
    std::lock_guard<std::mutex> guard(pools_lock);
    at = take_locked(pool, nbytes, alignment, true, nullptr);
  }
  if (at == 0) Py_RETURN_NONE;
  return PyLong_FromUnsignedLongLong(at);
}

// native_pool_deallocate(capsule, address, nbytes) -> status (0 freed, 1 not live: freed already,
// 2 not in the arena, 3 another size, 4 inside a live block, 5 a route's block); nothing changed
// unless 0
PyObject* native_pool_deallocate(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  NativePool* pool;
  uint64_t address, nbytes;
  if (!parse(args, nargs, 3, &pool, &address, &nbytes)) return nullptr;
  int status;
  {
    std::lock_guard<std::mutex> guard(pools_lock);
    status = give_locked(pool, address, true, nbytes);
  }
  return PyLong_FromLong(status);
}

// native_pool_size_of(capsule, address) -> the live block's requested size, or None
PyObject* native_pool_size_of(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  NativePool* pool;
  uint64_t address, unused;
  if (!parse(args, nargs, 2, &pool, &address, &unused)) return nullptr;
  uint64_t size = 0;
  bool found;
  {
    std::lock_guard<std::mutex> guard(pools_lock);
    LiveTable::Slot* block = pool->live.find(address);
    found = block != nullptr;
    if (found) size = block->requested;
  }
  if (!found) Py_RETURN_NONE;
  return PyLong_FromUnsignedLongLong(size);
}

// native_pool_statistics(capsule) -> (blocks, peak, total, requested, peak, total, reserved,
// peak, total, free bytes, largest free extent, free extents, ooms, served)
PyObject* native_pool_statistics(PyObject*, PyObject* capsule) {
  NativePool* pool = pool_of(capsule);
  if (pool == nullptr) return nullptr;
  uint64_t words[14];
  {
    std::lock_guard<std::mutex> guard(pools_lock);
    uint64_t free_bytes = 0;
    for (const auto& extent : pool->free_at) free_bytes += extent.second;
    uint64_t largest = pool->free_by_size.empty() ? 0 : pool->free_by_size.rbegin()->first;
    uint64_t values[14] = {pool->blocks,      pool->blocks_peak,    pool->blocks_total,
                           pool->requested,   pool->requested_peak, pool->requested_total,
                           pool->reserved,    pool->reserved_peak,  pool->reserved_total,
                           free_bytes,        largest,              pool->free_at.size(),
                           pool->ooms,        pool->served};
    std::copy(values, values + 14, words);
  }
  return Py_BuildValue("(KKKKKKKKKKKKKK)", words[0], words[1], words[2], words[3], words[4],
                       words[5], words[6], words[7], words[8], words[9], words[10], words[11],
                       words[12], words[13]);
}

// native_pool_blocks(capsule) -> ([(address, requested) of live blocks], [(start, length) of
// free extents]), both by address
PyObject* native_pool_blocks(PyObject*, PyObject* capsule) {
  NativePool* pool = pool_of(capsule);
  if (pool == nullptr) return nullptr;
  std::vector<std::pair<uint64_t, uint64_t>> live, extents;
  {
    std::lock_guard<std::mutex> guard(pools_lock);
    pool->live.each([&](const LiveTable::Slot& slot) { live.emplace_back(slot.key, slot.requested); });
    for (const auto& extent : pool->free_at) extents.emplace_back(extent.first, extent.second);
  }
  std::sort(live.begin(), live.end());
  PyObject* lists[2] = {PyList_New(0), PyList_New(0)};
  const std::vector<std::pair<uint64_t, uint64_t>>* from[2] = {&live, &extents};
  for (int i = 0; i < 2; i++) {
    if (lists[i] == nullptr) break;
    for (const auto& [a, b] : *from[i]) {
      PyObject* pair = Py_BuildValue("(KK)", a, b);
      if (pair == nullptr || PyList_Append(lists[i], pair) != 0) {
        Py_XDECREF(pair);
        Py_CLEAR(lists[i]);
        break;
      }
      Py_DECREF(pair);
    }
  }
  if (lists[0] == nullptr || lists[1] == nullptr) {
    Py_XDECREF(lists[0]);
    Py_XDECREF(lists[1]);
    return nullptr;
  }
  return Py_BuildValue("(NN)", lists[0], lists[1]);
}

// native_pool_close(capsule) -> live blocks: it takes nothing more
PyObject* native_pool_close(PyObject*, PyObject* capsule) {
  NativePool* pool = pool_of(capsule);
  if (pool == nullptr) return nullptr;
  uint64_t blocks;
  {
    std::lock_guard<std::mutex> guard(pools_lock);
    pool->closed = true;
    blocks = pool->blocks;
  }
  return PyLong_FromUnsignedLongLong(blocks);
}

PyObject* native_pool_reset_peaks(PyObject*, PyObject* capsule) {
  NativePool* pool = pool_of(capsule);
  if (pool == nullptr) return nullptr;
  {
    std::lock_guard<std::mutex> guard(pools_lock);
    pool->blocks_peak = pool->blocks;
    pool->requested_peak = pool->requested;
    pool->reserved_peak = pool->reserved;
  }
  Py_RETURN_NONE;
}

// native_pool_attach(route capsule, pool capsule): the route takes its blocks here first
PyObject* native_pool_attach(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "native_pool_attach(route, pool)");
    return nullptr;
  }
  NativePool* pool = pool_of(args[1]);
  if (pool == nullptr || !route_attach_pool(args[0], pool)) return nullptr;
  Py_RETURN_NONE;
}

}  // namespace

void* native_pool_take(NativePool* pool, size_t nbytes, uint64_t alignment, Route* route) {
  std::lock_guard<std::mutex> guard(pools_lock);
  // A refusal here is not counted: the route asks the Python side next, which counts it.
  uintptr_t at = take_locked(pool, nbytes, alignment, false, route);
  if (at != 0) pool->served++;
  return reinterpret_cast<void*>(at);
}

bool native_pool_give(void* data, Route** route, size_t* nbytes) {
  uintptr_t address = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> guard(pools_lock);
  for (NativePool* pool : pools) {  // (a few: a pool per NativePool alive)
    if (address < pool->base || address - pool->base >= pool->capacity) continue;
    LiveTable::Slot* found = pool->live.find(address);
    if (found == nullptr || found->route == nullptr) continue;  // not a route's block here
    *route = found->route;
    *nbytes = static_cast<size_t>(found->requested);
    give_locked(pool, address, false, 0);
    return true;
  }
  return false;
}

void native_pool_hold(NativePool* pool) { pool->refs.fetch_add(1); }

void native_pool_release(NativePool* pool) {  // never with pools_lock held
  if (pool->refs.fetch_sub(1) != 1) return;
  {
    std::lock_guard<std::mutex> guard(pools_lock);
    pools.back()->listed = pool->listed;
    pools[pool->listed] = pools.back();
    pools.pop_back();
  }
  delete pool;
}

void native_pools_before_fork() { pools_lock.lock(); }
void native_pools_after_fork() { pools_lock.unlock(); }

PyMethodDef native_pool_methods[] = {
    {"native_pool_new", reinterpret_cast<PyCFunction>(native_pool_new), METH_FASTCALL,
     "A native pool over [base, base + capacity)."},
    {"native_pool_allocate", reinterpret_cast<PyCFunction>(native_pool_allocate), METH_FASTCALL,
     "A block's address, or None where the arena has no room."},
    {"native_pool_deallocate", reinterpret_cast<PyCFunction>(native_pool_deallocate),
     METH_FASTCALL, "Free a block; a status code (0: freed)."},
    {"native_pool_size_of", reinterpret_cast<PyCFunction>(native_pool_size_of), METH_FASTCALL,
     "A live block's requested size, or None."},
    {"native_pool_statistics", native_pool_statistics, METH_O, "The pool's counters."},
    {"native_pool_blocks", native_pool_blocks, METH_O, "Live blocks and free extents."},
    {"native_pool_close", native_pool_close, METH_O, "Take nothing more; the live blocks."},
    {"native_pool_reset_peaks", native_pool_reset_peaks, METH_O, "Peaks to their current."},
    {"native_pool_attach", reinterpret_cast<PyCFunction>(native_pool_attach), METH_FASTCALL,
     "A route takes its blocks from the pool with no Python call."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace tensorarena_shim
