// Routing torch's CPU allocations to a Python memory resource (tensorarena.torch.use).
//
// A *route* holds a resource's bound allocate and deallocate. While one is set (for every thread,
// or for one thread only: the thread's own wins), each CPU allocation of nbytes > 0 calls
// allocate(nbytes, alignment) once, under the GIL, and the block's DataPtr is (data, data,
// free_block): raw_allocate works on it. The block is remembered by address with its route, so
// its free goes back to the route that made it, whichever route is set then, installed or not;
// blocks torch's own allocator made keep that allocator's deleter and never come here.
//
// What can go wrong, and what happens:
//  * the resource raises (or returns no usable address): the error is kept on the route
//    (last_error, ooms) and torch gets c10::OutOfMemoryError, which Python sees as
//    torch.OutOfMemoryError; nothing else changed.
//  * the resource's Python code was interrupted (Ctrl-C: KeyboardInterrupt): in allocate, the
//    KeyboardInterrupt itself is thrown (torch's python_error, which torch hands back to Python
//    as it is), not the out-of-memory error a program catching RuntimeError would swallow; in
//    deallocate (nowhere to throw), the interrupt is delivered again (PyErr_SetInterrupt).
//  * a free arrives on a thread without the GIL (an intra-op worker, autograd): it takes it
//    (PyGILState_Ensure). An exception pending on the thread is kept aside and put back.
//  * a free arrives while this thread is already inside a call to a resource (Python's cyclic
//    collector ran in the middle of allocate): it is deferred to the end of that call, so a
//    resource is never re-entered from its own call. Allocations made inside such a call (the
//    resource's own Python code) go to torch's allocator.
//  * frees after the interpreter began to shut down (shutdown() at exit, or finalizing): the
//    block is leaked, since the resource's interpreter is going; the process is ending anyway.
//  * fork: the table's lock is held across fork, so the child finds it consistent.
// Each routed allocation and free is reported to torch's profiler as torch's own CPU allocator
// reports its own (when the thread is profiling memory), so `tensorarena trace record` and
// torch.profiler(profile_memory=True) see the program's allocations under a route too.
// A route may carry a native pool (route_attach_pool, tensorarena.torch.NativePool): it takes each
// block there first, and frees its blocks back there, with no Python call; only an allocation
// the pool's arena has no room for makes the Python call (to the pool's allocate). A route may
// carry a server of learned plans (route_attach_serving) likewise.
// Natively served blocks (a server's or a native pool's) take no GIL and no entry in the table
// here: their DataPtr's deleter is free_native, which finds the block in its owner's own books by
// address (the server's arenas, the pools' live tables), each under its own lock; the GIL is
// taken only where Python must be called (a retired plan's block, the route's last reference).
// A route lives while a Python capsule, a current slot or a live block refers to it (an atomic
// count; the every-thread slot is read and counted under current_lock, so a route another
// thread replaces is not freed under a reader); the last one drops the resource's methods,
// under the GIL. Its block and byte counters are atomics, changed by any thread.
#include "_torch_cpu_routes.h"

#include <c10/util/Exception.h>
#include <torch/csrc/Exceptions.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace tensorarena_shim {

std::mutex table_lock;
std::unordered_map<void*, Block> table;
std::atomic<int64_t> native_blocks{0};
std::atomic<long> native_routes{0};
std::mutex current_lock;
std::atomic<Route*> every_thread{nullptr};
thread_local Route* this_thread = nullptr;
std::atomic<bool> gone{false};

bool interpreter_gone() {
#if PY_VERSION_HEX >= 0x030D0000
  return gone.load() || !Py_IsInitialized() || Py_IsFinalizing();
#else
  return gone.load() || !Py_IsInitialized() || _Py_IsFinalizing();
#endif
}

namespace {

void destroy(Route* route) {  // under the GIL, its last reference gone
  Py_XDECREF(route->allocate);
  Py_XDECREF(route->deallocate);
  Py_XDECREF(route->last_error);
  Serving* serving = route->serving.load();
  NativePool* pool = route->pool.load();
  native_routes.fetch_sub((serving != nullptr) + (pool != nullptr));
  delete route;
  if (serving != nullptr) serving_release(serving);
  if (pool != nullptr) native_pool_release(pool);
}

}  // namespace

void release(Route* route) {  // under the GIL
  if (route->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) destroy(route);
}

