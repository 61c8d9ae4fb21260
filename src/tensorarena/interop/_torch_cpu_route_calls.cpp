// The module functions of torch CPU routes (tensorarena.torch.route): make one, set it for every
// thread or this one, read and reset its counters, give it a server or a native pool, count the
// live routed blocks, stop at exit. Under the GIL; see _torch_cpu_routes.cpp.
#include "_torch_cpu_routes.h"

#include <algorithm>

namespace tensorarena_shim {

namespace {

Route* route_of(PyObject* capsule) {
  return static_cast<Route*>(PyCapsule_GetPointer(capsule, kRouteCapsule));
}

void drop_capsule(PyObject* capsule) {
  Route* route = route_of(capsule);
  if (route != nullptr) release(route);
  else PyErr_Clear();
}

// new_route(allocate, deallocate, alignment) -> capsule
PyObject* new_route(PyObject*, PyObject* args) {
  PyObject *allocate, *deallocate;
  unsigned long long alignment;
  if (!PyArg_ParseTuple(args, "OOK", &allocate, &deallocate, &alignment)) return nullptr;
  if (!PyCallable_Check(allocate) || !PyCallable_Check(deallocate) || alignment == 0 ||
      (alignment & (alignment - 1)) != 0) {
    PyErr_SetString(PyExc_ValueError, "new_route takes two callables and a power-of-two alignment");
    return nullptr;
  }
  auto* route = new Route();
  Py_INCREF(allocate);
  Py_INCREF(deallocate);
  route->allocate = allocate;
  route->deallocate = deallocate;
  route->alignment = alignment;
  PyObject* capsule = PyCapsule_New(route, kRouteCapsule, drop_capsule);
  if (capsule == nullptr) release(route);
  return capsule;
}

// set_route(capsule or None, every_thread: bool): the route serving every thread, or this one.
PyObject* set_route(PyObject*, PyObject* args) {
  PyObject* capsule;
  int all;
  if (!PyArg_ParseTuple(args, "Op", &capsule, &all)) return nullptr;
  Route* route = nullptr;
  if (capsule != Py_None) {
    route = route_of(capsule);
    if (route == nullptr) return nullptr;
    route->refs.fetch_add(1);
  }
  Route* before;
  if (all) {
    std::lock_guard<std::mutex> guard(current_lock);
    before = every_thread.exchange(route, std::memory_order_acq_rel);
  } else {
    before = this_thread;
    this_thread = route;
  }
  if (before != nullptr) release(before);
  Py_RETURN_NONE;
}

// route_statistics(capsule) -> (blocks, peak, total, bytes, peak, total, ooms, free failures,
// deferred frees, last error or None)
PyObject* route_statistics(PyObject*, PyObject* capsule) {
  Route* route = route_of(capsule);
  if (route == nullptr) return nullptr;
  PyObject* error = route->last_error != nullptr ? route->last_error : Py_None;
  unsigned long long counts[6] = {route->blocks.load(), route->blocks_peak.load(),
                                  route->blocks_total.load(), route->bytes.load(),
                                  route->bytes_peak.load(), route->bytes_total.load()};
  return Py_BuildValue("(KKKKKKKKKO)", counts[0], counts[1], counts[2], counts[3], counts[4],
                       counts[5], static_cast<unsigned long long>(route->ooms),
                       static_cast<unsigned long long>(route->free_failures),
                       static_cast<unsigned long long>(route->deferred), error);
}

PyObject* reset_route_peaks(PyObject*, PyObject* capsule) {
  Route* route = route_of(capsule);
  if (route == nullptr) return nullptr;
  route->blocks_peak.store(route->blocks.load());
  route->bytes_peak.store(route->bytes.load());
  Py_RETURN_NONE;
}

}  // namespace

bool route_attach_pool(PyObject* capsule, NativePool* pool) {
  Route* route = route_of(capsule);
  if (route == nullptr) return false;
  if (route->pool != nullptr) {
    PyErr_SetString(PyExc_ValueError, "this route has a native pool already");
    return false;
  }
  native_pool_hold(pool);
  native_routes.fetch_add(1);
  route->pool.store(pool, std::memory_order_release);
  return true;
}

Route* route_attach_serving(PyObject* capsule, Serving* serving) {
  Route* route = route_of(capsule);
  if (route == nullptr) return nullptr;
  if (route->serving != nullptr) {
    PyErr_SetString(PyExc_ValueError, "this route has a server already");
    return nullptr;
  }
  serving_hold(serving);
  native_routes.fetch_add(1);
  route->serving.store(serving, std::memory_order_release);
  return route;
}

namespace {

PyObject* routed_blocks(PyObject*, PyObject*) {
  size_t count;
  {
    std::lock_guard<std::mutex> guard(table_lock);
    count = table.size();
  }
  int64_t native = std::max<int64_t>(native_blocks.load(), 0);
  return PyLong_FromSize_t(count + static_cast<size_t>(native));
}

// shutdown(): the interpreter is exiting; later frees of routed blocks leak, nothing is routed.
PyObject* shutdown(PyObject*, PyObject*) {
  gone.store(true);
  {
    std::lock_guard<std::mutex> guard(current_lock);
    every_thread.store(nullptr);  // its reference is leaked with the blocks
  }
  this_thread = nullptr;
  Py_RETURN_NONE;
}

}  // namespace

PyMethodDef route_methods[] = {
    {"new_route", new_route, METH_VARARGS, "A route over allocate/deallocate callables."},
    {"set_route", set_route, METH_VARARGS,
     "Set the route of every thread (True) or of this thread (False); None clears it."},
    {"route_statistics", route_statistics, METH_O, "A route's counters and last error."},
    {"reset_route_peaks", reset_route_peaks, METH_O, "Set a route's peaks to their current."},
    {"routed_blocks", routed_blocks, METH_NOARGS, "Live routed blocks, every route together."},
    {"shutdown", shutdown, METH_NOARGS, "Stop routing and calling into Python (at exit)."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace tensorarena_shim
