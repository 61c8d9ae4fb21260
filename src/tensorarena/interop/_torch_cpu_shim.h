// What the two halves of torch's CPU allocator shim share (tensorarena.interop.torch_cpu_shim).
//
// _torch_cpu_shim.cpp: the at::Allocator itself, installing it, the deleter of its own blocks,
// and the planned executor's kernel scripts (arm/disarm/record). _torch_cpu_routes.cpp,
// _torch_cpu_route_calls.cpp (_torch_cpu_routes.h): routing every allocation to a Python
// resource while a route is set (tensorarena.torch.use).
// _torch_cpu_serving.cpp, _torch_cpu_serving_setup.cpp, _torch_cpu_serving_calls.cpp
// (_torch_cpu_serving.h): a route's learned plans served with no Python call, the step's log
// kept in C++ (_torch_cpu_step_log.cpp, .h).
// _torch_cpu_native_pool.cpp, _torch_cpu_native_pool_calls.cpp (_torch_cpu_native_pool.h): a pool
// kept in C++, whose blocks a route takes with no Python call.
// One extension module serves them all, so a program pays one compile and one allocator swap.
#pragma once

#include <Python.h>

#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>

namespace tensorarena_shim {

// The allocator the shim replaced: every block the shim does not serve comes from it.
extern c10::Allocator* previous;

// The deleter (and raw deleter) of every block whose DataPtr the shim made with context == data:
// a recorded block, a routed one, a natively served one; anything else goes to previous's raw
// deleter.
void free_block(void* pointer);
// The deleter of a block a route's server or native pool gave (context == data too): its books
// are found from its address (the owner's own table: no global per-block table, no GIL unless
// Python must be called).
void free_native(void* pointer);

// --- routing (_torch_cpu_routes.cpp, _torch_cpu_route_calls.cpp) ------------------------------

struct Route;  // a resource's allocate/deallocate, and its native server or pool, if any

// Whether a route may serve this thread's allocation now (a hint, checked again).
bool routing();
// A block of nbytes (> 0) from the route serving this thread, or an empty DataPtr where none does
// after all. Throws c10::OutOfMemoryError (torch.OutOfMemoryError) when the resource refuses.
c10::DataPtr route_allocate(size_t nbytes);
// Give a routed block back to the route that made it; false if pointer is no routed block.
bool route_free(void* pointer);
// Lock / unlock the routing table around fork (pthread_atfork).
void routes_before_fork();
void routes_after_fork();

// The module functions of routing, added to the extension's own.
extern PyMethodDef route_methods[];

// --- serving learned plans with no Python call (_torch_cpu_serving*.cpp; under native_lock) ---

struct Serving;       // a route's server of learned plans' slots
struct ServingTable;  // one plan's table and its arena's live ranges

// Give the route of a route capsule its server (it takes a reference); the route, or nullptr
// with an error set.
Route* route_attach_serving(PyObject* route_capsule, Serving* serving);
// A slot for nbytes at the armed position, or nullptr (any thread, no GIL needed).
void* serving_take(Serving* serving, size_t nbytes, uint64_t alignment);
// What the free of a block a server gave leaves the route to do.
struct ServedFree {
  Route* route = nullptr;     // the route whose server gave it (the block's reference to it)
  size_t nbytes = 0;
  PyObject* sync = nullptr;   // not null: call it (under the GIL): the Python side books it now
};
// Free data if a server gave it (any thread, no GIL needed): true, with what is left to do.
bool serving_give(void* data, ServedFree* out);
void serving_hold(Serving* serving);
void serving_release(Serving* serving);  // under the GIL
// Lock / unlock every server and step log around fork (pthread_atfork).
void servings_before_fork();
void servings_after_fork();
extern PyMethodDef serving_methods[];

// --- a native pool's blocks with no Python call (_torch_cpu_native_pool*.cpp; thread-safe) --

struct NativePool;  // one arena's bookkeeping (tensorarena.torch.NativePool)

// Give the route of a route capsule a native pool to take blocks from first (it takes a
// reference); false with an error set.
bool route_attach_pool(PyObject* route_capsule, NativePool* pool);
// A block of nbytes (> 0) aligned to alignment for route, or nullptr where the arena has no room.
void* native_pool_take(NativePool* pool, size_t nbytes, uint64_t alignment, Route* route);
// Free data if a native pool gave it to a route (any thread, with or without the GIL): true,
// with the route that took it and the block's size.
bool native_pool_give(void* data, Route** route, size_t* nbytes);
void native_pool_hold(NativePool* pool);
void native_pool_release(NativePool* pool);
// Lock / unlock every native pool around fork (pthread_atfork).
void native_pools_before_fork();
void native_pools_after_fork();
extern PyMethodDef native_pool_methods[];

}  // namespace tensorarena_shim
