// Torch's CPU allocator shim (tensorarena.interop.torch_cpu_shim): an at::Allocator installed as
// torch's CPU allocator, which serves two users.
//
// * Routes (_torch_cpu_routes.cpp, tensorarena.torch.use): while a route is set, allocations go
//   to a Python memory resource instead of the allocator the shim replaced.
// * Kernel scripts (tensorarena.runtime.kernel_arena): kernels' own CPU allocations served from
//   a planned arena, installed for the duration of a planned call. Every allocation is
//   forwarded (to the route serving the thread if one does, else to the allocator the shim
//   replaced), except on a thread that has *armed* the shim for one node of the program:
//
//  * record mode (the first call of a shape): every allocation of the armed thread is
//    forwarded and logged with its size, and its DataPtr wrapped so the log learns when it is
//    freed; disarming returns (nbytes, freed before the node ended) per allocation, in order;
//  * serve mode (steady state): the node's script is a bytearray of (nbytes, offset) pairs,
//    the allocations the node made when recorded, in order, offsets from the arena's address
//    given to arm. An allocation whose size is the next one expected gets its planned address
//    (offset 2**64 - 1: forwarded, as recorded: it outlived its node); the first
//    one that differs ends serving for the rest of the node (everything forwards). Each entry
//    is handed out at most once per arming, and only while its node runs, so a served block
//    can alias nothing: the planner gave it bytes no other buffer uses during the node.
//
// Served blocks are freed by a deleter that only takes them off the outstanding ones; one still
// outstanding at disarm (a kernel kept it past its node: never seen when recorded) is counted
// in the script's header as escaped, and the Python side stops arming that node.
// The state is thread_local: other threads (intra-op workers included) always forward.
// install/uninstall are counted: the previous allocator is restored when the last call ends.
// Blocks keep &free_block as their deleter after that: it finds by address who made each one.
#include "_torch_cpu_shim.h"

#include <c10/core/CPUAllocator.h>
#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace tensorarena_shim {

c10::Allocator* previous = nullptr;

namespace {

// Script header: served, forwarded, escaped counters (uint64 each), then the pair count.
constexpr size_t kHeader = 4;

// One node's allocations as recorded: size, and the times (a clock ticking at every allocation
// and free of the node's recorded blocks) it was made and freed; kNotFreed while it is live.
constexpr uint64_t kNotFreed = ~uint64_t{0};

struct RecordLog {
  std::mutex lock;
  uint64_t clock = 0;
  std::vector<size_t> sizes;
  std::vector<uint64_t> born;
  std::vector<uint64_t> died;
  std::vector<uintptr_t> addresses;

  void free(size_t index) {
    std::lock_guard<std::mutex> guard(lock);
    died[index] = clock++;
  }
};

struct Tracked {
  c10::DataPtr inner;
  std::shared_ptr<RecordLog> log;
  size_t index;
};

struct ThreadState {
  bool armed = false;
  bool record = false;
  // serve mode
  const uint64_t* pairs = nullptr;
  uintptr_t base = 0;
  uint64_t count = 0;
  uint64_t pos = 0;
  bool diverged = false;
  uint64_t served = 0;
  uint64_t forwarded = 0;
  std::vector<void*> handed;  // blocks served during this arming
  // record mode
  std::shared_ptr<RecordLog> log;
};

thread_local ThreadState state;

std::mutex outstanding_lock;
// Served blocks not yet freed, counted by address: two can share one. A block that escaped its
// node (a kernel keeps it) is still outstanding when a later node, of this call or the next, is
// served the same planned address. A set held the address once: the first of the two freed took
// it off, and the second then went to the previous allocator's raw deleter, freeing a pointer
// into the arena (at offset 0, the arena's own block: a double free when the arena went).
std::unordered_map<void*, size_t> outstanding;
// recorded blocks not yet freed that free_block frees: their log and place in it
std::unordered_map<void*, std::pair<std::shared_ptr<RecordLog>, size_t>> recording;

std::mutex install_lock;
long installs = 0;
std::atomic<uint64_t> escapes{0};  // served blocks found outstanding at disarm, ever

constexpr uint64_t kForward = ~uint64_t{0};

// The deleter of blocks the previous allocator made simply (context == data, its raw deleter):
// recorded ones are marked freed in their log. Wrapped in a Tracked otherwise.
void free_tracked(void* context) {
  auto* tracked = static_cast<Tracked*>(context);
  tracked->log->free(tracked->index);
  delete tracked;  // frees the inner block through its own deleter
}

// Where an unarmed allocation goes: the route serving this thread, else the previous allocator.
c10::DataPtr forward(size_t nbytes) {
  if (nbytes != 0 && routing()) {
    c10::DataPtr routed = route_allocate(nbytes);
    if (routed) return routed;
  }
  return previous->allocate(nbytes);
}

void lock_before_fork() {
  outstanding_lock.lock();
  routes_before_fork();
  servings_before_fork();
  native_pools_before_fork();
}

void unlock_after_fork() {
  native_pools_after_fork();
  servings_after_fork();
  routes_after_fork();
  outstanding_lock.unlock();
}

}  // namespace

