// Serving a learned plan's slots with no Python call (tensorarena.learned.native_serving): the
// route's side, and the calls that set the server up (the rest: _torch_cpu_serving_calls.cpp).
//
// A route whose resource is a LearnedPlans can carry a *server*: the tables of the plans that
// serve (per step position: size and offset in the plan's arena) and the live byte ranges of
// each arena. While the Python side has *armed* it (a step repeats a plan, at position p), an
// allocation of exactly sizes[p] bytes whose slot has an offset, an aligned address and bytes
// that overlap no live range of the arena is handed out here: no Python call, p advances. The
// free of a block served here releases its range here. Anything else (a size that differs, an
// occupied slot, the end of the table, no arming) is the route's Python call as before, and
// the Python side *pauses* the server whenever it runs (serving_pause, from its lock), so the
// two never hand out the same slot: the arena's live ranges (taken by either side; the Python
// side's Occupancy calls occupancy_* while a server exists) are the one truth that the
// never-alias rule is checked against, as LearnedPlans checks it.
//
// The step's log is shared: the Python side's recorder is a StepLog here
// (_torch_cpu_step_log.h, tensorarena.learned.native_recorder), told to the server as each step
// begins (serving_log), so the server logs each allocation it serves and each free of its
// blocks where it happens, as the recorder would (a free of the last step's block, once that
// step ended and was learned from, is *carried* into the step in progress). What else happened
// here is booked by the Python side the next time it runs (serving_pause returns a digest:
// counts, the live bytes' change and peak, the carried frees, the blocks it must know of), so
// its counts and report stay what they would have been; only the server's blocks still live
// at a pause get a Python record. A free that comes while the Python side runs (a collection,
// another thread) is logged as any other and only its bookkeeping is left to the Python side
// (raw). A free of a block whose table was retired (the plan was replaced or the plans closed)
// asks the Python side to book it at once (the sync callable): an arena goes back with its
// last block.
// Everything here changes under native_lock (_torch_cpu_serving.h), not the GIL: the route takes
// and frees served blocks with no GIL (a free finds its table by address among the live tables'
// arenas, a few, then in the table's own live ranges: no per-block table elsewhere), and every
// call from Python takes the lock for what it reads or changes. Tables are counted: the server
// holds one reference while the table is registered, each live block one, so a block of a
// replaced table is freed into the table it came from. The server holds the step's log and the
// last step's; a block names its log by id.
#include "_torch_cpu_serving.h"

#include <cstring>
#include <mutex>

