/*
 * empty()'s compiled entry: the calls that model code repeats, empty(n, dtype) and
 * empty(n, dtype, like="torch") with an int n, a plain NumPy dtype (or, for torch, one routed
 * through DLPack), the default resource, the default alignment and no scope, made here in C;
 * every other call is handed to the Python empty() as it came.
 *
 * Why: in a loop that also runs torch (the `bench reuse` cycle: make, touch, free) torch's code
 * evicts ours from the instruction cache between iterations, so what an empty() costs there is
 * mostly the cache lines its code spans. The compiled Python empty() spans ~80 of them (its
 * keyword parsing, the branches of every case it handles), this path ~20: callgrind's cache
 * simulation counts the misses (bench/RESULTS.md). What it does is what the Python empty() does
 * on those paths, in the same order: resource.allocate(nbytes, alignment) through the method
 * lookup (so an instance's patched allocate is called), then the capsule of _native_capsule.h
 * and the route's from_dlpack (torch), or the native owner and np.frombuffer (NumPy); a failure
 * gives the block back, as there.
 *
 * The last dtype argument of each kind is kept here (by the identity of the argument), read once
 * from tensorarena.interop._torch_route.ROUTES or arrays.DTYPES, which the Python empty() fills.
 */
#include "_native_capsule.h"

#include <stddef.h>

/* Interned once by the module's init. */
static PyObject *like_name, *dtype_name, *torch_name, *numpy_name, *default_name;
static PyObject *allocate_name;
static PyObject *dlpack_dtype_name, *from_dlpack_name, *entry_name;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;        /* __dict__: functools.update_wrapper's __doc__, __wrapped__, ... */
    PyObject *weakrefs;
    PyObject *general;     /* the Python empty(): every call this path does not take */
    PyObject *routes;      /* dtype argument -> TorchRoute */
    PyObject *scope_var;   /* the ContextVar of the current scope */
    PyObject *defaults;    /* the namespace whose "_default" is the default resource */
    PyObject *alignment;   /* the default alignment (the int object) */
    Py_ssize_t max_size;   /* the largest request */
    /* The route of the last dtype argument: from_dlpack NULL where it is not DLPack. */
    PyObject *dtype;
    PyObject *from_dlpack;
    DLDataType dl_dtype;
    Py_ssize_t itemsize;
    /* The last request's int object: a repeated size allocates none. */
    PyObject *request;
    /* NumPy arrays (all NULL: every NumPy call is the Python empty()'s). */
    PyObject *dtypes;        /* dtype argument -> empty's dtype entry */
    PyObject *owner;         /* the native owner: owner(resource, address, nbytes) */
    PyObject *frombuffer;    /* np.frombuffer */
    PyObject *default_dtype; /* empty's default dtype argument */
    /* The last NumPy dtype argument: np_dtype NULL where it is not a plain dtype. */
    PyObject *np_key;
    PyObject *np_dtype;
    Py_ssize_t np_itemsize;
} FastEmpty;

enum { GENERAL, TORCH, NUMPY };

static void
forget_route(FastEmpty *self)
{
    Py_CLEAR(self->dtype);
    Py_CLEAR(self->from_dlpack);
    self->itemsize = 0;
    Py_CLEAR(self->np_key);
    Py_CLEAR(self->np_dtype);
    self->np_itemsize = 0;
}

/* A route's DLPack parts: 1 where it is a DLPack route (its code's items are its entry's),
   with *from_dlpack a new reference; 0 for another route. Never raises: a route that cannot be
   read is the Python empty()'s to handle. */
static int
read_route(PyObject *route, PyObject **from_dlpack, DLDataType *dtype, Py_ssize_t *itemsize)
{
    PyObject *entry = PyObject_GetAttr(route, entry_name);
    PyObject *code = entry == NULL ? NULL : PyObject_GetAttr(route, dlpack_dtype_name);
    *from_dlpack = code == NULL ? NULL : PyObject_GetAttr(route, from_dlpack_name);
    *itemsize = -1;
    if (*from_dlpack != NULL && PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) > 0)
        *itemsize = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 0));
    int routed = *itemsize > 0 && code != Py_None && read_dtype(code, dtype) == 0
                 && dtype->bits == 8 * *itemsize;
    PyErr_Clear();
    Py_XDECREF(entry);
    Py_XDECREF(code);
    if (!routed)
        Py_CLEAR(*from_dlpack);
    return routed;
}

