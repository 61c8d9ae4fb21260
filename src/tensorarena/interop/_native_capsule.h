/*
 * A DLPack capsule over a block, for the two extensions that make one: the private dlpack()
 * function (_native_dlpack.c) and empty()'s compiled torch entry (_native_empty.c). Static, as
 * _native_block.h: each module has its copy.
 *
 * make_capsule(resource, address, nbytes, shape, dtype) makes a "dltensor" capsule (DLPack's C
 * ABI, unversioned, which every consumer takes) of a C-contiguous CPU tensor of shape over the
 * block, and takes the block over: no owner object, the capsule's managed tensor carries the
 * block and gives it back with one resource.deallocate(address, nbytes) when the consumer's
 * tensor dies, or when the capsule dies unconsumed. Shapes whose bytes exceed the block are
 * refused: no tensor may reach past it.
 */
#ifndef TENSORARENA_NATIVE_CAPSULE_H
#define TENSORARENA_NATIVE_CAPSULE_H

#include "_native_block.h"

/* DLPack's C ABI (dlpack.h, unversioned "dltensor" capsules, stable since 0.2 and still taken by
   every consumer), declared here so that no header is needed. */
typedef struct {
    int32_t device_type; /* kDLCPU = 1 */
    int32_t device_id;
} DLDevice;
typedef struct {
    uint8_t code; /* kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLComplex 5, kDLBool 6 */
    uint8_t bits;
    uint16_t lanes;
} DLDataType;
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* in items */
    uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

/* One allocation: the managed tensor, the block it owns, then ndim sizes and ndim strides.

   Two parties hold it: the capsule, and the consumer that took the tensor over (torch). The
   block goes back once, by whichever gives it back first; the memory is freed once both are
   done. A consumer that fails half way may already have called the deleter through its own
   clean-up and still leave the capsule unconsumed (torch does, for a shape whose item count
   overflows): the flags make that a single give-back and a single free, not a crash. Every
   flag is read and written with the GIL held. */
typedef struct {
    DLManagedTensor managed;
    /* The block, given back with resource.deallocate(address, nbytes). */
    PyObject *resource;
    PyObject *address_int;
    PyObject *nbytes_int;
    char given_back;    /* the block is the resource's again */
    char consumer_done; /* the consumer called the deleter */
    char capsule_done;  /* the capsule is gone */
    int64_t dims[];
} BlockTensor;

#define MAX_DLPACK_DIMS 64

/* Gives the block back, once (the GIL held). */
static void
give_block_back(BlockTensor *block)
{
    if (block->given_back)
        return;
    block->given_back = 1;
    PyObject *address = block->address_int, *nbytes = block->nbytes_int;
    give_back(block->resource, address, nbytes, address);
    Py_DECREF(address);
    Py_DECREF(nbytes);
}

/* Called by the consumer (torch) when the tensor's storage dies, perhaps without the GIL
   (torch releases it while a tensor is destroyed). */
static void
block_tensor_deleter(DLManagedTensor *managed)
{
    if (!Py_IsInitialized())
        return; /* the interpreter is gone: the process's end takes the block */
    PyGILState_STATE gil = PyGILState_Ensure();
    BlockTensor *block = (BlockTensor *)managed;
    give_block_back(block);
    block->consumer_done = 1;
    if (block->capsule_done)
        PyMem_Free(block);
    PyGILState_Release(gil);
}

/* The capsule dies (with the GIL). Consumed ("used_dltensor"): the consumer gives the block
   back; otherwise nobody will, so the capsule does, and frees the memory. */
static void
capsule_destructor(PyObject *capsule)
{
    PyObject *error_type, *error_value, *error_traceback;
    PyErr_Fetch(&error_type, &error_value, &error_traceback);
    int consumed = PyCapsule_IsValid(capsule, "used_dltensor");
    BlockTensor *block =
        (BlockTensor *)PyCapsule_GetPointer(capsule, consumed ? "used_dltensor" : "dltensor");
    if (block == NULL) {
        PyErr_WriteUnraisable(capsule); /* renamed by someone else: leave it alone */
    }
    else {
        block->capsule_done = 1;
        if (!consumed)
            give_block_back(block);
        if (!consumed || block->consumer_done)
            PyMem_Free(block);
    }
    PyErr_Restore(error_type, error_value, error_traceback);
}