namespace tensorarena_shim {

std::mutex native_lock;

namespace {

constexpr const char* kServingCapsule = "tensorarena.torch_cpu_serving";

constexpr size_t kSpareNodes = 4096;  // a table's freed nodes kept for reuse, at most

// Every live table (registered or kept by a live block), for a free to find its block's arena.
std::vector<ServingTable*> arenas;

void drop_serving_capsule(PyObject* capsule) {
  Serving* serving = serving_of(capsule);
  if (serving != nullptr) serving_release(serving);
  else PyErr_Clear();
}

}  // namespace

void ref_table(ServingTable* table) { table->refs++; }

void unref_table(ServingTable* table) {
  if (--table->refs != 0) return;
  arenas.erase(std::find(arenas.begin(), arenas.end(), table));
  delete table;
}

void add_table(Serving* serving, ServingTable* table) {
  table->serving = serving;
  for (size_t i = 0; i < table->sizes.size(); ++i) {
    if (table->offsets[i] == kNoSlot) continue;
    uint64_t end = table->offsets[i] + std::max<uint64_t>(table->sizes[i], 1);
    table->extent = std::max(table->extent, end);
  }
  serving->tables[table->id] = table;
  arenas.push_back(table);
}

Serving* serving_of(PyObject* capsule) {
  return static_cast<Serving*>(PyCapsule_GetPointer(capsule, kServingCapsule));
}

bool serving_args(PyObject* const* args, Py_ssize_t nargs, Py_ssize_t want, Serving** serving,
                  uint64_t* words) {
  if (nargs != want) {
    PyErr_Format(PyExc_TypeError, "takes %zd arguments, got %zd", want, nargs);
    return false;
  }
  *serving = serving_of(args[0]);
  if (*serving == nullptr) return false;
  for (Py_ssize_t i = 1; words != nullptr && i < nargs; ++i) {
    words[i - 1] = PyLong_AsUnsignedLongLong(args[i]);
    if (words[i - 1] == static_cast<uint64_t>(-1) && PyErr_Occurred()) return false;
  }
  return true;
}

ServingTable* find_table(Serving* serving, uint64_t id) {
  auto found = serving->tables.find(id);
  return found == serving->tables.end() ? nullptr : found->second;
}

PyObject* no_table(uint64_t id) {
  PyErr_Format(PyExc_KeyError, "no serving table %llu", static_cast<unsigned long long>(id));
  return nullptr;
}

void serving_hold(Serving* serving) { serving->refs++; }

void serving_release(Serving* serving) {  // under the GIL
  if (--serving->refs != 0) return;
  {
    std::lock_guard<std::mutex> guard(native_lock);
    for (auto& entry : serving->tables) unref_table(entry.second);
    step_log_release(serving->log);
    step_log_release(serving->previous);
  }
  Py_XDECREF(serving->sync);
  delete serving;
}

void* serving_take(Serving* serving, size_t nbytes, uint64_t alignment) {
  std::lock_guard<std::mutex> guard(native_lock);
  ServingTable* table = serving->armed;
  if (table == nullptr || serving->closed) return nullptr;
  uint64_t position = serving->position;
  if (position >= table->sizes.size() || table->sizes[position] != nbytes) return nullptr;
  uint64_t offset = table->offsets[position];
  if (offset == kNoSlot || table->base == 0) return nullptr;
  uintptr_t address = table->base + static_cast<uintptr_t>(offset);
  std::map<uint64_t, LiveRange>::const_iterator after;
  if (address % alignment != 0 || !table->free_at(offset, offset + nbytes, &after)) return nullptr;
  StepLog* log = serving->log;
  // (armed implies valid and a log: a pause clears both, and a log ends under the Python side)
  if (!serving->valid || log == nullptr || log->ended) return nullptr;
  LiveRange range{offset + std::max<uint64_t>(nbytes, 1), true, false, log->id, position, nbytes,
                  log->sizes.size()};
  // (free: no range starts there; it goes right before after, one search in all)
  if (table->spare.empty()) {
    table->live.emplace_hint(after, offset, range);
  } else {
    auto node = std::move(table->spare.back());
    table->spare.pop_back();
    node.key() = offset;
    node.mapped() = range;
    table->live.insert(after, std::move(node));
  }
  log->allocated(nbytes, alignment);
  serving->fresh.emplace_back(table, offset);
  ref_table(table);
  serving->position = position + 1;
  serving->served++;
  serving->made++;
  serving->made_table = table->id;
  serving->made_slot = position;
  serving->total += nbytes;
  serving->live += static_cast<int64_t>(nbytes);
  serving->live_peak = std::max(serving->live_peak, serving->live);
  serving->count++;
  serving->count_peak = std::max(serving->count_peak, serving->count);
  return reinterpret_cast<void*>(address);
}

namespace {

// Log the free of a block of the server's, as the Python side's recorder would: in its own
// step's log while that step runs (not once it ended: a free while the marker is at work is
// after the step, which outlived it), or carried into the step in progress if it is the last
// step's and that one was learned from.
void log_free(Serving* serving, const LiveRange& block) {
  StepLog* now = serving->log;
  if (now == nullptr) return;
  StepLog* previous = serving->previous;
  if (block.log == now->id) {
    if (!now->ended) now->freed(block.number);
  } else if (!now->ended && previous != nullptr && block.log == previous->id &&
             previous->learned) {
    serving->carried.push_back(block.number);
    serving->cut = now->sizes.size();
    serving->cut_set = true;
  }
}

}  // namespace

bool serving_give(void* data, ServedFree* out) {
  uintptr_t address = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> guard(native_lock);
  for (ServingTable* table : arenas) {  // (a few: the plans' tables, and retired ones kept)
    if (address < table->base || address - table->base >= table->extent) continue;
    auto found = table->live.find(address - table->base);
    if (found == table->live.end() || !found->second.served) continue;
    Serving* serving = table->serving;
    LiveRange block = found->second;
    auto node = table->live.extract(found);
    if (table->spare.size() < kSpareNodes) table->spare.push_back(std::move(node));
    serving->freed++;
    log_free(serving, block);
    if (!serving->valid) {
      serving->raw.push_back(address);  // booked (every live block is at a pause)
    } else {
      if (block.booked) serving->dropped.push_back(address);
      serving->live -= static_cast<int64_t>(block.nbytes);
      serving->count--;
    }
    out->route = serving->route;
    out->nbytes = static_cast<size_t>(block.nbytes);
    out->sync = table->retired || serving->closed ? serving->sync : nullptr;
    unref_table(table);
    return true;
  }
  return false;
}

void servings_before_fork() { native_lock.lock(); }
void servings_after_fork() { native_lock.unlock(); }

namespace {

// serving_attach(route capsule, sync) -> server capsule (the route serves from it from now on)
PyObject* serving_attach(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyCallable_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "serving_attach takes a route and a callable");
    return nullptr;
  }
  auto* serving = new Serving();
  Py_INCREF(args[1]);
  serving->sync = args[1];
  Route* route = route_attach_serving(args[0], serving);
  if (route == nullptr) {  // sets the error; takes no reference then
    serving_release(serving);
    return nullptr;
  }
  serving->route = route;  // (before any table: nothing is served before one is armed)
  PyObject* capsule = PyCapsule_New(serving, kServingCapsule, drop_serving_capsule);
  if (capsule == nullptr) serving_release(serving);
  return capsule;
}

