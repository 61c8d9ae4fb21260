// The Python side of a learned step's log kept in C++ (_torch_cpu_step_log.h): the calls of
// tensorarena.learned.native_recorder.NativeRecorder. A step that repeats its plan is compared
// with it here (step_log_matches, step_log_same: exact, with no Python int per allocation); the
// log becomes Python lists (step_log_lists) only when a plan is learned from the step.
#include "_torch_cpu_step_log.h"

#include <algorithm>

namespace tensorarena_shim {
namespace {

constexpr const char* kLogCapsule = "tensorarena.torch_cpu_step_log";

void drop_log_capsule(PyObject* capsule) {
  auto* log = static_cast<StepLog*>(PyCapsule_GetPointer(capsule, kLogCapsule));
  if (log != nullptr) step_log_release(log);
  else PyErr_Clear();
}

bool unsigned_of(PyObject* object, uint64_t* out) {
  unsigned long long value = PyLong_AsUnsignedLongLong(object);
  if (value == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return false;
  *out = value;
  return true;
}

bool nargs_is(Py_ssize_t nargs, Py_ssize_t want) {
  if (nargs == want) return true;
  PyErr_Format(PyExc_TypeError, "takes %zd arguments, got %zd", want, nargs);
  return false;
}

// A list of Python ints, or nullptr with an error set (nothing leaked).
PyObject* ints_of(const std::vector<uint64_t>& words, bool live_is_none) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(words.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < words.size(); ++i) {
    PyObject* item;
    if (live_is_none && words[i] == StepLog::kLive) {
      Py_INCREF(Py_None);
      item = Py_None;
    } else {
      item = PyLong_FromUnsignedLongLong(words[i]);
      if (item == nullptr) {
        Py_DECREF(list);
        return nullptr;
      }
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), item);
  }
  return list;
}

// Whether sequence (a tuple or list of ints) holds exactly words' values (from, in order, those
// for which keep(i) holds); -1 with an error set if an item is not an int.
template <typename Keep>
int same_ints(PyObject* sequence, const std::vector<uint64_t>& words, Keep keep) {
  PyObject* fast = PySequence_Fast(sequence, "a signature is a sequence of ints");
  if (fast == nullptr) return -1;
  Py_ssize_t count = PySequence_Fast_GET_SIZE(fast);
  PyObject** items = PySequence_Fast_ITEMS(fast);
  Py_ssize_t at = 0;
  int same = 1;
  for (size_t i = 0; i < words.size() && same; ++i) {
    if (!keep(i)) continue;
    if (at == count) {
      same = 0;
      break;
    }
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(items[at++], &overflow);
    if (value == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      return -1;
    }
    if (overflow != 0 || value < 0 || static_cast<uint64_t>(value) != words[i]) same = 0;
  }
  if (same && at != count) same = 0;
  Py_DECREF(fast);
  return same;
}

}  // namespace

StepLog* step_log_of(PyObject* capsule) {
  return static_cast<StepLog*>(PyCapsule_GetPointer(capsule, kLogCapsule));
}

// step_log_new() -> a new, empty log.
PyObject* step_log_new(PyObject*, PyObject*) {
  static uint64_t next_id = 1;  // (under the GIL)
  auto* log = new StepLog();
  log->id = next_id++;
  PyObject* capsule = PyCapsule_New(log, kLogCapsule, drop_log_capsule);
  if (capsule == nullptr) step_log_release(log);
  return capsule;
}

// step_log_allocated(log, nbytes, alignment) -> the allocation's number.
PyObject* step_log_allocated(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!nargs_is(nargs, 3)) return nullptr;
  StepLog* log = step_log_of(args[0]);
  uint64_t nbytes, alignment;
  if (log == nullptr || !unsigned_of(args[1], &nbytes) || !unsigned_of(args[2], &alignment)) {
    return nullptr;
  }
  uint64_t number;
  {
    std::lock_guard<std::mutex> guard(native_lock);
    number = log->allocated(nbytes, alignment);
  }
  return PyLong_FromUnsignedLongLong(number);
}