// The deleter of served, simply recorded and routed blocks, and the raw deleter: a served block
// goes back to the arena (nothing to do); a recorded one is marked freed; a routed one goes back
// to its route; any other then goes to the previous allocator's raw deleter.
void free_block(void* pointer) {
  std::shared_ptr<RecordLog> log;
  size_t index = 0;
  {
    std::lock_guard<std::mutex> guard(outstanding_lock);
    auto found = outstanding.find(pointer);
    if (found != outstanding.end()) {
      if (--found->second == 0) outstanding.erase(found);
      return;
    }
    auto entry = recording.find(pointer);
    if (entry != recording.end()) {
      log = std::move(entry->second.first);
      index = entry->second.second;
      recording.erase(entry);
    }
  }
  if (log) log->free(index);
  if (route_free(pointer)) return;
  c10::DeleterFnPtr raw = previous != nullptr ? previous->raw_deleter() : nullptr;
  if (raw != nullptr) raw(pointer);
}

namespace {

struct KernelArenaAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    ThreadState& s = state;
    if (!s.armed || nbytes == 0) return forward(nbytes);
    if (s.record) {
      c10::DataPtr inner = forward(nbytes);
      void* data = inner.get();
      c10::Device device = inner.device();
      size_t index;
      {
        std::lock_guard<std::mutex> guard(s.log->lock);
        index = s.log->sizes.size();
        s.log->sizes.push_back(nbytes);
        s.log->born.push_back(s.log->clock++);
        s.log->died.push_back(kNotFreed);
        s.log->addresses.push_back(reinterpret_cast<uintptr_t>(data));
      }
      c10::DeleterFnPtr raw = previous->raw_deleter();
      c10::DeleterFnPtr deleter = inner.get_deleter();
      if (inner.get_context() == data &&
          ((raw != nullptr && deleter == raw) || deleter == &free_block ||
           deleter == &free_native)) {
        // Keep context == data: raw_allocate (used by some kernels) insists on it.
        inner.release_context();
        std::lock_guard<std::mutex> guard(outstanding_lock);
        recording[data] = {s.log, index};
        return c10::DataPtr(data, data, &free_block, device);
      }
      auto* tracked = new Tracked{std::move(inner), s.log, index};
      return c10::DataPtr(data, tracked, &free_tracked, device);
    }
    if (!s.diverged && s.pos < s.count) {
      const uint64_t* entry = s.pairs + 2 * s.pos;
      if (entry[0] == nbytes) {
        s.pos++;
        if (entry[1] != kForward) {
          void* data = reinterpret_cast<void*>(s.base + static_cast<uintptr_t>(entry[1]));
          {
            std::lock_guard<std::mutex> guard(outstanding_lock);
            ++outstanding[data];
          }
          s.handed.push_back(data);
          s.served++;
          return c10::DataPtr(data, data, &free_block, c10::Device(c10::DeviceType::CPU));
        }
      } else {
        s.diverged = true;
      }
    }
    s.forwarded++;
    return forward(nbytes);
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return previous != nullptr && previous->raw_deleter() != nullptr ? &free_block : nullptr;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

KernelArenaAllocator shim;  // never destroyed before exit: storages keep a pointer to it

// install() -> escapes so far.
PyObject* install(PyObject*, PyObject*) {
  std::lock_guard<std::mutex> guard(install_lock);
  if (installs == 0) {
    c10::Allocator* current = c10::GetCPUAllocator();
    if (current != &shim) previous = current;
    c10::SetCPUAllocator(&shim, 0);
    if (c10::GetCPUAllocator() != &shim) {
      PyErr_SetString(PyExc_RuntimeError,
                      "another CPU allocator is installed with a higher priority");
      return nullptr;
    }
  }
  installs++;
  return PyLong_FromUnsignedLongLong(escapes.load());
}

// uninstall() -> escapes so far (a caller compares it with the value before its call).
PyObject* uninstall(PyObject*, PyObject*) {
  std::lock_guard<std::mutex> guard(install_lock);
  if (installs > 0 && --installs == 0 && c10::GetCPUAllocator() == &shim) {
    c10::SetCPUAllocator(previous, 0);
  }
  return PyLong_FromUnsignedLongLong(escapes.load());
}

PyObject* installed(PyObject*, PyObject*) {
  return PyBool_FromLong(c10::GetCPUAllocator() == &shim);
}

// arm(script, base): serve this thread's allocations by the script, at base + offset, until
// disarm(script).
PyObject* arm(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "arm takes a script and the arena's address");
    return nullptr;
  }
  PyObject* script = args[0];
  unsigned long long base = PyLong_AsUnsignedLongLong(args[1]);
  if (base == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return nullptr;
  if (!PyByteArray_Check(script) ||
      PyByteArray_GET_SIZE(script) < static_cast<Py_ssize_t>(kHeader * 8)) {
    PyErr_SetString(PyExc_TypeError, "arm takes a script bytearray");
    return nullptr;
  }
  ThreadState& s = state;
  if (s.armed) {
    PyErr_SetString(PyExc_RuntimeError, "already armed on this thread");
    return nullptr;
  }
  auto* words = reinterpret_cast<uint64_t*>(PyByteArray_AS_STRING(script));
  s.count = words[3];
  if (static_cast<Py_ssize_t>((kHeader + 2 * s.count) * 8) > PyByteArray_GET_SIZE(script)) {
    PyErr_SetString(PyExc_ValueError, "script shorter than its pair count");
    return nullptr;
  }
  s.pairs = words + kHeader;
  s.base = static_cast<uintptr_t>(base);
  s.pos = 0;
  s.diverged = false;
  s.served = s.forwarded = 0;
  s.handed.clear();
  s.record = false;
  s.armed = true;
  Py_RETURN_NONE;
}