namespace {

struct Pending {
  Route* route;
  void* data;
  size_t nbytes;
};

thread_local int in_call = 0;   // depth of calls into a resource on this thread
thread_local std::vector<Pending> pending;

// Drop a reference with or without the GIL: taken only if it is the last one.
void release_native(Route* route) {
  if (route->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  if (interpreter_gone()) return;  // leaked: the resource's interpreter is going
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *saved_type, *saved_value, *saved_trace;
  PyErr_Fetch(&saved_type, &saved_value, &saved_trace);
  destroy(route);
  PyErr_Restore(saved_type, saved_value, saved_trace);
  PyGILState_Release(gil);
}

// The route serving this thread, with a reference taken for the caller, or nullptr (any thread;
// under the GIL, every_thread's route can be read without current_lock: it changes under the GIL
// too, and the slot's own reference keeps it alive).
Route* acquire_current(bool gil) {
  Route* route = this_thread;  // (only this thread changes its own slot)
  if (route == nullptr && gil) {
    route = every_thread.load(std::memory_order_acquire);
    if (route != nullptr) route->refs.fetch_add(1, std::memory_order_relaxed);
    return route;
  }
  if (route == nullptr) {
    std::lock_guard<std::mutex> guard(current_lock);
    route = every_thread.load(std::memory_order_relaxed);
    if (route != nullptr) route->refs.fetch_add(1, std::memory_order_relaxed);
    return route;
  }
  route->refs.fetch_add(1, std::memory_order_relaxed);
  return route;
}

void raise_peak(std::atomic<uint64_t>& peak, uint64_t now) {
  uint64_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

// Count a block the route handed out (any thread); the block holds a reference to the route.
void count_in(Route* route, void* data, size_t nbytes) {
  raise_peak(route->blocks_peak, route->blocks.fetch_add(1, std::memory_order_relaxed) + 1);
  route->blocks_total.fetch_add(1, std::memory_order_relaxed);
  uint64_t bytes = route->bytes.fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
  raise_peak(route->bytes_peak, bytes);
  route->bytes_total.fetch_add(nbytes, std::memory_order_relaxed);
  if (c10::memoryProfilingEnabled()) {
    c10::reportMemoryUsageToProfiler(data, static_cast<int64_t>(nbytes), bytes, bytes,
                                     c10::Device(c10::DeviceType::CPU));
  }
}

// Count a block of the route's freed (any thread); its reference is the caller's to drop.
void count_out(Route* route, void* data, size_t nbytes) {
  route->blocks.fetch_sub(1, std::memory_order_relaxed);
  uint64_t bytes = route->bytes.fetch_sub(nbytes, std::memory_order_relaxed) - nbytes;
  if (c10::memoryProfilingEnabled()) {
    c10::reportMemoryUsageToProfiler(data, -static_cast<int64_t>(nbytes), bytes, bytes,
                                     c10::Device(c10::DeviceType::CPU));
  }
}

// Keep the exception being raised as the route's last error (under the GIL); clears it. Without
// its traceback: the resource's frame links back (f_back) to the program's frames, whose locals
// (a forward's activations) it would keep alive.
void keep_error(Route* route) {
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);
  PyErr_NormalizeException(&type, &value, &trace);
  if (value != nullptr) PyException_SetTraceback(value, Py_None);
  Py_XDECREF(route->last_error);
  route->last_error = value;  // the reference moves
  Py_XDECREF(type);
  Py_XDECREF(trace);
}

std::string describe(PyObject* error) {  // under the GIL; never raises
  if (error == nullptr) return "no error";
  std::string text = Py_TYPE(error)->tp_name;
  PyObject* str = PyObject_Str(error);
  if (str != nullptr) {
    const char* utf8 = PyUnicode_AsUTF8(str);
    if (utf8 != nullptr && *utf8 != '\0') text += std::string(": ") + utf8;
  }
  Py_XDECREF(str);
  PyErr_Clear();
  return text;
}

void give_back(Route* route, void* data, size_t nbytes);

void drain() {  // under the GIL, outside any call into a resource
  while (in_call == 0 && !pending.empty()) {
    Pending next = pending.back();
    pending.pop_back();
    give_back(next.route, next.data, next.nbytes);
  }
}

// Call deallocate(data, nbytes) of the route (under the GIL, nothing pending on the thread).
void give_back(Route* route, void* data, size_t nbytes) {
  in_call++;
  PyObject* args[2] = {PyLong_FromUnsignedLongLong(reinterpret_cast<uintptr_t>(data)),
                       PyLong_FromSize_t(nbytes)};
  PyObject* result = nullptr;
  if (args[0] != nullptr && args[1] != nullptr) {
    result = PyObject_Vectorcall(route->deallocate, args, 2, nullptr);
  }
  Py_XDECREF(args[0]);
  Py_XDECREF(args[1]);
  if (result == nullptr) {  // nowhere to raise: kept on the route; the block stays the resource's
    route->free_failures++;
    bool interrupted = PyErr_ExceptionMatches(PyExc_KeyboardInterrupt);
    keep_error(route);
    if (interrupted) PyErr_SetInterrupt();  // raised again at the program's next bytecode
  }
  Py_XDECREF(result);
  count_out(route, data, nbytes);
  in_call--;
  release(route);
  drain();
}

// The Python call to the route's allocate (under the GIL, route a counted reference that
// becomes the block's): a block, or an error thrown.
c10::DataPtr allocate_in_python(Route* route, size_t nbytes) {
  PyObject *saved_type, *saved_value, *saved_trace;
  PyErr_Fetch(&saved_type, &saved_value, &saved_trace);
  in_call++;
  PyObject* args[2] = {PyLong_FromSize_t(nbytes), PyLong_FromUnsignedLongLong(route->alignment)};
  PyObject* result = nullptr;
  if (args[0] != nullptr && args[1] != nullptr) {
    result = PyObject_Vectorcall(route->allocate, args, 2, nullptr);
  }
  Py_XDECREF(args[0]);
  Py_XDECREF(args[1]);
  std::string failure;
  uintptr_t address = 0;
  bool interrupted = false;
  if (result == nullptr) {
    interrupted = PyErr_ExceptionMatches(PyExc_KeyboardInterrupt);
    keep_error(route);
    failure = describe(route->last_error);
  } else {
    address = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(result));
    if (PyErr_Occurred()) {
      PyErr_Clear();
      failure = std::string("allocate returned ") + Py_TYPE(result)->tp_name +
                ", not an address";
      address = 0;
    } else if (address == 0 || address % route->alignment != 0) {
      // Not usable, but the resource's: give it back (a failure there is only counted).
      failure = "allocate returned " + std::to_string(address) + ", not an address aligned to " +
                std::to_string(route->alignment) + " bytes";
      if (address != 0) {
        route->refs.fetch_add(1);  // as a live block's, which give_back drops
        route->blocks.fetch_add(1);
        route->bytes.fetch_add(nbytes);
        give_back(route, reinterpret_cast<void*>(address), nbytes);
      }
      address = 0;
    }
    Py_DECREF(result);
  }
  if (address != 0) {
    std::lock_guard<std::mutex> guard(table_lock);
    if (!table.emplace(reinterpret_cast<void*>(address), Block{route, nbytes}).second) {
      // Still live here: taking it would alias a tensor. Never given back (it is live).
      failure = "allocate returned an address that a live tensor holds";
      address = 0;
    }
  }
  if (address != 0) {
    count_in(route, reinterpret_cast<void*>(address), nbytes);
  } else {
    route->ooms++;
  }
  in_call--;
  PyObject* error_value = nullptr;
  if (interrupted && route->last_error != nullptr) {
    error_value = route->last_error;
    Py_INCREF(error_value);
  }
  if (address == 0) release(route);  // (the block's reference, not taken)
  drain();
  if (error_value != nullptr) {
    python_error error;  // torch's; carries the KeyboardInterrupt back to Python as it is
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error_value)), error_value);
    Py_DECREF(error_value);
    error.persist();
    PyErr_Restore(saved_type, saved_value, saved_trace);
    throw error;
  }
  PyErr_Restore(saved_type, saved_value, saved_trace);
  if (address == 0) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "tensorarena.torch.use: the resource could not "
                     "allocate ", nbytes, " bytes (", failure, ")");
  }
  void* data = reinterpret_cast<void*>(address);
  return c10::DataPtr(data, data, &free_block, c10::Device(c10::DeviceType::CPU));
}