// step_log_freed(log, number): allocation number is freed now (nothing, once the log ended).
PyObject* step_log_freed(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!nargs_is(nargs, 2)) return nullptr;
  StepLog* log = step_log_of(args[0]);
  uint64_t number;
  if (log == nullptr || !unsigned_of(args[1], &number)) return nullptr;
  bool live;
  {
    std::lock_guard<std::mutex> guard(native_lock);
    live = number < log->sizes.size() && log->ends[number] == StepLog::kLive;
    if (live) log->freed(number);
  }
  if (!live) {
    PyErr_Format(PyExc_IndexError, "allocation %llu is not live in this log",
                 static_cast<unsigned long long>(number));
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* step_log_length(PyObject*, PyObject* capsule) {
  StepLog* log = step_log_of(capsule);
  if (log == nullptr) return nullptr;
  size_t length;
  {
    std::lock_guard<std::mutex> guard(native_lock);
    length = log->sizes.size();
  }
  return PyLong_FromSize_t(length);
}

PyObject* step_log_clock(PyObject*, PyObject* capsule) {
  StepLog* log = step_log_of(capsule);
  if (log == nullptr) return nullptr;
  uint64_t clock;
  {
    std::lock_guard<std::mutex> guard(native_lock);
    clock = log->clock;
  }
  return PyLong_FromUnsignedLongLong(clock);
}

// step_log_end(log, learned): the step ended (learned from, or not): no more serving into it, no
// more frees logged.
PyObject* step_log_end(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!nargs_is(nargs, 2)) return nullptr;
  StepLog* log = step_log_of(args[0]);
  if (log == nullptr) return nullptr;
  int learned = PyObject_IsTrue(args[1]);
  if (learned < 0) return nullptr;
  std::lock_guard<std::mutex> guard(native_lock);
  log->ended = true;
  log->learned = learned != 0;
  Py_RETURN_NONE;
}

// step_log_lists(log) -> (sizes, alignments, starts, ends: None where live), as lists.
PyObject* step_log_lists(PyObject*, PyObject* capsule) {
  StepLog* log = step_log_of(capsule);
  if (log == nullptr) return nullptr;
  std::vector<uint64_t> words[4];
  {
    std::lock_guard<std::mutex> guard(native_lock);
    words[0] = log->sizes;
    words[1] = log->alignments;
    words[2] = log->starts;
    words[3] = log->ends;
  }
  PyObject* lists[4] = {ints_of(words[0], false), ints_of(words[1], false),
                        ints_of(words[2], false), ints_of(words[3], true)};
  if (lists[0] == nullptr || lists[1] == nullptr || lists[2] == nullptr || lists[3] == nullptr) {
    for (PyObject* list : lists) Py_XDECREF(list);
    return nullptr;
  }
  return Py_BuildValue("(NNNN)", lists[0], lists[1], lists[2], lists[3]);
}

// step_log_key(log, length) -> the sizes of the first length allocations, a tuple.
PyObject* step_log_key(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!nargs_is(nargs, 2)) return nullptr;
  StepLog* log = step_log_of(args[0]);
  uint64_t length;
  if (log == nullptr || !unsigned_of(args[1], &length)) return nullptr;
  std::vector<uint64_t> sizes;
  {
    std::lock_guard<std::mutex> guard(native_lock);
    size_t count = std::min<size_t>(length, log->sizes.size());
    sizes.assign(log->sizes.begin(), log->sizes.begin() + static_cast<std::ptrdiff_t>(count));
  }
  size_t count = sizes.size();
  PyObject* key = PyTuple_New(static_cast<Py_ssize_t>(count));
  if (key == nullptr) return nullptr;
  for (size_t i = 0; i < count; ++i) {
    PyObject* item = PyLong_FromUnsignedLongLong(sizes[i]);
    if (item == nullptr) {
      Py_DECREF(key);
      return nullptr;
    }
    PyTuple_SET_ITEM(key, static_cast<Py_ssize_t>(i), item);
  }
  return key;
}

// step_log_matches(log, sizes, outlived) -> bool: the log's signature is (sizes, outlived):
// the sizes in order, and the positions of the allocations still live, in order.
PyObject* step_log_matches(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!nargs_is(nargs, 3)) return nullptr;
  StepLog* log = step_log_of(args[0]);
  if (log == nullptr) return nullptr;
  Py_ssize_t length = PyObject_Length(args[1]);
  if (length < 0) return nullptr;
  std::vector<uint64_t> sizes, positions;
  {
    std::lock_guard<std::mutex> guard(native_lock);
    if (static_cast<size_t>(length) == log->sizes.size()) {
      sizes = log->sizes;
      for (size_t i = 0; i < log->ends.size(); ++i) {
        if (log->ends[i] == StepLog::kLive) positions.push_back(i);
      }
    }
  }
  if (static_cast<size_t>(length) != sizes.size()) Py_RETURN_FALSE;
  int same = same_ints(args[1], sizes, [](size_t) { return true; });
  if (same == 1) same = same_ints(args[2], positions, [](size_t) { return true; });
  if (same < 0) return nullptr;
  return PyBool_FromLong(same);
}

// step_log_same(a, b) -> bool: the two logs have one signature.
PyObject* step_log_same(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!nargs_is(nargs, 2)) return nullptr;
  StepLog* a = step_log_of(args[0]);
  StepLog* b = a == nullptr ? nullptr : step_log_of(args[1]);
  if (b == nullptr) return nullptr;
  std::lock_guard<std::mutex> guard(native_lock);
  bool same = a->sizes == b->sizes;
  for (size_t i = 0; same && i < a->ends.size(); ++i) {
    same = (a->ends[i] == StepLog::kLive) == (b->ends[i] == StepLog::kLive);
  }
  return PyBool_FromLong(same);
}

}  // namespace tensorarena_shim