/* Reads dtype's route from ROUTES into the memo: 1 if it is a DLPack route, 0 if it is another
   route or none is known yet (the Python empty() works it out), -1 on an error. */
static int
remember_route(FastEmpty *self, PyObject *dtype)
{
    PyObject *route = PyDict_GetItemWithError(self->routes, dtype); /* borrowed */
    if (route == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError))
            PyErr_Clear(); /* unhashable: the Python empty() refuses or resolves it */
        return PyErr_Occurred() ? -1 : 0;
    }
    Py_INCREF(route);
    PyObject *from_dlpack;
    DLDataType dl_dtype = {0, 0, 0};
    Py_ssize_t itemsize;
    int routed = read_route(route, &from_dlpack, &dl_dtype, &itemsize);
    Py_DECREF(route);
    /* Every field set before the old references go (their deaths may run Python that calls
       this entry again: it must find a consistent memo). Another route is remembered as
       such: the Python empty()'s. */
    PyObject *old_dtype = self->dtype, *old_from_dlpack = self->from_dlpack;
    Py_INCREF(dtype);
    self->dtype = dtype;
    self->from_dlpack = routed ? from_dlpack : NULL;
    self->dl_dtype = dl_dtype;
    self->itemsize = routed ? itemsize : 0;
    Py_XDECREF(old_dtype);
    Py_XDECREF(old_from_dlpack);
    return routed;
}

/* Reads dtype's entry from empty's dtype table into the NumPy memo: 1 for a plain NumPy dtype
   (not structured, not a torch dtype), 0 for another or none known yet, -1 on an error. */
static int
remember_numpy(FastEmpty *self, PyObject *dtype)
{
    PyObject *entry = PyDict_GetItemWithError(self->dtypes, dtype); /* borrowed */
    if (entry == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError))
            PyErr_Clear(); /* unhashable: the Python empty() resolves or refuses it */
        return PyErr_Occurred() ? -1 : 0;
    }
    /* (itemsize, typestr, structured, torch dtype, NumPy dtype) */
    Py_ssize_t itemsize = -1;
    if (PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == 5
        && PyLong_CheckExact(PyTuple_GET_ITEM(entry, 0))) {
        itemsize = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 0));
        PyErr_Clear();
    }
    int plain = itemsize > 0 && PyTuple_GET_ITEM(entry, 2) == Py_None
                && PyTuple_GET_ITEM(entry, 3) == Py_None;
    PyObject *np_dtype = plain ? PyTuple_GET_ITEM(entry, 4) : NULL;
    /* Every field set before the old references go (see remember_route). */
    PyObject *old_key = self->np_key, *old_dtype = self->np_dtype;
    Py_INCREF(dtype);
    Py_XINCREF(np_dtype);
    self->np_key = dtype;
    self->np_dtype = np_dtype;
    self->np_itemsize = plain ? itemsize : 0;
    Py_XDECREF(old_key);
    Py_XDECREF(old_dtype);
    return plain;
}

/* The arguments of the paths: shape positional, dtype positional or by name, like by name,
   nothing else; GENERAL, TORCH or NUMPY. Names and "torch"/"numpy" are found by identity (the
   compiler interns them). */
static int
read_arguments(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **dtype)
{
    PyObject *like = NULL;
    if (nargs == 2)
        *dtype = args[1];
    else if (nargs != 1)
        return GENERAL;
    Py_ssize_t count = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (name == like_name)
            like = args[nargs + i];
        else if (name == dtype_name && *dtype == NULL)
            *dtype = args[nargs + i];
        else
            return GENERAL;
    }
    return like == torch_name ? TORCH : like == NULL || like == numpy_name ? NUMPY : GENERAL;
}

