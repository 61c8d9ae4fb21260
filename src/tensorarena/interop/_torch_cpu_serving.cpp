// Serving a learned plan's slots with no Python call (tensorarena.learned.native_serving).
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
// Everything here runs under the GIL: the route's allocate and free take it, and so does every
// call from Python. Tables are counted: the server holds one reference while the table is
// registered, each live block one, so a block of a replaced table is freed into the table it
// came from. The server holds the step's log and the last step's; a block names its log by id.
#include "_torch_cpu_shim.h"
#include "_torch_cpu_step_log.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tensorarena_shim {

// A live range of an arena: [lo, hi), lo its key; served: a block the server gave (the
// rest of the fields then describe it), else one the Python side took.
struct LiveRange {
  uint64_t hi;
  bool served = false;
  bool booked = false;     // the Python side has a record of it
  uint64_t log = 0;  // its step's log's id (not a reference: a kept block pins no log)
  uint64_t slot = 0, nbytes = 0, number = 0;
};

struct ServingTable {
  long refs = 1;
  uint64_t id = 0;
  uintptr_t base = 0;
  std::vector<uint64_t> sizes;
  std::vector<uint64_t> offsets;      // kNoSlot: the allocation outlived its recording
  std::map<uint64_t, LiveRange> live;  // the arena's live blocks, by lo
  bool retired = false;

  bool is_free(uint64_t lo, uint64_t hi) const {
    hi = std::max(hi, lo + 1);
    auto after = live.lower_bound(hi);  // the first range starting at or after hi
    if (after == live.begin()) return true;
    --after;
    return after->second.hi <= lo;
  }
};

struct Serving {
  long refs = 1;  // the capsule's; the route holds one more
  PyObject* sync = nullptr;
  std::unordered_map<uint64_t, ServingTable*> tables;
  ServingTable* armed = nullptr;
  uint64_t position = 0;
  bool closed = false;
  uint64_t served = 0, freed = 0;  // here, ever
  // The step in progress's log and the one before (counted; nullptr: none yet).
  StepLog* log = nullptr;
  StepLog* previous = nullptr;
  // While valid (left by the Python side, not paused since): served here, the table and slot
  // of the last of them, live bytes and blocks (change, and highest change), bytes served.
  bool valid = false;
  uint64_t made = 0, made_table = 0, made_slot = 0;
  int64_t live = 0, live_peak = 0, count = 0, count_peak = 0;
  uint64_t total = 0;
  // Since the last pause: booked blocks freed while valid (address), carried frees (number)
  // and the cut after the last of them (the step's length then), and booked blocks freed while
  // not valid (address), for the Python side to book.
  std::vector<uint64_t> dropped, carried, raw;
  // Blocks served since the last pause (table, offset; those still live are unbooked).
  std::vector<std::pair<ServingTable*, uint64_t>> fresh;
  uint64_t cut = 0;
  bool cut_set = false;
};

