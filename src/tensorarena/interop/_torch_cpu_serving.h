// A route's server of learned plans' slots (_torch_cpu_serving.cpp: what the route calls, with
// no GIL; _torch_cpu_serving_setup.cpp and _torch_cpu_serving_calls.cpp: what the Python side
// calls, under the GIL), and what they share: the server, its tables, and native_lock
// (_torch_cpu_step_log.h), under which all of it changes. Nothing holding native_lock calls into
// Python or makes a Python object that a collection could run from (a tuple, a list, an
// exception): a collection may free a served block on this very thread, or run Python code that
// lets another thread take the GIL while it waits for the lock.
#pragma once

#include "_torch_cpu_shim.h"
#include "_torch_cpu_step_log.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
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
  long refs = 1;  // the server's while registered, one per live served block
  uint64_t id = 0;
  Serving* serving = nullptr;  // (alive while a served block is: the block holds its route)
  uintptr_t base = 0;
  uint64_t extent = 0;  // the arena's bytes the table's slots reach: [base, base + extent)
  std::vector<uint64_t> sizes;
  std::vector<uint64_t> offsets;      // kNoSlot: the allocation outlived its recording
  std::map<uint64_t, LiveRange> live;  // the arena's live blocks, by lo
  // Nodes of freed served blocks, reused by the next ones (no malloc per block served).
  std::vector<std::map<uint64_t, LiveRange>::node_type> spare;
  bool retired = false;

  bool is_free(uint64_t lo, uint64_t hi) const {
    std::map<uint64_t, LiveRange>::const_iterator after;
    return free_at(lo, hi, &after);
  }
  // Whether no live range overlaps [lo, hi); *after: the first range starting at or after hi,
  // where a range at lo goes (the hint that makes its insertion amortized constant).
  bool free_at(uint64_t lo, uint64_t hi, std::map<uint64_t, LiveRange>::const_iterator* after)
      const {
    hi = std::max(hi, lo + 1);
    *after = live.lower_bound(hi);
    if (*after == live.begin()) return true;
    return std::prev(*after)->second.hi <= lo;
  }
};

struct Serving {
  long refs = 1;  // the capsule's; the route holds one more (under the GIL)
  Route* route = nullptr;  // the route serving from it (not counted: it holds this server)
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

constexpr uint64_t kNoSlot = ~uint64_t{0};

// A table's new reference and its last (native_lock held): the last one forgets its arena.
void ref_table(ServingTable* table);
void unref_table(ServingTable* table);
// Register a new table of the server's (native_lock held): its arena becomes findable.
void add_table(Serving* serving, ServingTable* table);

// The server of a capsule (nullptr with an error set); this and the two below:
// _torch_cpu_serving_setup.cpp.
Serving* serving_of(PyObject* capsule);
// (server, unsigned ints...) arguments of a call taking want of them (first: the server's
// capsule; the rest go to words); false with an error set.
bool serving_args(PyObject* const* args, Py_ssize_t nargs, Py_ssize_t want, Serving** serving,
                  uint64_t* words);
// The server's table id (native_lock held), or nullptr (_torch_cpu_serving.cpp); and the error
// to set then (no lock).
ServingTable* find_table(Serving* serving, uint64_t id);
PyObject* no_table(uint64_t id);

// The module functions of _torch_cpu_serving_calls.cpp (listed in serving_methods,
// _torch_cpu_serving_setup.cpp).
PyObject* serving_pause(PyObject*, PyObject* capsule);
PyObject* serving_close(PyObject*, PyObject* capsule);
PyObject* serving_counts(PyObject*, PyObject* capsule);
PyObject* occupancy_is_free(PyObject*, PyObject* const* args, Py_ssize_t nargs);
PyObject* occupancy_take(PyObject*, PyObject* const* args, Py_ssize_t nargs);
PyObject* occupancy_release(PyObject*, PyObject* const* args, Py_ssize_t nargs);
PyObject* occupancy_ranges(PyObject*, PyObject* const* args, Py_ssize_t nargs);

}  // namespace tensorarena_shim
