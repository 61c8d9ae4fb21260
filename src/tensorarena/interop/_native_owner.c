/*
 * The native block owner: the .base of an array made by tensorarena.empty, in C.
 *
 * An owner holds one block (resource, address, nbytes), exports exactly its bytes through the
 * buffer protocol (so np.frombuffer, np.ndarray(buffer=) and torch.frombuffer build arrays over it
 * in C, each keeping the owner alive) and gives the block back with one
 * resource.deallocate(address, nbytes) when the last array, view, tensor or memoryview over it is
 * gone. Python cannot export the buffer protocol before 3.12 (PEP 688) and mypyc classes cannot
 * either, hence this file; where it is not built, tensorarena.interop.owner's ctypes owner does
 * the same job, slower (see that module's docstring for the numbers).
 *
 * The type is a subclass of tensorarena.interop.owner.Allocation, so isinstance checks and the
 * refusal to be copied or pickled (Allocation.__reduce__) are shared with the other owners. The
 * base is passed in from Python (define_type, called once by owner.py) rather than imported
 * here, so this module imports nothing of the package.
 *
 * Freeing: the deallocation runs in tp_finalize, which both a plain decref (through
 * PyObject_CallFinalizerFromDealloc) and the cyclic collector call exactly once per object and
 * always before tp_clear, so a cycle that runs through the resource frees the block too. The
 * owner drops its reference to the resource before calling deallocate, so no path can free a
 * block twice; an exception from deallocate is reported as unraisable ("Exception ignored in"),
 * like an exception from __del__, and an exception pending in the caller is kept.
 *
 * Owners are made only by owner(resource, address, nbytes) (METH_FASTCALL, one C call from the
 * compiled empty()); calling the type raises TypeError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_native_block.h"

typedef struct {
    PyObject_HEAD
    PyObject *resource; /* NULL once the block has been given back */
    /* The ints the owner was made with, passed back to deallocate as they are: making two new
       ints at every free would cost more than the rest of the call's set-up. */
    PyObject *address_int;
    PyObject *nbytes_int;
    Py_ssize_t address;
    Py_ssize_t nbytes;
    PyObject *weakreflist;
} BlockOwner;

/* The type, made once by define_type; a strong reference for the life of the process. */
static PyTypeObject *owner_type = NULL;

static void
owner_finalize(PyObject *self)
{
    BlockOwner *owner = (BlockOwner *)self;
    PyObject *resource = owner->resource;
    if (resource == NULL)
        return; /* already given back */
    /* Dropped before the call: nothing (a resurrection, a second finalize) can free it again. */
    owner->resource = NULL;
    give_back(resource, owner->address_int, owner->nbytes_int, self);
}

static int
owner_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(((BlockOwner *)self)->resource);
    Py_VISIT(Py_TYPE(self)); /* instances of a heap type own a reference to it */
    return 0;
}

static int
owner_clear(PyObject *self)
{
    /* The collector finalizes (frees the block, drops the resource) before it clears. */
    Py_CLEAR(((BlockOwner *)self)->resource);
    return 0;
}

static void
owner_dealloc(PyObject *self)
{
    if (PyObject_CallFinalizerFromDealloc(self) < 0)
        return; /* resurrected by deallocate */
    PyObject_GC_UnTrack(self);
    BlockOwner *owner = (BlockOwner *)self;
    if (owner->weakreflist != NULL)
        PyObject_ClearWeakRefs(self);
    Py_CLEAR(owner->resource);
    Py_CLEAR(owner->address_int);
    Py_CLEAR(owner->nbytes_int);
    PyTypeObject *type = Py_TYPE(self);
    type->tp_free(self);
    Py_DECREF(type);
}

/* --- the buffer: exactly the block ----------------------------------------------------------- */

static int
owner_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    BlockOwner *owner = (BlockOwner *)self;
    if (owner->resource == NULL) {
        /* Only a resurrected owner gets here: its bytes are no longer its own. */
        PyErr_SetString(PyExc_BufferError, "the owner's block was already given back");
        view->obj = NULL;
        return -1;
    }
    return PyBuffer_FillInfo(view, self, (void *)owner->address, owner->nbytes, 0, flags);
}

/* --- the type -------------------------------------------------------------------------------- */

static PyMemberDef owner_members[] = {
    {"address", T_OBJECT_EX, offsetof(BlockOwner, address_int), READONLY,
     "The block's first byte."},
    {"nbytes", T_OBJECT_EX, offsetof(BlockOwner, nbytes_int), READONLY,
     "The block's size in bytes."},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(BlockOwner, weakreflist), READONLY, NULL},
    {NULL},
};