namespace {

constexpr const char* kServingCapsule = "tensorarena.torch_cpu_serving";
constexpr uint64_t kNoSlot = ~uint64_t{0};

void unref_table(ServingTable* table) {
  if (--table->refs == 0) delete table;
}

Serving* serving_of(PyObject* capsule) {
  return static_cast<Serving*>(PyCapsule_GetPointer(capsule, kServingCapsule));
}

void drop_serving_capsule(PyObject* capsule) {
  Serving* serving = serving_of(capsule);
  if (serving != nullptr) serving_release(serving);
  else PyErr_Clear();
}

ServingTable* table_of(Serving* serving, PyObject* id_object) {
  unsigned long long id = PyLong_AsUnsignedLongLong(id_object);
  if (id == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return nullptr;
  auto found = serving->tables.find(id);
  if (found == serving->tables.end()) {
    PyErr_Format(PyExc_KeyError, "no serving table %llu", id);
    return nullptr;
  }
  return found->second;
}

bool unsigned_args(PyObject* const* args, Py_ssize_t from, Py_ssize_t nargs, uint64_t* out) {
  for (Py_ssize_t i = from; i < nargs; ++i) {
    out[i - from] = PyLong_AsUnsignedLongLong(args[i]);
    if (out[i - from] == static_cast<uint64_t>(-1) && PyErr_Occurred()) return false;
  }
  return true;
}

// The server and table of (capsule, id, ...) calls with nargs arguments.
bool parse(PyObject* const* args, Py_ssize_t nargs, Py_ssize_t want, Serving** serving,
           ServingTable** table) {
  if (nargs != want) {
    PyErr_Format(PyExc_TypeError, "takes %zd arguments, got %zd", want, nargs);
    return false;
  }
  *serving = serving_of(args[0]);
  if (*serving == nullptr) return false;
  if (table != nullptr) {
    *table = table_of(*serving, args[1]);
    if (*table == nullptr) return false;
  }
  return true;
}

}  // namespace

void serving_hold(Serving* serving) { serving->refs++; }

void serving_release(Serving* serving) {  // under the GIL
  if (--serving->refs != 0) return;
  for (auto& entry : serving->tables) unref_table(entry.second);
  step_log_release(serving->log);
  step_log_release(serving->previous);
  Py_XDECREF(serving->sync);
  delete serving;
}

void* serving_take(Serving* serving, size_t nbytes, uint64_t alignment, ServingTable** out) {
  ServingTable* table = serving->armed;
  if (table == nullptr || serving->closed) return nullptr;
  uint64_t position = serving->position;
  if (position >= table->sizes.size() || table->sizes[position] != nbytes) return nullptr;
  uint64_t offset = table->offsets[position];
  if (offset == kNoSlot || table->base == 0) return nullptr;
  uintptr_t address = table->base + static_cast<uintptr_t>(offset);
  if (address % alignment != 0 || !table->is_free(offset, offset + nbytes)) return nullptr;
  StepLog* log = serving->log;
  // (armed implies valid and a log: a pause clears both, and a log ends under the Python side)
  if (!serving->valid || log == nullptr || log->ended) return nullptr;
  LiveRange range{offset + std::max<uint64_t>(nbytes, 1), true, false, log->id, position, nbytes,
                  log->sizes.size()};
  table->live.emplace(offset, range);  // (free: no range starts there)
  log->allocated(nbytes, alignment);
  serving->fresh.emplace_back(table, offset);
  table->refs++;
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
  *out = table;
  return reinterpret_cast<void*>(address);
}

void serving_untake(Serving* serving, ServingTable* table, void* data) {
  auto found = table->live.find(reinterpret_cast<uintptr_t>(data) - table->base);
  uint64_t nbytes = found->second.nbytes;
  table->live.erase(found);
  serving->fresh.pop_back();
  serving->log->unallocate();  // (the log serving_take just logged into)
  serving->position--;
  serving->served--;
  serving->made--;
  serving->made_slot--;  // (made_table stays: a pause's allocations all come from one table)
  serving->total -= nbytes;
  serving->live -= static_cast<int64_t>(nbytes);
  serving->count--;
  unref_table(table);
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

bool serving_free(Serving* serving, ServingTable* table, void* data) {
  uintptr_t address = reinterpret_cast<uintptr_t>(data);
  serving->freed++;
  auto found = table->live.find(address - table->base);
  if (found != table->live.end() && found->second.served) {
    LiveRange block = found->second;
    table->live.erase(found);
    log_free(serving, block);
    if (!serving->valid) {
      serving->raw.push_back(address);  // booked (every live block is at a pause)
    } else {
      if (block.booked) serving->dropped.push_back(address);
      serving->live -= static_cast<int64_t>(block.nbytes);
      serving->count--;
    }
  }
  bool tell = table->retired || serving->closed;
  unref_table(table);
  return tell;
}

PyObject* serving_sync_callable(Serving* serving) { return serving->sync; }

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
  if (!route_attach_serving(args[0], serving)) {  // sets the error; takes no reference then
    serving_release(serving);
    return nullptr;
  }
  PyObject* capsule = PyCapsule_New(serving, kServingCapsule, drop_serving_capsule);
  if (capsule == nullptr) serving_release(serving);
  return capsule;
}

// serving_table(server, id, sizes, offsets, base): register a plan's table (uint64 arrays).
PyObject* serving_table(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Serving* serving;
  if (!parse(args, nargs, 5, &serving, nullptr)) return nullptr;
  uint64_t numbers[2];
  if (!unsigned_args(args, 1, 2, numbers)) return nullptr;
  unsigned long long base = PyLong_AsUnsignedLongLong(args[4]);
  if (base == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return nullptr;
  Py_buffer sizes, offsets;
  if (PyObject_GetBuffer(args[2], &sizes, PyBUF_SIMPLE) != 0) return nullptr;
  if (PyObject_GetBuffer(args[3], &offsets, PyBUF_SIMPLE) != 0) {
    PyBuffer_Release(&sizes);
    return nullptr;
  }
  PyObject* result = nullptr;
  if (sizes.len != offsets.len || sizes.len % 8 != 0) {
    PyErr_SetString(PyExc_ValueError, "sizes and offsets must be uint64 arrays of one length");
  } else if (serving->tables.count(numbers[0]) != 0) {
    PyErr_SetString(PyExc_ValueError, "a serving table with this id exists");
  } else {
    auto* table = new ServingTable();
    size_t count = static_cast<size_t>(sizes.len / 8);
    table->id = numbers[0];
    table->base = static_cast<uintptr_t>(base);
    table->sizes.resize(count);
    table->offsets.resize(count);
    std::memcpy(table->sizes.data(), sizes.buf, count * 8);
    std::memcpy(table->offsets.data(), offsets.buf, count * 8);
    serving->tables[table->id] = table;
    Py_INCREF(Py_None);
    result = Py_None;
  }
  PyBuffer_Release(&sizes);
  PyBuffer_Release(&offsets);
  return result;
}

// serving_retire(server, id): never serve from the table again; frees of its blocks are booked
// at once. serving_drop(server, id): forget it (its blocks, if any, keep it until they die).
PyObject* serving_retire(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Serving* serving;
  ServingTable* table;
  if (!parse(args, nargs, 2, &serving, &table)) return nullptr;
  table->retired = true;
  if (serving->armed == table) serving->armed = nullptr;
  Py_RETURN_NONE;
}

PyObject* serving_drop(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Serving* serving;
  ServingTable* table;
  if (!parse(args, nargs, 2, &serving, &table)) return nullptr;
  table->retired = true;
  if (serving->armed == table) serving->armed = nullptr;
  serving->tables.erase(table->id);
  unref_table(table);
  Py_RETURN_NONE;
}

// serving_log(server, log): the step that begins logs into log (a step_log_new capsule); the
// one before it becomes the last step (whose blocks' frees carry, if it ended learned from).
PyObject* serving_log(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Serving* serving;
  if (!parse(args, nargs, 2, &serving, nullptr)) return nullptr;
  StepLog* log = step_log_of(args[1]);
  if (log == nullptr) return nullptr;
  if (log == serving->log) Py_RETURN_NONE;
  step_log_hold(log);
  step_log_release(serving->previous);
  serving->previous = serving->log;
  serving->log = log;
  Py_RETURN_NONE;
}

// serving_leave(server, id, position) -> bool: the Python side leaves; serve table id (0: none)
// from position on until the next pause. False (nothing changed) while frees it has not booked
// are logged: book them, then leave.
PyObject* serving_leave(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Serving* serving;
  if (!parse(args, nargs, 3, &serving, nullptr)) return nullptr;
  uint64_t values[2];
  if (!unsigned_args(args, 1, 3, values)) return nullptr;
  ServingTable* table = nullptr;
  if (values[0] != 0) {
    table = table_of(serving, args[1]);
    if (table == nullptr) return nullptr;
    if (table->retired || serving->closed) {
      PyErr_SetString(PyExc_ValueError, "cannot arm a retired table or a closed server");
      return nullptr;
    }
  }
  if (!serving->raw.empty()) Py_RETURN_FALSE;
  serving->armed = serving->log != nullptr && !serving->log->ended ? table : nullptr;
  serving->position = values[1];
  serving->valid = true;
  Py_RETURN_TRUE;
}

PyObject* list_of(const std::vector<uint64_t>& words) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(words.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < words.size(); ++i) {
    PyObject* item = PyLong_FromUnsignedLongLong(words[i]);
    if (item == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), item);
  }
  return list;
}

