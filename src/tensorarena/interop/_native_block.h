/*
 * What the native owner (_native_owner.c) and the DLPack capsule (_native_dlpack.c) share: a
 * block is (resource, address, nbytes), checked the same way on the way in and given back with
 * one resource.deallocate(address, nbytes) on the way out. Static: each module has its copy.
 */
#ifndef TENSORARENA_NATIVE_BLOCK_H
#define TENSORARENA_NATIVE_BLOCK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* "deallocate", interned once by the module's init (intern_deallocate_name). */
static PyObject *deallocate_name = NULL;

static int
intern_deallocate_name(void)
{
    if (deallocate_name == NULL)
        deallocate_name = PyUnicode_InternFromString("deallocate");
    return deallocate_name == NULL ? -1 : 0;
}

/* --- the block's way back ------------------------------------------------------------------ */

/* resource.deallocate(address, nbytes), once; takes over the reference to resource. An error
   is reported as unraisable against context (as one from __del__ is) and an exception pending in
   the caller is kept. */
static void
give_back(PyObject *resource, PyObject *address, PyObject *nbytes, PyObject *context)
{
    PyObject *error_type, *error_value, *error_traceback;
    PyErr_Fetch(&error_type, &error_value, &error_traceback);
    PyObject *args[3] = {resource, address, nbytes};
    PyObject *result = PyObject_VectorcallMethod(
        deallocate_name, args, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (result == NULL)
        PyErr_WriteUnraisable(context);
    Py_XDECREF(result);
    Py_DECREF(resource);
    PyErr_Restore(error_type, error_value, error_traceback);
}

/* --- the block's way in -------------------------------------------------------------------- */

static int
check_int(PyObject *value, const char *function, const char *name, Py_ssize_t *out)
{
    if (!PyLong_CheckExact(value)) {
        PyErr_Format(PyExc_TypeError, "%s(): %s must be an int, not %.100s", function, name,
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    Py_ssize_t number = PyLong_AsSsize_t(value);
    if (number == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        number = -1; /* too large either way: reported as out of range below */
    }
    if (number <= 0) {
        PyErr_Format(PyExc_ValueError, "%s(): %s must be positive and below 2**63, not %R",
                     function, name, value);
        return -1;
    }
    *out = number;
    return 0;
}

/* The block's address and size: positive ints, the block within the address space. */
static int
read_block(PyObject *address_int, PyObject *nbytes_int, const char *function, Py_ssize_t *address,
           Py_ssize_t *nbytes)
{
    if (check_int(address_int, function, "address", address) < 0
        || check_int(nbytes_int, function, "nbytes", nbytes) < 0)
        return -1;
    if (*nbytes > PY_SSIZE_T_MAX - *address) {
        PyErr_Format(PyExc_ValueError, "%s(): a block of %zd bytes at %p runs past the address "
                     "space", function, *nbytes, (void *)*address);
        return -1;
    }
    return 0;
}

#endif /* TENSORARENA_NATIVE_BLOCK_H */