// serving_table(server, id, sizes, offsets, base): register a plan's table (uint64 arrays).
PyObject* serving_table(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Serving* serving;
  uint64_t id;
  if (nargs != 5) {
    PyErr_Format(PyExc_TypeError, "takes 5 arguments, got %zd", nargs);
    return nullptr;
  }
  if (!serving_args(args, 2, 2, &serving, &id)) return nullptr;
  unsigned long long base = PyLong_AsUnsignedLongLong(args[4]);
  if (base == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return nullptr;
  Py_buffer sizes, offsets;
  if (PyObject_GetBuffer(args[2], &sizes, PyBUF_SIMPLE) != 0) return nullptr;
  if (PyObject_GetBuffer(args[3], &offsets, PyBUF_SIMPLE) != 0) {
    PyBuffer_Release(&sizes);
    return nullptr;
  }
  const char* refusal = nullptr;
  if (sizes.len != offsets.len || sizes.len % 8 != 0) {
    refusal = "sizes and offsets must be uint64 arrays of one length";
  } else {
    auto* table = new ServingTable();
    size_t count = static_cast<size_t>(sizes.len / 8);
    table->id = id;
    table->base = static_cast<uintptr_t>(base);
    table->sizes.resize(count);
    table->offsets.resize(count);
    std::memcpy(table->sizes.data(), sizes.buf, count * 8);
    std::memcpy(table->offsets.data(), offsets.buf, count * 8);
    std::lock_guard<std::mutex> guard(native_lock);
    if (serving->tables.count(id) != 0) {
      refusal = "a serving table with this id exists";
      delete table;
    } else {
      add_table(serving, table);
    }
  }
  PyBuffer_Release(&sizes);
  PyBuffer_Release(&offsets);
  if (refusal != nullptr) {
    PyErr_SetString(PyExc_ValueError, refusal);
    return nullptr;
  }
  Py_RETURN_NONE;
}

// serving_retire(server, id): never serve from the table again; frees of its blocks are booked
// at once. serving_drop(server, id): forget it (its blocks, if any, keep it until they die).
PyObject* retire_or_drop(PyObject* const* args, Py_ssize_t nargs, bool drop) {
  Serving* serving;
  uint64_t id;
  if (!serving_args(args, nargs, 2, &serving, &id)) return nullptr;
  bool found;
  {
    std::lock_guard<std::mutex> guard(native_lock);
    ServingTable* table = find_table(serving, id);
    found = table != nullptr;
    if (found) {
      table->retired = true;
      if (serving->armed == table) serving->armed = nullptr;
      if (drop) {
        serving->tables.erase(table->id);
        unref_table(table);
      }
    }
  }
  if (!found) return no_table(id);
  Py_RETURN_NONE;
}

PyObject* serving_retire(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return retire_or_drop(args, nargs, false);
}

PyObject* serving_drop(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return retire_or_drop(args, nargs, true);
}

// serving_log(server, log): the step that begins logs into log (a step_log_new capsule); the
// one before it becomes the last step (whose blocks' frees carry, if it ended learned from).
PyObject* serving_log(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Serving* serving;
  if (nargs != 2) {
    PyErr_Format(PyExc_TypeError, "takes 2 arguments, got %zd", nargs);
    return nullptr;
  }
  if (!serving_args(args, 1, 1, &serving, nullptr)) return nullptr;
  StepLog* log = step_log_of(args[1]);
  if (log == nullptr) return nullptr;
  StepLog* gone = nullptr;
  {
    std::lock_guard<std::mutex> guard(native_lock);
    if (log != serving->log) {
      // Room for as many allocations as the last step's (a step repeats): each one logged is
      // then a plain store, with no regrowth (and its copies and page faults) mid-step.
      if (serving->log != nullptr) log->reserve(serving->log->sizes.size() + 64);
      step_log_hold(log);
      gone = serving->previous;
      serving->previous = serving->log;
      serving->log = log;
    }
  }
  step_log_release(gone);
  Py_RETURN_NONE;
}

// serving_leave(server, id, position) -> bool: the Python side leaves; serve table id (0: none)
// from position on until the next pause. False (nothing changed) while frees it has not booked
// are logged: book them, then leave.
PyObject* serving_leave(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Serving* serving;
  uint64_t values[2];
  if (!serving_args(args, nargs, 3, &serving, values)) return nullptr;
  int outcome;  // 1 left, 0 frees to book first, -1 no table, -2 retired or closed
  {
    std::lock_guard<std::mutex> guard(native_lock);
    ServingTable* table = values[0] != 0 ? find_table(serving, values[0]) : nullptr;
    if (values[0] != 0 && table == nullptr) {
      outcome = -1;
    } else if (table != nullptr && (table->retired || serving->closed)) {
      outcome = -2;
    } else if (!serving->raw.empty()) {
      outcome = 0;
    } else {
      serving->armed = serving->log != nullptr && !serving->log->ended ? table : nullptr;
      serving->position = values[1];
      serving->valid = true;
      outcome = 1;
    }
  }
  if (outcome == -1) return no_table(values[0]);
  if (outcome == -2) {
    PyErr_SetString(PyExc_ValueError, "cannot arm a retired table or a closed server");
    return nullptr;
  }
  return PyBool_FromLong(outcome);
}

PyCFunction fast(PyObject* (*function)(PyObject*, PyObject* const*, Py_ssize_t)) {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(function));
}

}  // namespace