static PyObject *
owner_get_resource(PyObject *self, void *Py_UNUSED(closure))
{
    PyObject *resource = ((BlockOwner *)self)->resource;
    if (resource == NULL) {
        PyErr_SetString(PyExc_AttributeError, "the owner's block was already given back");
        return NULL;
    }
    Py_INCREF(resource);
    return resource;
}

static PyGetSetDef owner_getset[] = {
    {"resource", owner_get_resource, NULL, "The resource the block goes back to.", NULL},
    {NULL},
};

static PyType_Slot owner_slots[] = {
    {Py_tp_doc, "A block of a resource, exported as a writable buffer of exactly its bytes and "
                "deallocated when the last array over it dies (made by owner())."},
    {Py_tp_dealloc, owner_dealloc},
    {Py_tp_finalize, owner_finalize},
    {Py_tp_traverse, owner_traverse},
    {Py_tp_clear, owner_clear},
    {Py_tp_free, PyObject_GC_Del},
    {Py_tp_members, owner_members},
    {Py_tp_getset, owner_getset},
    {Py_bf_getbuffer, owner_getbuffer},
    {0, NULL},
};

static PyType_Spec owner_spec = {
    .name = "tensorarena.interop._native_owner.NativeAllocation",
    .basicsize = sizeof(BlockOwner),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION
             | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = owner_slots,
};

/* --- module functions ------------------------------------------------------------------------ */

static PyObject *
define_type(PyObject *Py_UNUSED(module), PyObject *base)
{
    if (owner_type != NULL) {
        PyObject *bases = owner_type->tp_bases;
        if (PyTuple_GET_SIZE(bases) == 1 && PyTuple_GET_ITEM(bases, 0) == base) {
            Py_INCREF(owner_type);
            return (PyObject *)owner_type;
        }
        PyErr_SetString(PyExc_RuntimeError, "the native owner type is already defined");
        return NULL;
    }
    if (!PyType_Check(base)) {
        PyErr_Format(PyExc_TypeError, "define_type() needs a class, not %.100s",
                     Py_TYPE(base)->tp_name);
        return NULL;
    }
    if (((PyTypeObject *)base)->tp_basicsize != sizeof(PyObject)
        || ((PyTypeObject *)base)->tp_itemsize != 0) {
        PyErr_SetString(PyExc_TypeError, "define_type() needs a base without instance fields "
                                         "(__slots__ = ())");
        return NULL;
    }
    PyObject *type = PyType_FromSpecWithBases(&owner_spec, base);
    if (type == NULL)
        return NULL;
    owner_type = (PyTypeObject *)type;
    Py_INCREF(type); /* one for the static, one for the caller */
    return type;
}

static PyObject *
new_owner(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError,
                     "owner(resource, address, nbytes) takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    if (owner_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "owner(): define_type() was not called (import tensorarena.interop.owner)");
        return NULL;
    }
    Py_ssize_t address, nbytes;
    if (read_block(args[1], args[2], "owner", &address, &nbytes) < 0)
        return NULL;
    BlockOwner *owner = PyObject_GC_New(BlockOwner, owner_type);
    if (owner == NULL)
        return NULL;
    Py_INCREF(args[0]);
    owner->resource = args[0];
    Py_INCREF(args[1]);
    owner->address_int = args[1];
    Py_INCREF(args[2]);
    owner->nbytes_int = args[2];
    owner->address = address;
    owner->nbytes = nbytes;
    owner->weakreflist = NULL;
    PyObject_GC_Track(owner);
    return (PyObject *)owner;
}

static PyMethodDef module_methods[] = {
    {"define_type", define_type, METH_O,
     "define_type(base) -> type\n--\n\nMake the owner type as a subclass of base (once)."},
    {"owner", (PyCFunction)(void (*)(void))new_owner, METH_FASTCALL,
     "owner(resource, address, nbytes)\n--\n\n"
     "The owner of nbytes bytes at address from resource: a writable buffer of exactly those "
     "bytes, which calls resource.deallocate(address, nbytes) once when it dies."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tensorarena.interop._native_owner",
    .m_doc = "The native block owner of tensorarena's arrays (see tensorarena.interop.owner).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__native_owner(void)
{
    if (intern_deallocate_name() < 0)
        return NULL;
    return PyModule_Create(&module_def);
}