/* Whether this thread/task is inside a scope (its arrays are tracked: the Python path). */
static int
in_scope(FastEmpty *self)
{
    PyObject *scope;
    if (PyContextVar_Get(self->scope_var, NULL, &scope) < 0)
        return -1;
    int inside = scope != NULL && scope != Py_None;
    Py_XDECREF(scope);
    return inside;
}

/* The block, the capsule over it and the tensor; the route's parts held by the caller (a
   resource's allocate may run Python that changes the memo). */
static PyObject *
make_tensor(PyObject *resource, Py_ssize_t count, PyObject *request, PyObject *alignment,
            DLDataType dtype, PyObject *from_dlpack)
{
    PyObject *call[3] = {resource, request, alignment};
    PyObject *address =
        PyObject_VectorcallMethod(allocate_name, call, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (address == NULL)
        return NULL;
    Py_ssize_t start, size;
    int64_t dims[1] = {count};
    PyObject *capsule = read_block(address, request, "dlpack", &start, &size) < 0
                            ? NULL
                            : build_capsule(resource, address, request, start, dims, 1, dtype);
    if (capsule == NULL) { /* a bad address from the resource: the block goes back all the same */
        Py_INCREF(resource);
        give_back(resource, address, request, resource);
    }
    Py_DECREF(address);
    if (capsule == NULL)
        return NULL;
    /* If this raises, the dying capsule gives the block back. */
    PyObject *tensor = PyObject_Vectorcall(from_dlpack, &capsule, 1, NULL);
    Py_DECREF(capsule);
    return tensor;
}

/* The block, its native owner and the 1-d array over it (as the Python empty() makes it). */
static PyObject *
make_array(FastEmpty *self, PyObject *resource, PyObject *request, PyObject *np_dtype)
{
    PyObject *call[3] = {resource, request, self->alignment};
    PyObject *address =
        PyObject_VectorcallMethod(allocate_name, call, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (address == NULL)
        return NULL;
    PyObject *block[3] = {resource, address, request};
    PyObject *owner = PyObject_Vectorcall(self->owner, block, 3, NULL);
    if (owner == NULL) { /* a bad address from the resource: the block goes back all the same */
        Py_INCREF(resource);
        give_back(resource, address, request, resource);
    }
    Py_DECREF(address);
    if (owner == NULL)
        return NULL;
    /* From here the owner gives the block back when it dies, if this raises too. */
    PyObject *buffer[2] = {owner, np_dtype};
    PyObject *array = PyObject_Vectorcall(self->frombuffer, buffer, 2, NULL);
    Py_DECREF(owner);
    return array;
}

static PyObject *
fast_empty_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    FastEmpty *self = (FastEmpty *)callable;
    PyObject *dtype = NULL;
    int kind = read_arguments(args, PyVectorcall_NARGS(nargsf), kwnames, &dtype);
    if (dtype == NULL)
        dtype = self->default_dtype;
    if (kind == GENERAL || dtype == NULL)
        goto general;
    Py_ssize_t itemsize;
    if (kind == TORCH) {
        if (dtype != self->dtype) {
            int routed = remember_route(self, dtype);
            if (routed < 0)
                return NULL;
            if (routed == 0)
                goto general;
        }
        else if (self->from_dlpack == NULL)
            goto general;
        itemsize = self->itemsize;
    }
    else {
        if (self->dtypes == NULL)
            goto general;
        if (dtype != self->np_key) {
            int plain = remember_numpy(self, dtype);
            if (plain < 0)
                return NULL;
            if (plain == 0)
                goto general;
        }
        else if (self->np_dtype == NULL)
            goto general;
        itemsize = self->np_itemsize;
    }
    PyObject *shape = args[0];
    if (!PyLong_CheckExact(shape))
        goto general;
    Py_ssize_t count = PyLong_AsSsize_t(shape);
    if (count == -1 && PyErr_Occurred()) {
        PyErr_Clear(); /* too large: the Python empty() says so */
        goto general;
    }
    if (count <= 0 || count > self->max_size / itemsize)
        goto general; /* zero items, or a bad size: the Python empty() */
    int inside = in_scope(self);
    if (inside < 0)
        return NULL;
    if (inside)
        goto general;
    PyObject *resource = PyDict_GetItemWithError(self->defaults, default_name); /* borrowed */
    if (resource == NULL && PyErr_Occurred())
        return NULL;
    if (resource == NULL || resource == Py_None)
        goto general; /* not made yet: the Python empty() makes it */
    Py_ssize_t nbytes = count * itemsize;
    PyObject *request = self->request;
    if (request == NULL || PyLong_AsSsize_t(request) != nbytes) {
        request = PyLong_FromSsize_t(nbytes);
        if (request == NULL)
            return NULL;
        Py_XSETREF(self->request, request);
    }
    /* Held: allocate may run Python that calls this entry again and changes the memos. */
    PyObject *held[3] = {resource, request, kind == TORCH ? self->from_dlpack : self->np_dtype};
    for (int i = 0; i < 3; i++)
        Py_INCREF(held[i]);
    PyObject *made = kind == TORCH ? make_tensor(resource, count, request, self->alignment,
                                                 self->dl_dtype, held[2])
                                   : make_array(self, resource, request, held[2]);
    for (int i = 0; i < 3; i++)
        Py_DECREF(held[i]);
    return made;
general:
    return PyObject_Vectorcall(self->general, args, nargsf, kwnames);
}

/* --- the type ------------------------------------------------------------------------------ */

static PyObject *
fast_empty_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *general, *routes, *scope_var, *defaults, *alignment;
    PyObject *dtypes = Py_None, *owner = Py_None, *frombuffer = Py_None, *default_dtype = Py_None;
    Py_ssize_t max_size;
    static char *names[] = {"general", "routes", "scope_var", "defaults", "alignment",
                            "max_size", "dtypes", "owner", "frombuffer", "default_dtype", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!OO!O!n|$OOOO:FastEmpty", names, &general,
                                     &PyDict_Type, &routes, &scope_var, &PyDict_Type, &defaults,
                                     &PyLong_Type, &alignment, &max_size, &dtypes, &owner,
                                     &frombuffer, &default_dtype))
        return NULL;
    int numpy = dtypes != Py_None;
    if (!PyCallable_Check(general) || !PyContextVar_CheckExact(scope_var) || max_size <= 0
        || (numpy && (!PyDict_Check(dtypes) || !PyCallable_Check(owner)
                      || !PyCallable_Check(frombuffer)))) {
        PyErr_SetString(PyExc_TypeError,
                        "FastEmpty(general, routes, scope_var, defaults, alignment, max_size, *, "
                        "dtypes=None, owner=None, frombuffer=None, default_dtype=None): general "
                        "must be callable, scope_var a ContextVar, max_size positive; with dtypes "
                        "(a dict), owner and frombuffer must be callable");
        return NULL;
    }
    FastEmpty *self = (FastEmpty *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = fast_empty_call;
    PyObject **fields[] = {&self->general, &self->routes, &self->scope_var, &self->defaults,
                           &self->alignment};
    PyObject *values[] = {general, routes, scope_var, defaults, alignment};
    for (int i = 0; i < 5; i++) {
        Py_INCREF(values[i]);
        *fields[i] = values[i];
    }
    self->max_size = max_size;
    if (numpy) {
        PyObject **numpy_fields[] = {&self->dtypes, &self->owner, &self->frombuffer};
        PyObject *numpy_values[] = {dtypes, owner, frombuffer};
        for (int i = 0; i < 3; i++) {
            Py_INCREF(numpy_values[i]);
            *numpy_fields[i] = numpy_values[i];
        }
    }
    if (default_dtype != Py_None) {
        Py_INCREF(default_dtype);
        self->default_dtype = default_dtype;
    }
    return (PyObject *)self;
}

