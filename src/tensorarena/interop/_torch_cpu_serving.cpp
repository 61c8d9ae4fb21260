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
// What happened here is booked by the Python side the next time it runs (serving_pause returns
// it), so that its counts, recording and report stay what they would have been. To make that
// cheap, the server keeps the step's recording itself while the Python side is away: leaving,
// the Python side tells it where the step stands (serving_leave: its serial, the recording's
// length and clock), and the server numbers and times each allocation it serves and each free
// of its blocks as the Python Recorder would (a free of the last step's block is *carried*).
// Booking is then a few list operations, and only the server's blocks still live at a pause
// get a Python record. A free that comes while the Python side runs (a collection, another
// thread) is only logged (its block has a Python record by then) and booked by the Python side
// itself. A free of a block whose table was retired (the plan was replaced or the plans closed)
// asks the Python side to book it at once (the sync callable): an arena goes back with its last
// block.
// Everything here runs under the GIL: the route's allocate and free take it, and so does every
// call from Python. Tables are counted: the server holds one reference while the table is
// registered, each live block one, so a block of a replaced table is freed into the table it
// came from.
#include "_torch_cpu_shim.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <unordered_map>
#include <vector>

namespace tensorarena_shim {

struct ServingTable {
  long refs = 1;
  uint64_t id = 0;
  uintptr_t base = 0;
  std::vector<uint64_t> sizes;
  std::vector<uint64_t> offsets;     // kNoSlot: the allocation outlived its recording
  std::map<uint64_t, uint64_t> live;  // [lo, hi) of the arena's live blocks, by lo
  bool retired = false;

