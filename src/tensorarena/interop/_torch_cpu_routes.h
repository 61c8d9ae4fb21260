// A torch CPU route's state (_torch_cpu_routes.cpp: allocations and frees;
// _torch_cpu_route_calls.cpp: the module functions that make, set and read routes).
#pragma once

#include "_torch_cpu_shim.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace tensorarena_shim {

struct Route {
  std::atomic<long> refs{1};  // the capsule's, one per slot that holds it, one per live block
  PyObject* allocate = nullptr;
  PyObject* deallocate = nullptr;
  uint64_t alignment = 64;
  // statistics: counts by any thread; ooms, failures and the last error under the GIL
  std::atomic<uint64_t> blocks{0}, blocks_peak{0}, blocks_total{0};
  std::atomic<uint64_t> bytes{0}, bytes_peak{0}, bytes_total{0};
  uint64_t ooms = 0, free_failures = 0, deferred = 0;
  PyObject* last_error = nullptr;
  // learned plans' slots served with no Python call, and a native pool, if any (set once)
  std::atomic<Serving*> serving{nullptr};
  std::atomic<NativePool*> pool{nullptr};
};

constexpr const char* kRouteCapsule = "tensorarena.torch_cpu_route";

struct Block {  // a block the route's Python resource gave
  Route* route;
  size_t nbytes;
};

extern std::mutex table_lock;
extern std::unordered_map<void*, Block> table;  // live blocks of Python resources
extern std::atomic<int64_t> native_blocks;      // live natively served blocks, every route together
// Routes alive that carry a server or a native pool: while none does, an allocation takes the
// GIL at once and reads its route under it (no current_lock), as every Python call needs it.
extern std::atomic<long> native_routes;
// every_thread is replaced, and read with a reference taken (without the GIL), under current_lock.
extern std::mutex current_lock;
extern std::atomic<Route*> every_thread;
extern thread_local Route* this_thread;
extern std::atomic<bool> gone;  // the interpreter is shutting down: no more calls into it

bool interpreter_gone();
// Drop a reference under the GIL: the last one drops the resource's methods.
void release(Route* route);

}  // namespace tensorarena_shim
