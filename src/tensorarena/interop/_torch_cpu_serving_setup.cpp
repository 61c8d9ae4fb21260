// The Python side's calls that set a route's server of learned plans up
// (tensorarena.learned.native_serving): attach a server to a route, register, retire and drop a
// plan's table, tell the server the log of the step that begins, and leave it to serve
// (serving_leave); the argument helpers every call on a server shares (_torch_cpu_serving.h); and
// the table of the module functions of serving (serving_methods: these, those of
// _torch_cpu_serving_calls.cpp and the step log's). The server itself: _torch_cpu_serving.cpp.
// Each call takes native_lock for what it reads or changes and makes its Python objects (and
// errors) with the lock released.
#include "_torch_cpu_serving.h"

#include <cstring>
#include <mutex>

namespace tensorarena_shim {

namespace {

constexpr const char* kServingCapsule = "tensorarena.torch_cpu_serving";

void drop_serving_capsule(PyObject* capsule) {
  Serving* serving = serving_of(capsule);
  if (serving != nullptr) serving_release(serving);
  else PyErr_Clear();
}

}  // namespace

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

PyObject* no_table(uint64_t id) {
  PyErr_Format(PyExc_KeyError, "no serving table %llu", static_cast<unsigned long long>(id));
  return nullptr;
}

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