PyMethodDef serving_methods[] = {
    {"serving_attach", fast(serving_attach), METH_FASTCALL,
     "Give a route a server of learned plans; returns its capsule."},
    {"serving_table", fast(serving_table), METH_FASTCALL, "Register a plan's table."},
    {"serving_retire", fast(serving_retire), METH_FASTCALL, "Serve a table no more."},
    {"serving_drop", fast(serving_drop), METH_FASTCALL, "Forget a table."},
    {"serving_log", fast(serving_log), METH_FASTCALL, "The log of the step that begins."},
    {"serving_leave", fast(serving_leave), METH_FASTCALL,
     "The Python side leaves: where its step stands, and what to serve."},
    {"serving_pause", serving_pause, METH_O, "Stop serving; return what happened since."},
    {"serving_close", serving_close, METH_O, "Serve nothing more."},
    {"serving_counts", serving_counts, METH_O, "(served, freed) by the server, ever."},
    {"occupancy_is_free", fast(occupancy_is_free), METH_FASTCALL, "No live range overlaps."},
    {"occupancy_take", fast(occupancy_take), METH_FASTCALL, "Mark a range live."},
    {"occupancy_release", fast(occupancy_release), METH_FASTCALL, "Free the range at lo."},
    {"occupancy_ranges", fast(occupancy_ranges), METH_FASTCALL, "The live ranges."},
    {"step_log_new", step_log_new, METH_NOARGS, "A new, empty step log."},
    {"step_log_allocated", fast(step_log_allocated), METH_FASTCALL, "Log an allocation."},
    {"step_log_freed", fast(step_log_freed), METH_FASTCALL, "Log a free."},
    {"step_log_length", step_log_length, METH_O, "Allocations logged."},
    {"step_log_clock", step_log_clock, METH_O, "The log's clock."},
    {"step_log_end", fast(step_log_end), METH_FASTCALL, "The log's step ended."},
    {"step_log_lists", step_log_lists, METH_O, "(sizes, alignments, starts, ends) lists."},
    {"step_log_key", fast(step_log_key), METH_FASTCALL, "The first sizes, a tuple."},
    {"step_log_matches", fast(step_log_matches), METH_FASTCALL, "Has this signature."},
    {"step_log_same", fast(step_log_same), METH_FASTCALL, "Two logs have one signature."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace tensorarena_shim