PyObject* disarm(PyObject*, PyObject* script) {
  ThreadState& s = state;
  if (!s.armed || s.record) Py_RETURN_NONE;
  s.armed = false;
  uint64_t escaped = 0;
  {
    std::lock_guard<std::mutex> guard(outstanding_lock);
    // By address: an older escaped block there counts too (at worst, a node is no longer
    // armed that could have been; never one armed whose block is kept).
    for (void* data : s.handed) escaped += outstanding.count(data);
  }
  s.handed.clear();
  if (escaped != 0) escapes += escaped;
  if (PyByteArray_Check(script) &&
      PyByteArray_GET_SIZE(script) >= static_cast<Py_ssize_t>(kHeader * 8)) {
    auto* words = reinterpret_cast<uint64_t*>(PyByteArray_AS_STRING(script));
    words[0] += s.served;
    words[1] += s.forwarded;
    words[2] += escaped;
  }
  Py_RETURN_NONE;
}

PyObject* record(PyObject*, PyObject*) {
  ThreadState& s = state;
  if (s.armed) {
    PyErr_SetString(PyExc_RuntimeError, "already armed on this thread");
    return nullptr;
  }
  s.log = std::make_shared<RecordLog>();
  s.record = true;
  s.armed = true;
  Py_RETURN_NONE;
}