  bool is_free(uint64_t lo, uint64_t hi) const {
    hi = std::max(hi, lo + 1);
    auto after = live.lower_bound(hi);  // the first range starting at or after hi
    if (after == live.begin()) return true;
    --after;
    return after->second <= lo;
  }
};

struct ServedBlock {
  ServingTable* table;
  uint64_t slot, nbytes, serial, number;
  bool booked;  // the Python side has a record of it
};

struct Serving {
  long refs = 1;  // the capsule's; the route holds one more
  PyObject* sync = nullptr;
  std::unordered_map<uint64_t, ServingTable*> tables;
  ServingTable* armed = nullptr;
  uint64_t position = 0;
  bool closed = false;
  std::unordered_map<uintptr_t, ServedBlock> blocks;  // live blocks served here
  uint64_t served = 0, freed = 0;  // here, ever
  // Where the Python side's step stands, while it is away (valid): set by serving_leave.
  bool valid = false;
  uint64_t serial = 0, length = 0, clock = 0;
  bool previous = false;  // the last step was learned from: its blocks' frees are carried
  // Since the last pause, while valid: allocations (nbytes, tick; the table and slot of the
  // last in made_table, made_slot), ends (number, tick), booked blocks freed (address), carried
  // (number) and the cut after the last of them, live bytes and blocks (change, and highest
  // change), bytes served.
  std::vector<uint64_t> made, ends, dropped, carried;
  uint64_t made_table = 0, made_slot = 0;
  uint64_t cut = 0;
  bool cut_set = false;
  int64_t live = 0, live_peak = 0, count = 0, count_peak = 0;
  uint64_t total = 0;
  // While not valid: booked blocks freed (address), for the Python side to book itself.
  std::vector<uint64_t> raw;
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
  if (!serving->valid) return nullptr;  // (armed implies valid: a pause clears both)
  if (!serving->blocks.emplace(address, ServedBlock{table, position, nbytes, serving->serial,
                                                    serving->length, false}).second) {
    return nullptr;  // a live block of the server's has that address: the Python call decides
  }
  table->live.emplace(offset, offset + std::max<uint64_t>(nbytes, 1));
  table->refs++;
  serving->position = position + 1;
  serving->served++;
  serving->made.insert(serving->made.end(), {static_cast<uint64_t>(nbytes), serving->clock});
  serving->made_table = table->id;
  serving->made_slot = position;
  serving->length++;
  serving->clock++;
  serving->total += nbytes;
  serving->live += static_cast<int64_t>(nbytes);
  serving->live_peak = std::max(serving->live_peak, serving->live);
  serving->count++;
  serving->count_peak = std::max(serving->count_peak, serving->count);
  *out = table;
  return reinterpret_cast<void*>(address);
}

void serving_untake(Serving* serving, ServingTable* table, void* data) {
  auto found = serving->blocks.find(reinterpret_cast<uintptr_t>(data));
  uint64_t nbytes = found->second.nbytes;
  serving->blocks.erase(found);
  table->live.erase(reinterpret_cast<uintptr_t>(data) - table->base);
  serving->position--;
  serving->served--;
  serving->made.resize(serving->made.size() - 2);
  serving->made_slot--;  // (made_table stays: a pause's allocations all come from one table)
  serving->length--;
  serving->clock--;
  serving->total -= nbytes;
  serving->live -= static_cast<int64_t>(nbytes);
  serving->count--;
  unref_table(table);
}

bool serving_free(Serving* serving, ServingTable* table, void* data) {
  uintptr_t address = reinterpret_cast<uintptr_t>(data);
  table->live.erase(address - table->base);
  serving->freed++;
  auto found = serving->blocks.find(address);
  if (found != serving->blocks.end()) {
    ServedBlock block = found->second;
    serving->blocks.erase(found);
    if (!serving->valid) {
      serving->raw.push_back(address);  // booked (every live block is at a pause)
    } else {
      if (block.booked) serving->dropped.push_back(address);
      serving->live -= static_cast<int64_t>(block.nbytes);
      serving->count--;
      if (block.serial == serving->serial) {
        serving->ends.insert(serving->ends.end(), {block.number, serving->clock++});
      } else if (block.serial + 1 == serving->serial && serving->previous) {
        serving->carried.push_back(block.number);
        serving->cut = serving->length;
        serving->cut_set = true;
      }
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

// serving_leave(server, serial, previous, length, clock, id, position) -> bool: the Python side
// leaves with its step there; serve table id (0: none) from position on until the next pause.
// False (nothing changed) while frees it has not booked are logged: book them, then leave.
PyObject* serving_leave(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Serving* serving;
  if (!parse(args, nargs, 7, &serving, nullptr)) return nullptr;
  uint64_t values[6];
  if (!unsigned_args(args, 1, 7, values)) return nullptr;
  ServingTable* table = nullptr;
  if (values[4] != 0) {
    table = table_of(serving, args[5]);
    if (table == nullptr) return nullptr;
    if (table->retired || serving->closed) {
      PyErr_SetString(PyExc_ValueError, "cannot arm a retired table or a closed server");
      return nullptr;
    }
  }
  if (!serving->raw.empty()) Py_RETURN_FALSE;
  serving->serial = values[0];
  serving->previous = values[1] != 0;
  serving->length = values[2];
  serving->clock = values[3];
  serving->armed = table;
  serving->position = values[5];
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

// serving_pause(server) -> None if nothing happened, else (made, table and slot of the last
// made, ends, dropped, carried, cut
// or -1, clock, live change, highest, blocks change, highest, bytes served, unbooked, raw): what
// happened since the last pause; unbooked: the live blocks with no Python record (address,
// table, slot, nbytes, number; now booked). Stops serving until the next leave.
PyObject* serving_pause(PyObject*, PyObject* capsule) {
  Serving* serving = serving_of(capsule);
  if (serving == nullptr) return nullptr;
  serving->armed = nullptr;
  serving->valid = false;
  std::vector<uint64_t> unbooked;
  for (auto& entry : serving->blocks) {
    ServedBlock& block = entry.second;
    if (block.booked) continue;
    unbooked.insert(unbooked.end(), {static_cast<uint64_t>(entry.first), block.table->id,
                                     block.slot, block.nbytes, block.number});
  }
  if (serving->made.empty() && serving->ends.empty() && serving->dropped.empty() &&
      serving->carried.empty() && serving->raw.empty() && serving->live == 0 &&
      serving->count == 0 && unbooked.empty()) {
    Py_RETURN_NONE;
  }
  PyObject* result = Py_BuildValue(
      "(NKKNNNLKLLLLKNN)", list_of(serving->made),
      static_cast<unsigned long long>(serving->made_table),
      static_cast<unsigned long long>(serving->made_slot), list_of(serving->ends),
      list_of(serving->dropped), list_of(serving->carried),
      serving->cut_set ? static_cast<long long>(serving->cut) : -1LL,
      static_cast<unsigned long long>(serving->clock),
      static_cast<long long>(serving->live), static_cast<long long>(serving->live_peak),
      static_cast<long long>(serving->count), static_cast<long long>(serving->count_peak),
      static_cast<unsigned long long>(serving->total), list_of(unbooked), list_of(serving->raw));
  if (result == nullptr) return nullptr;
  for (auto& entry : serving->blocks) entry.second.booked = true;
  serving->made.clear();
  serving->ends.clear();
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
  table->live.emplace(range[0], std::max(range[1], range[0] + 1));
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
                                   static_cast<unsigned long long>(range.second));
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
    {"serving_leave", fast(serving_leave), METH_FASTCALL,
     "The Python side leaves: where its step stands, and what to serve."},
    {"serving_pause", serving_pause, METH_O, "Stop serving; return what happened since."},
    {"serving_close", serving_close, METH_O, "Serve nothing more."},
    {"serving_counts", serving_counts, METH_O, "(served, freed) by the server, ever."},
    {"occupancy_is_free", fast(occupancy_is_free), METH_FASTCALL, "No live range overlaps."},
    {"occupancy_take", fast(occupancy_take), METH_FASTCALL, "Mark a range live."},
    {"occupancy_release", fast(occupancy_release), METH_FASTCALL, "Free the range at lo."},
    {"occupancy_ranges", fast(occupancy_ranges), METH_FASTCALL, "The live ranges."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace tensorarena_shim