static int
fast_empty_traverse(FastEmpty *self, visitproc visit, void *arg)
{
    Py_VISIT(self->dict);
    Py_VISIT(self->general);
    Py_VISIT(self->routes);
    Py_VISIT(self->scope_var);
    Py_VISIT(self->defaults);
    Py_VISIT(self->alignment);
    Py_VISIT(self->dtype);
    Py_VISIT(self->from_dlpack);
    Py_VISIT(self->request);
    Py_VISIT(self->dtypes);
    Py_VISIT(self->owner);
    Py_VISIT(self->frombuffer);
    Py_VISIT(self->default_dtype);
    Py_VISIT(self->np_key);
    Py_VISIT(self->np_dtype);
    return 0;
}

static int
fast_empty_clear(FastEmpty *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->general);
    Py_CLEAR(self->routes);
    Py_CLEAR(self->scope_var);
    Py_CLEAR(self->defaults);
    Py_CLEAR(self->alignment);
    Py_CLEAR(self->request);
    Py_CLEAR(self->dtypes);
    Py_CLEAR(self->owner);
    Py_CLEAR(self->frombuffer);
    Py_CLEAR(self->default_dtype);
    forget_route(self);
    return 0;
}

static void
fast_empty_dealloc(FastEmpty *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    fast_empty_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
fast_empty_repr(FastEmpty *self)
{
    return PyUnicode_FromFormat("<compiled entry of %R>", self->general);
}

static PyObject *
fast_empty_forget(FastEmpty *self, PyObject *Py_UNUSED(ignored))
{
    forget_route(self);
    Py_RETURN_NONE;
}

static PyMethodDef fast_empty_methods[] = {
    {"forget", (PyCFunction)fast_empty_forget, METH_NOARGS,
     "forget()\n--\n\nDrop the remembered routes (after the tables were cleared)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef fast_empty_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FastEmptyType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tensorarena.interop._native_empty.FastEmpty",
    .tp_doc = "FastEmpty(general, routes, scope_var, defaults, alignment, max_size, *, "
              "dtypes=None, owner=None, frombuffer=None, default_dtype=None)\n--\n\n"
              "empty()'s compiled entry: calls like empty(n, dtype) and empty(n, dtype, "
              "like=\"torch\") made in C, every other call handed to general.",
    .tp_basicsize = sizeof(FastEmpty),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = fast_empty_new,
    .tp_dealloc = (destructor)fast_empty_dealloc,
    .tp_traverse = (traverseproc)fast_empty_traverse,
    .tp_clear = (inquiry)fast_empty_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FastEmpty, vectorcall),
    .tp_dictoffset = offsetof(FastEmpty, dict),
    .tp_weaklistoffset = offsetof(FastEmpty, weakrefs),
    .tp_repr = (reprfunc)fast_empty_repr,
    .tp_methods = fast_empty_methods,
    .tp_getset = fast_empty_getset,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tensorarena.interop._native_empty",
    .m_doc = "empty()'s compiled entry (see tensorarena.interop._entry).",
    .m_size = -1,
};

static int
intern_names(void)
{
    struct {
        PyObject **name;
        const char *text;
    } names[] = {
        {&like_name, "like"},
        {&dtype_name, "dtype"},
        {&torch_name, "torch"},
        {&numpy_name, "numpy"},
        {&default_name, "_default"},
        {&allocate_name, "allocate"},
        {&dlpack_dtype_name, "dlpack_dtype"},
        {&from_dlpack_name, "from_dlpack"},
        {&entry_name, "entry"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (*names[i].name == NULL && (*names[i].name = PyUnicode_InternFromString(names[i].text))
                                          == NULL)
            return -1;
    return intern_deallocate_name();
}

PyMODINIT_FUNC
PyInit__native_empty(void)
{
    if (intern_names() < 0 || PyType_Ready(&FastEmptyType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    Py_INCREF(&FastEmptyType);
    if (PyModule_AddObject(module, "FastEmpty", (PyObject *)&FastEmptyType) < 0) {
        Py_DECREF(&FastEmptyType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
