// The Python side's calls on a route's server of learned plans that read what it did
// (serving_pause, serving_counts), stop it (serving_close), and the arena's live ranges that the
// Python side's Occupancy keeps here while a server exists (occupancy_*); see
// _torch_cpu_serving.cpp. Each takes native_lock for what it reads or changes and makes its
// Python objects (and errors) with the lock released (_torch_cpu_serving.h).
#include "_torch_cpu_serving.h"

#include <mutex>

namespace tensorarena_shim {
namespace {

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

// What a pause took from the server: handed to the Python side, or put back on an error.
struct Digest {
  uint64_t made = 0, made_table = 0, made_slot = 0;
  std::vector<uint64_t> dropped, carried, raw, unbooked;
  std::vector<std::pair<ServingTable*, uint64_t>> fresh, listed;
  uint64_t cut = 0;
  bool cut_set = false;
  int64_t live = 0, live_peak = 0, count = 0, count_peak = 0;
  uint64_t total = 0;
};

// Put a digest back (native_lock held): as if the pause had not happened, but for its stopping.
void put_back(Serving* serving, Digest& taken) {
  for (const auto& [table, offset] : taken.listed) {  // (nothing is served while paused)
    auto found = table->live.find(offset);
    if (found != table->live.end() && found->second.served) found->second.booked = false;
  }
  serving->fresh.insert(serving->fresh.begin(), taken.fresh.begin(), taken.fresh.end());
  if (serving->made == 0) {
    serving->made_table = taken.made_table;
    serving->made_slot = taken.made_slot;
  }
  serving->made += taken.made;
  for (auto [to, from] : {std::make_pair(&serving->dropped, &taken.dropped),
                          std::make_pair(&serving->carried, &taken.carried),
                          std::make_pair(&serving->raw, &taken.raw)}) {
    to->insert(to->begin(), from->begin(), from->end());
  }
  if (!serving->cut_set && taken.cut_set) {
    serving->cut = taken.cut;
    serving->cut_set = true;
  }
  serving->live_peak = std::max(taken.live_peak, taken.live + serving->live_peak);
  serving->live += taken.live;
  serving->count_peak = std::max(taken.count_peak, taken.count + serving->count_peak);
  serving->count += taken.count;
  serving->total += taken.total;
}

}  // namespace

// serving_pause(server) -> None if there is nothing to book, else (served, table and slot of
// the last served, dropped, carried, cut or -1, live change, highest, blocks change, highest,
// bytes served, unbooked, raw): what happened since the last pause that the Python side books
// (what it logged is in the step's log already); unbooked: the live blocks with no Python
// record (address, table, slot, nbytes, number; booked from now on). Stops serving until the
// next leave. On an error (no memory), nothing changed but that.
PyObject* serving_pause(PyObject*, PyObject* capsule) {
  Serving* serving = serving_of(capsule);
  if (serving == nullptr) return nullptr;
  Digest taken;
  {
    std::lock_guard<std::mutex> guard(native_lock);
    serving->armed = nullptr;
    serving->valid = false;
    for (const auto& [table, offset] : serving->fresh) {
      auto found = table->live.find(offset);
      if (found == table->live.end() || !found->second.served || found->second.booked) continue;
      LiveRange& block = found->second;
      block.booked = true;  // (a range twice in fresh: listed once)
      ref_table(table);      // (kept until the lists are made: its block may die meanwhile)
      taken.listed.emplace_back(table, offset);
      taken.unbooked.insert(taken.unbooked.end(),
                            {static_cast<uint64_t>(table->base + offset), table->id, block.slot,
                             block.nbytes, block.number});
    }
    taken.fresh.swap(serving->fresh);
    if (serving->made == 0 && serving->dropped.empty() && serving->carried.empty() &&
        serving->raw.empty() && serving->live == 0 && serving->count == 0 &&
        taken.unbooked.empty()) {
      taken.fresh.clear();  // (its room kept for the next blocks)
      serving->fresh.swap(taken.fresh);
      Py_RETURN_NONE;  // (no object made: None is immortal)
    }
    taken.made = serving->made;
    taken.made_table = serving->made_table;
    taken.made_slot = serving->made_slot;
    taken.dropped.swap(serving->dropped);
    taken.carried.swap(serving->carried);
    taken.raw.swap(serving->raw);
    taken.cut = serving->cut;
    taken.cut_set = serving->cut_set;
    taken.live = serving->live;
    taken.live_peak = serving->live_peak;
    taken.count = serving->count;
    taken.count_peak = serving->count_peak;
    taken.total = serving->total;
    serving->made = 0;
    serving->cut_set = false;
    serving->live = serving->live_peak = serving->count = serving->count_peak = 0;
    serving->total = 0;
  }
  PyObject* lists[4] = {list_of(taken.dropped), list_of(taken.carried), list_of(taken.unbooked),
                        list_of(taken.raw)};
  PyObject* result = nullptr;
  if (lists[0] != nullptr && lists[1] != nullptr && lists[2] != nullptr && lists[3] != nullptr) {
    result = Py_BuildValue(
        "(KKKOOLLLLLKOO)", static_cast<unsigned long long>(taken.made),
        static_cast<unsigned long long>(taken.made_table),
        static_cast<unsigned long long>(taken.made_slot), lists[0], lists[1],
        taken.cut_set ? static_cast<long long>(taken.cut) : -1LL,
        static_cast<long long>(taken.live), static_cast<long long>(taken.live_peak),
        static_cast<long long>(taken.count), static_cast<long long>(taken.count_peak),
        static_cast<unsigned long long>(taken.total), lists[2], lists[3]);
  }
  for (PyObject* list : lists) Py_XDECREF(list);  // ("O" took its own references)
  std::lock_guard<std::mutex> guard(native_lock);
  if (result == nullptr) put_back(serving, taken);  // nothing changed: what was taken goes back
  if (serving->fresh.empty() && serving->fresh.capacity() < taken.fresh.capacity()) {
    taken.fresh.clear();  // its room serves the next blocks (no regrowth per pause)
    serving->fresh.swap(taken.fresh);
  }
  for (const auto& listed : taken.listed) unref_table(listed.first);
  return result;
}

// serving_close(server): serve nothing more; frees of blocks served here are booked at once.
PyObject* serving_close(PyObject*, PyObject* capsule) {
  Serving* serving = serving_of(capsule);
  if (serving == nullptr) return nullptr;
  std::lock_guard<std::mutex> guard(native_lock);
  serving->closed = true;
  serving->armed = nullptr;
  Py_RETURN_NONE;
}

// serving_counts(server) -> (served here, freed here), ever.
PyObject* serving_counts(PyObject*, PyObject* capsule) {
  Serving* serving = serving_of(capsule);
  if (serving == nullptr) return nullptr;
  unsigned long long counts[2];
  {
    std::lock_guard<std::mutex> guard(native_lock);
    counts[0] = serving->served;
    counts[1] = serving->freed;
  }
  return Py_BuildValue("(KK)", counts[0], counts[1]);
}

// The arena's live ranges, for the Python side's Occupancy while a server exists.
PyObject* occupancy_is_free(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Serving* serving;
  uint64_t words[3];  // id, lo, hi
  if (!serving_args(args, nargs, 4, &serving, words)) return nullptr;
  bool found, free = false;
  {
    std::lock_guard<std::mutex> guard(native_lock);
    ServingTable* table = find_table(serving, words[0]);
    found = table != nullptr;
    if (found) free = table->is_free(words[1], words[2]);
  }
  if (!found) return no_table(words[0]);
  return PyBool_FromLong(free);
}

PyObject* occupancy_take(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Serving* serving;
  uint64_t words[3];  // id, lo, hi
  if (!serving_args(args, nargs, 4, &serving, words)) return nullptr;
  int outcome;  // 1 taken, 0 overlaps, -1 no table
  {
    std::lock_guard<std::mutex> guard(native_lock);
    ServingTable* table = find_table(serving, words[0]);
    if (table == nullptr) {
      outcome = -1;
    } else if (!table->is_free(words[1], words[2])) {
      outcome = 0;
    } else {
      table->live.emplace(words[1], LiveRange{std::max(words[2], words[1] + 1)});
      outcome = 1;
    }
  }
  if (outcome == -1) return no_table(words[0]);
  if (outcome == 0) {
    PyErr_SetString(PyExc_ValueError, "the range overlaps a live block");
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* occupancy_release(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Serving* serving;
  uint64_t words[2];  // id, lo
  if (!serving_args(args, nargs, 3, &serving, words)) return nullptr;
  bool found;
  {
    std::lock_guard<std::mutex> guard(native_lock);
    ServingTable* table = find_table(serving, words[0]);
    found = table != nullptr;
    if (found) table->live.erase(words[1]);
  }
  if (!found) return no_table(words[0]);
  Py_RETURN_NONE;
}

PyObject* occupancy_ranges(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Serving* serving;
  uint64_t id;
  if (!serving_args(args, nargs, 2, &serving, &id)) return nullptr;
  std::vector<uint64_t> ranges;
  bool found;
  {
    std::lock_guard<std::mutex> guard(native_lock);
    ServingTable* table = find_table(serving, id);
    found = table != nullptr;
    if (found) {
      for (const auto& range : table->live) {
        ranges.insert(ranges.end(), {range.first, range.second.hi});
      }
    }
  }
  if (!found) return no_table(id);
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  for (size_t i = 0; i < ranges.size(); i += 2) {
    PyObject* item = Py_BuildValue("(KK)", static_cast<unsigned long long>(ranges[i]),
                                   static_cast<unsigned long long>(ranges[i + 1]));
    if (item == nullptr || PyList_Append(out, item) != 0) {
      Py_XDECREF(item);
      Py_DECREF(out);
      return nullptr;
    }
    Py_DECREF(item);
  }
  return out;
}

}  // namespace tensorarena_shim