// serving_pause(server) -> None if there is nothing to book, else (served, table and slot of
// the last served, dropped, carried, cut or -1, live change, highest, blocks change, highest,
// bytes served, unbooked, raw): what happened since the last pause that the Python side books
// (what it logged is in the step's log already); unbooked: the live blocks with no Python
// record (address, table, slot, nbytes, number; booked from now on). Stops serving until the
// next leave. On an error (no memory), nothing changed.
PyObject* serving_pause(PyObject*, PyObject* capsule) {
  Serving* serving = serving_of(capsule);
  if (serving == nullptr) return nullptr;
  serving->armed = nullptr;
  serving->valid = false;
  std::vector<uint64_t> unbooked;
  std::vector<LiveRange*> listed;
  for (const auto& [table, offset] : serving->fresh) {
    auto found = table->live.find(offset);
    if (found == table->live.end() || !found->second.served || found->second.booked) continue;
    LiveRange& block = found->second;
    block.booked = true;  // (a range twice in fresh: listed once)
    listed.push_back(&block);
    unbooked.insert(unbooked.end(), {static_cast<uint64_t>(table->base + offset), table->id,
                                     block.slot, block.nbytes, block.number});
  }
  if (serving->made == 0 && serving->dropped.empty() && serving->carried.empty() &&
      serving->raw.empty() && serving->live == 0 && serving->count == 0 && unbooked.empty()) {
    serving->fresh.clear();
    Py_RETURN_NONE;
  }
  PyObject* lists[4] = {list_of(serving->dropped), list_of(serving->carried), list_of(unbooked),
                        list_of(serving->raw)};
  PyObject* result = nullptr;
  if (lists[0] != nullptr && lists[1] != nullptr && lists[2] != nullptr && lists[3] != nullptr) {
    result = Py_BuildValue(
        "(KKKOOLLLLLKOO)", static_cast<unsigned long long>(serving->made),
        static_cast<unsigned long long>(serving->made_table),
        static_cast<unsigned long long>(serving->made_slot), lists[0], lists[1],
        serving->cut_set ? static_cast<long long>(serving->cut) : -1LL,
        static_cast<long long>(serving->live), static_cast<long long>(serving->live_peak),
        static_cast<long long>(serving->count), static_cast<long long>(serving->count_peak),
        static_cast<unsigned long long>(serving->total), lists[2], lists[3]);
  }
  for (PyObject* list : lists) Py_XDECREF(list);  // ("O" took its own references)
  if (result == nullptr) {  // nothing changed: the blocks listed are unbooked again
    for (LiveRange* block : listed) block->booked = false;
    return nullptr;
  }
  serving->fresh.clear();
  serving->made = 0;
  serving->dropped.clear();
  serving->carried.clear();
  serving->raw.clear();
  serving->cut_set = false;
  serving->live = serving->live_peak = serving->count = serving->count_peak = 0;
  serving->total = 0;
  return result;
}