// recorded(log): stop recording; append (nbytes, made, freed, address) per allocation to log,
// times on the node's clock, freed None where the block is still live.
PyObject* recorded(PyObject*, PyObject* out) {
  ThreadState& s = state;
  if (!s.armed || !s.record) Py_RETURN_NONE;
  s.armed = false;
  s.record = false;
  std::shared_ptr<RecordLog> log = std::move(s.log);
  std::vector<size_t> sizes;
  std::vector<uint64_t> born, died;
  std::vector<uintptr_t> addresses;
  {
    std::lock_guard<std::mutex> guard(log->lock);
    sizes = log->sizes;
    born = log->born;
    died = log->died;
    addresses = log->addresses;
  }
  if (!PyList_Check(out)) Py_RETURN_NONE;
  for (size_t i = 0; i < sizes.size(); ++i) {
    PyObject* freed = died[i] == kNotFreed ? Py_None : PyLong_FromUnsignedLongLong(died[i]);
    if (freed == nullptr) return nullptr;
    if (freed == Py_None) Py_INCREF(freed);
    PyObject* item = Py_BuildValue("(nKNK)", static_cast<Py_ssize_t>(sizes[i]),
                                   static_cast<unsigned long long>(born[i]), freed,
                                   static_cast<unsigned long long>(addresses[i]));
    if (item == nullptr || PyList_Append(out, item) != 0) {
      Py_XDECREF(item);
      return nullptr;
    }
    Py_DECREF(item);
  }
  Py_RETURN_NONE;
}

PyObject* outstanding_blocks(PyObject*, PyObject*) {
  std::lock_guard<std::mutex> guard(outstanding_lock);
  size_t blocks = 0;
  for (const auto& entry : outstanding) blocks += entry.second;
  return PyLong_FromSize_t(blocks);
}

PyMethodDef methods[] = {
    {"install", install, METH_NOARGS, "Make the shim torch's CPU allocator (counted)."},
    {"uninstall", uninstall, METH_NOARGS,
     "Restore the previous allocator at the last call; return the escapes so far."},
    {"installed", installed, METH_NOARGS, "Whether the shim is torch's CPU allocator now."},
    {"arm", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(arm)), METH_FASTCALL,
     "Serve this thread's allocations by a script."},
    {"disarm", disarm, METH_O, "Stop serving; add the counters to the script."},
    {"record", record, METH_NOARGS, "Log this thread's allocations."},
    {"recorded", recorded, METH_O, "Stop logging; append (nbytes, freed) to a list."},
    {"outstanding", outstanding_blocks, METH_NOARGS, "Served blocks not yet freed."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "tensorarena_torch_cpu_shim", nullptr, -1, methods,
                      nullptr, nullptr, nullptr, nullptr};

}  // namespace
}  // namespace tensorarena_shim

PyMODINIT_FUNC PyInit_tensorarena_torch_cpu_shim() {
  using namespace tensorarena_shim;
  PyObject* created = PyModule_Create(&module);
  if (created == nullptr) return nullptr;
  if (PyModule_AddFunctions(created, route_methods) != 0 ||
      PyModule_AddFunctions(created, serving_methods) != 0 ||
      PyModule_AddFunctions(created, native_pool_methods) != 0) {
    Py_DECREF(created);
    return nullptr;
  }
  static std::once_flag atfork;
  std::call_once(atfork, [] { pthread_atfork(lock_before_fork, unlock_after_fork, unlock_after_fork); });
  return created;
}
