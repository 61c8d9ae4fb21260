// A learned step's log kept in C++ (tensorarena.learned.native_recorder), shared by the Python
// side (its Recorder's calls) and the route's server (_torch_cpu_serving.cpp), so that what the
// server serves and frees is logged where it happens and never turned into Python ints unless a
// plan is learned from the step.
//
// Per allocation, numbered from 0 in order: size, alignment, start and end on the step's clock,
// which ticks once per allocation and once per free of a block of the same step (lifetimes
// [start, end), tensorarena.learned.recording). kLive: not freed (yet). A log is *ended* when its
// step ends: nothing is served into it and no free is logged there any more (a block freed
// later outlived the step; in the next step, its free is carried if the step was learned from).
// A log changes, and is read, under native_lock: the route's server logs into it with no GIL.
#pragma once

#include <Python.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace tensorarena_shim {

// The lock of every server of learned plans and every step log (_torch_cpu_serving.h).
extern std::mutex native_lock;

struct StepLog {
  static constexpr uint64_t kLive = ~uint64_t{0};
  long refs = 1;        // the capsule's, and the server's while it is the step's or the last
                        // (changed under the GIL)
  uint64_t id = 0;      // unique in the process (from 1), what a served block names its log by
  bool ended = false;   // its step ended: no more serving into it, no more frees logged
  bool learned = false; // ended by a marker that learned from it (its frees next step carry)
  uint64_t clock = 0;
  std::vector<uint64_t> sizes, alignments, starts, ends;

  uint64_t allocated(uint64_t nbytes, uint64_t alignment) {
    sizes.push_back(nbytes);
    alignments.push_back(alignment);
    starts.push_back(clock++);
    ends.push_back(kLive);
    return sizes.size() - 1;
  }
  // Room for count allocations in all (no memory: left as it is; appends grow as before).
  void reserve(size_t count) noexcept {
    try {
      sizes.reserve(count);
      alignments.reserve(count);
      starts.reserve(count);
      ends.reserve(count);
    } catch (...) {
    }
  }
  void unallocate() {  // undo the last allocated()
    sizes.pop_back();
    alignments.pop_back();
    starts.pop_back();
    ends.pop_back();
    clock--;
  }
  void freed(uint64_t number) {
    if (!ended) ends[number] = clock++;
  }
};

inline void step_log_hold(StepLog* log) { log->refs++; }
inline void step_log_release(StepLog* log) {
  if (log != nullptr && --log->refs == 0) delete log;
}
// The log of a capsule (nullptr with an error set).
StepLog* step_log_of(PyObject* capsule);

// The module functions (listed in serving_methods, _torch_cpu_serving_setup.cpp).
PyObject* step_log_new(PyObject*, PyObject*);
PyObject* step_log_allocated(PyObject*, PyObject* const* args, Py_ssize_t nargs);
PyObject* step_log_freed(PyObject*, PyObject* const* args, Py_ssize_t nargs);
PyObject* step_log_length(PyObject*, PyObject* capsule);
PyObject* step_log_clock(PyObject*, PyObject* capsule);
PyObject* step_log_end(PyObject*, PyObject* const* args, Py_ssize_t nargs);
PyObject* step_log_lists(PyObject*, PyObject* capsule);
PyObject* step_log_key(PyObject*, PyObject* const* args, Py_ssize_t nargs);
PyObject* step_log_matches(PyObject*, PyObject* const* args, Py_ssize_t nargs);
PyObject* step_log_same(PyObject*, PyObject* const* args, Py_ssize_t nargs);

}  // namespace tensorarena_shim
