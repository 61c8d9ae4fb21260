// A native pool's books (_torch_cpu_native_pool.h): one arena (memory the Python side owns and
// gives back), carved by best fit (or first fit) over the free extents, kept by address and
// coalesced with their neighbours as blocks come back.
//
// Two doors lead to the same state:
//  * Python's NativePool.allocate/deallocate/statistics call native_pool_* (one Python call each,
//    as any resource's methods are; _torch_cpu_native_pool_calls.cpp), which take and free blocks
//    through native_pool_allocate_block and native_pool_free_block below;
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
#include "_torch_cpu_native_pool.h"

#include <algorithm>

namespace tensorarena_shim {

std::mutex pools_lock;

namespace {

std::vector<NativePool*> pools;  // every live pool, for a route's free to find its block's

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

}  // namespace

NativePool* native_pool_open(uintptr_t base, uint64_t capacity, bool first_fit) {
  auto* pool = new NativePool();
  pool->base = base;
  pool->capacity = capacity;
  pool->first_fit = first_fit;
  pool->free_at.emplace(base, capacity);
  pool->free_by_size.emplace(capacity, base);
  {
    std::lock_guard<std::mutex> guard(pools_lock);
    pool->listed = pools.size();
    pools.push_back(pool);
  }
  return pool;
}

uintptr_t native_pool_allocate_block(NativePool* pool, uint64_t nbytes, uint64_t alignment) {
  std::lock_guard<std::mutex> guard(pools_lock);
  return take_locked(pool, nbytes, alignment, true, nullptr);
}

int native_pool_free_block(NativePool* pool, uintptr_t address, uint64_t nbytes) {
  std::lock_guard<std::mutex> guard(pools_lock);
  return give_locked(pool, address, true, nbytes);
}

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

}  // namespace tensorarena_shim