// serving_close(server): serve nothing more; frees of blocks served here are booked at once.
PyObject* serving_close(PyObject*, PyObject* capsule) {
  Serving* serving = serving_of(capsule);
  if (serving == nullptr) return nullptr;
  serving->closed = true;
  serving->armed = nullptr;
  Py_RETURN_NONE;
}

// serving_counts(server) -> (served here, freed here), ever.
PyObject* serving_counts(PyObject*, PyObject* capsule) {
  Serving* serving = serving_of(capsule);
  if (serving == nullptr) return nullptr;
  return Py_BuildValue("(KK)", static_cast<unsigned long long>(serving->served),
                       static_cast<unsigned long long>(serving->freed));
}

// The arena's live ranges, for the Python side's Occupancy while a server exists.
PyObject* occupancy_is_free(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Serving* serving;
  ServingTable* table;
  if (!parse(args, nargs, 4, &serving, &table)) return nullptr;
  uint64_t range[2];
  if (!unsigned_args(args, 2, 4, range)) return nullptr;
  return PyBool_FromLong(table->is_free(range[0], range[1]));
}

PyObject* occupancy_take(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Serving* serving;
  ServingTable* table;
  if (!parse(args, nargs, 4, &serving, &table)) return nullptr;
  uint64_t range[2];
  if (!unsigned_args(args, 2, 4, range)) return nullptr;
  if (!table->is_free(range[0], range[1])) {
    PyErr_SetString(PyExc_ValueError, "the range overlaps a live block");
    return nullptr;
  }
  table->live.emplace(range[0], LiveRange{std::max(range[1], range[0] + 1)});
  Py_RETURN_NONE;
}

PyObject* occupancy_release(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Serving* serving;
  ServingTable* table;
  if (!parse(args, nargs, 3, &serving, &table)) return nullptr;
  uint64_t lo;
  if (!unsigned_args(args, 2, 3, &lo)) return nullptr;
  table->live.erase(lo);
  Py_RETURN_NONE;
}

PyObject* occupancy_ranges(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Serving* serving;
  ServingTable* table;
  if (!parse(args, nargs, 2, &serving, &table)) return nullptr;
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  for (const auto& range : table->live) {
    PyObject* item = Py_BuildValue("(KK)", static_cast<unsigned long long>(range.first),
                                   static_cast<unsigned long long>(range.second.hi));
    if (item == nullptr || PyList_Append(out, item) != 0) {
      Py_XDECREF(item);
      Py_DECREF(out);
      return nullptr;
    }
    Py_DECREF(item);
  }
  return out;
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