// Free a block a server or a native pool gave (any thread; the GIL only where Python must be
// called): false if data is no such block.
bool free_natively(void* data) {
  ServedFree served;
  if (!serving_give(data, &served) && !native_pool_give(data, &served.route, &served.nbytes)) {
    return false;
  }
  native_blocks.fetch_sub(1, std::memory_order_relaxed);
  count_out(served.route, data, served.nbytes);
  if (served.sync != nullptr && in_call == 0 && !interpreter_gone()) {
    // Its table was retired (or its server closed): the Python side books it now.
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *saved_type, *saved_value, *saved_trace;
    PyErr_Fetch(&saved_type, &saved_value, &saved_trace);
    in_call++;
    PyObject* result = PyObject_CallNoArgs(served.sync);
    if (result == nullptr) {
      served.route->free_failures++;
      bool interrupted = PyErr_ExceptionMatches(PyExc_KeyboardInterrupt);
      keep_error(served.route);
      if (interrupted) PyErr_SetInterrupt();
    }
    Py_XDECREF(result);
    in_call--;
    drain();
    PyErr_Restore(saved_type, saved_value, saved_trace);
    PyGILState_Release(gil);
  }
  release_native(served.route);
  return true;
}

// allocate_in_python with the GIL taken (gil): it is given back before the block or the error.
c10::DataPtr allocate_holding(Route* route, size_t nbytes, PyGILState_STATE gil) {
  try {
    c10::DataPtr block = allocate_in_python(route, nbytes);
    PyGILState_Release(gil);
    return block;
  } catch (...) {
    PyGILState_Release(gil);
    throw;
  }
}

}  // namespace

