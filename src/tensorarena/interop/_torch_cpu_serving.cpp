// Serving a learned plan's slots with no Python call (tensorarena.learned.native_serving): the
// route's side, and the server's and its tables' lifetimes (the Python side's calls:
// _torch_cpu_serving_setup.cpp sets a server up, _torch_cpu_serving_calls.cpp reads and stops it).
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

#include <mutex>

namespace tensorarena_shim {

std::mutex native_lock;

namespace {

constexpr size_t kSpareNodes = 4096;  // a table's freed nodes kept for reuse, at most

// Every live table (registered or kept by a live block), for a free to find its block's arena.
std::vector<ServingTable*> arenas;

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

ServingTable* find_table(Serving* serving, uint64_t id) {
  auto found = serving->tables.find(id);
  return found == serving->tables.end() ? nullptr : found->second;
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

}  // namespace tensorarena_shim
