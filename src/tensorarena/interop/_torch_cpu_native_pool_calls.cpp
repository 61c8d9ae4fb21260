// The module functions of a native pool (_torch_cpu_native_pool.h), what the Python side's
// NativePool calls (one Python call each): make a pool, take and free its blocks (through the
// books' door, _torch_cpu_native_pool.cpp), read its counters, blocks and extents, close it, and
// attach it to a route. Each takes pools_lock for what it reads or changes and makes its Python
// objects (and errors) with the lock released.
#include "_torch_cpu_native_pool.h"

#include <algorithm>

namespace tensorarena_shim {

namespace {

constexpr const char* kCapsule = "tensorarena.native_pool";

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
  NativePool* pool = native_pool_open(base, capacity, first != 0);
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
  uintptr_t at = native_pool_allocate_block(pool, nbytes, alignment);
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
  return PyLong_FromLong(native_pool_free_block(pool, address, nbytes));
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