bool routing() {
  return in_call == 0 &&
         (this_thread != nullptr || every_thread.load(std::memory_order_relaxed) != nullptr);
}

c10::DataPtr route_allocate(size_t nbytes) {
  if (interpreter_gone() || in_call != 0) return c10::DataPtr();
  if (native_routes.load(std::memory_order_acquire) == 0) {  // Python is called: the GIL first
    PyGILState_STATE gil = PyGILState_Ensure();
    Route* route = acquire_current(true);
    if (route == nullptr) {
      PyGILState_Release(gil);
      return c10::DataPtr();
    }
    return allocate_holding(route, nbytes, gil);
  }
  Route* route = acquire_current(false);  // a reference: the block's if one is made
  if (route == nullptr) return c10::DataPtr();
  const c10::Device cpu(c10::DeviceType::CPU);
  if (Serving* serving = route->serving.load(std::memory_order_acquire)) {
    void* data = serving_take(serving, nbytes, route->alignment);
    if (data != nullptr) {
      native_blocks.fetch_add(1, std::memory_order_relaxed);
      count_in(route, data, nbytes);
      return c10::DataPtr(data, data, &free_native, cpu);
    }
  }
  if (NativePool* pool = route->pool.load(std::memory_order_acquire)) {
    void* data = native_pool_take(pool, nbytes, route->alignment, route);
    if (data != nullptr) {
      native_blocks.fetch_add(1, std::memory_order_relaxed);
      count_in(route, data, nbytes);
      return c10::DataPtr(data, data, &free_native, cpu);
    }
  }
  return allocate_holding(route, nbytes, PyGILState_Ensure());
}

void free_native(void* data) {
  // Never found only after shutdown() cleared what it could; leaked rather than handed to an
  // allocator that did not make it.
  free_natively(data);
}

bool route_free(void* data) {
  Block block;
  {
    std::lock_guard<std::mutex> guard(table_lock);
    auto found = table.find(data);
    if (found == table.end()) {
      block.route = nullptr;
    } else {
      block = found->second;
      table.erase(found);
    }
  }
  // (not a Python resource's: a recorded or raw-allocated block served natively, or none)
  if (block.route == nullptr) return free_natively(data);
  if (interpreter_gone()) return true;  // leaked: the resource's interpreter is going
  PyGILState_STATE gil = PyGILState_Ensure();
  if (in_call != 0) {
    block.route->deferred++;
    pending.push_back(Pending{block.route, data, block.nbytes});
  } else {
    PyObject *saved_type, *saved_value, *saved_trace;
    PyErr_Fetch(&saved_type, &saved_value, &saved_trace);
    give_back(block.route, data, block.nbytes);
    PyErr_Restore(saved_type, saved_value, saved_trace);
  }
  PyGILState_Release(gil);
  return true;
}

void routes_before_fork() {
  current_lock.lock();
  table_lock.lock();
}
void routes_after_fork() {
  table_lock.unlock();
  current_lock.unlock();
}

}  // namespace tensorarena_shim