/* Reads one dimension: an exact int in [0, 2**63). */
static int
read_dim(PyObject *value, int64_t *out)
{
    if (!PyLong_CheckExact(value)) {
        PyErr_Format(PyExc_TypeError, "dlpack(): a dimension must be an int, not %.100s",
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    long long dim = PyLong_AsLongLong(value);
    if (dim == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        dim = -1;
    }
    if (dim < 0) {
        PyErr_Format(PyExc_ValueError, "dlpack(): dimension %R is not in [0, 2**63)", value);
        return -1;
    }
    *out = dim;
    return 0;
}

/* The shape argument: an int (one dimension) or a tuple of ints. */
static int
read_shape(PyObject *shape, int64_t *dims, int32_t *ndim)
{
    if (PyLong_CheckExact(shape)) {
        *ndim = 1;
        return read_dim(shape, dims);
    }
    if (!PyTuple_CheckExact(shape)) {
        PyErr_Format(PyExc_TypeError, "dlpack(): shape must be an int or a tuple, not %.100s",
                     Py_TYPE(shape)->tp_name);
        return -1;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(shape);
    if (count > MAX_DLPACK_DIMS) {
        PyErr_Format(PyExc_ValueError, "dlpack(): %zd dimensions, over %d", count,
                     MAX_DLPACK_DIMS);
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        if (read_dim(PyTuple_GET_ITEM(shape, i), &dims[i]) < 0)
            return -1;
    *ndim = (int32_t)count;
    return 0;
}

/* The DLPack dtype argument: code | bits << 8, with bits a whole number of bytes. */
static int
read_dtype(PyObject *value, DLDataType *dtype)
{
    long packed = PyLong_CheckExact(value) ? PyLong_AsLong(value) : -1;
    long code = packed & 0xff, bits = packed >> 8;
    if (packed < 0 || bits < 8 || bits > 255 || bits % 8 != 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError,
                     "dlpack(): dtype must be code | bits << 8 with bits a multiple of 8 in "
                     "[8, 248], not %R", value);
        return -1;
    }
    dtype->code = (uint8_t)code;
    dtype->bits = (uint8_t)bits;
    dtype->lanes = 1;
    return 0;
}

/* The bytes a C-contiguous array of dims needs; -1 where the product of its nonzero dimensions
   (the largest stride) or the bytes overflow 64 bits, even for zero items: torch multiplies the
   dimensions in order and fails half way through such a shape. */
static int64_t
shape_bytes(const int64_t *dims, int32_t ndim, int64_t itemsize)
{
    int64_t items = 1, nbytes;
    int zero = 0;
    for (int32_t i = 0; i < ndim; i++) {
        zero |= dims[i] == 0;
        if (__builtin_mul_overflow(items, dims[i] ? dims[i] : 1, &items))
            return -1;
    }
    if (__builtin_mul_overflow(items, itemsize, &nbytes))
        return -1;
    return zero ? 0 : nbytes;
}

/* The capsule over the block at address (checked by read_block) of a C-contiguous CPU tensor of
   ndim dims (checked: within the block) and dtype; NULL with an exception set, nothing taken. */
static PyObject *
build_capsule(PyObject *resource, PyObject *address_int, PyObject *nbytes_int,
              Py_ssize_t address, const int64_t *dims, int32_t ndim, DLDataType dtype)
{
    BlockTensor *block = PyMem_Malloc(sizeof(BlockTensor) + 2 * (size_t)ndim * sizeof(int64_t));
    if (block == NULL)
        return PyErr_NoMemory();
    int64_t *shape = block->dims, *strides = block->dims + ndim, stride = 1;
    for (int32_t i = ndim - 1; i >= 0; i--) {
        shape[i] = dims[i];
        strides[i] = stride;
        stride *= dims[i] ? dims[i] : 1; /* cannot overflow: shape_bytes checked the product */
    }
    DLManagedTensor *managed = &block->managed;
    managed->dl_tensor.data = (void *)address;
    managed->dl_tensor.device.device_type = 1;
    managed->dl_tensor.device.device_id = 0;
    managed->dl_tensor.ndim = ndim;
    managed->dl_tensor.dtype = dtype;
    managed->dl_tensor.shape = shape;
    managed->dl_tensor.strides = strides;
    managed->dl_tensor.byte_offset = 0;
    managed->manager_ctx = NULL;
    managed->deleter = block_tensor_deleter;
    block->given_back = block->consumer_done = block->capsule_done = 0;
    PyObject *capsule = PyCapsule_New(managed, "dltensor", capsule_destructor);
    if (capsule == NULL) {
        PyMem_Free(block);
        return NULL;
    }
    /* Only once the capsule exists: from here its destructor gives the block back. */
    Py_INCREF(resource);
    block->resource = resource;
    Py_INCREF(address_int);
    block->address_int = address_int;
    Py_INCREF(nbytes_int);
    block->nbytes_int = nbytes_int;
    return capsule;
}

/* A "dltensor" capsule of a C-contiguous CPU tensor of shape (an int or a tuple of ints) and
   DLPack dtype (code | bits << 8) over the block, which it takes over; NULL with an exception
   set (and nothing taken) for a bad block, shape or dtype. (Inline: a module may not use it.) */
static inline PyObject *
make_capsule(PyObject *resource, PyObject *address_int, PyObject *nbytes_int,
             PyObject *shape_arg, PyObject *dtype_arg)
{
    Py_ssize_t address, nbytes;
    if (read_block(address_int, nbytes_int, "dlpack", &address, &nbytes) < 0)
        return NULL;
    DLDataType dtype;
    int64_t dims[MAX_DLPACK_DIMS];
    int32_t ndim;
    if (read_dtype(dtype_arg, &dtype) < 0 || read_shape(shape_arg, dims, &ndim) < 0)
        return NULL;
    int64_t needed = shape_bytes(dims, ndim, dtype.bits / 8);
    if (needed < 0) {
        PyErr_Format(PyExc_ValueError, "dlpack(): shape %R overflows 64 bits", shape_arg);
        return NULL;
    }
    if (needed > (int64_t)nbytes) {
        PyErr_Format(PyExc_ValueError,
                     "dlpack(): shape %R of %d-bit items needs more than the block's %zd bytes",
                     shape_arg, (int)dtype.bits, nbytes);
        return NULL;
    }
    return build_capsule(resource, address_int, nbytes_int, address, dims, ndim, dtype);
}

#endif /* TENSORARENA_NATIVE_CAPSULE_H */
