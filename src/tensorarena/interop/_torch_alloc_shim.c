/*
 * The smallest shared library PyTorch's CUDAPluggableAllocator can load: two C entry points
 * (ta_malloc, ta_free, with the signatures torch.cuda.memory.CUDAPluggableAllocator calls) that
 * forward to two function pointers tensorarena sets from Python with ctypes
 * (tensorarena/interop/torch_allocator.py). ctypes callbacks take the GIL themselves, so this
 * file needs neither Python's headers nor CUDA's (a cudaStream_t is a pointer): any C compiler
 * builds it, with or without a CUDA toolkit. With no callback set (before install, or after
 * the interpreter began to exit) ta_malloc returns NULL, which PyTorch reports as out of memory,
 * and ta_free does nothing.
 */
#include <stddef.h>
#include <sys/types.h>

typedef void *(*ta_alloc_fn)(ssize_t size, int device, void *stream);
typedef void (*ta_free_fn)(void *ptr, ssize_t size, int device, void *stream);

static ta_alloc_fn volatile ta_alloc_callback = NULL;
static ta_free_fn volatile ta_free_callback = NULL;

void ta_set_callbacks(ta_alloc_fn alloc, ta_free_fn release)
{
    ta_alloc_callback = alloc;
    ta_free_callback = release;
}

void *ta_malloc(ssize_t size, int device, void *stream)
{
    ta_alloc_fn alloc = ta_alloc_callback;
    return alloc ? alloc(size, device, stream) : NULL;
}

void ta_free(void *ptr, ssize_t size, int device, void *stream)
{
    ta_free_fn release = ta_free_callback;
    if (release)
        release(ptr, size, device, stream);
}
