/*
 * A DLPack capsule over a block: tensorarena.empty(..., like="torch")'s route into torch.
 *
 * dlpack(resource, address, nbytes, shape, dtype) makes a "dltensor" capsule (DLPack's C ABI,
 * unversioned, which every consumer takes) of a C-contiguous CPU tensor of shape over the block,
 * and takes the block over: no owner object, the capsule's managed tensor carries the block and
 * gives it back with one resource.deallocate(address, nbytes) when the consumer's tensor dies,
 * or when the capsule dies unconsumed. torch._C._from_dlpack makes the tensor in C, without
 * torch.frombuffer's argument parser (see tensorarena.interop._torch_route for why and the
 * numbers). Shapes whose bytes exceed the block are refused: no tensor may reach past it. The
 * capsule itself is made in _native_capsule.h, which empty()'s compiled entry shares.
 */
#include "_native_capsule.h"

/* dlpack(resource, address, nbytes, shape, dtype): make_capsule's Python face. */
static PyObject *
new_dlpack(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError,
                     "dlpack(resource, address, nbytes, shape, dtype) takes 5 arguments "
                     "(%zd given)", nargs);
        return NULL;
    }
    return make_capsule(args[0], args[1], args[2], args[3], args[4]);
}

static PyMethodDef module_methods[] = {
    {"dlpack", (PyCFunction)(void (*)(void))new_dlpack, METH_FASTCALL,
     "dlpack(resource, address, nbytes, shape, dtype)\n--\n\n"
     "A DLPack \"dltensor\" capsule of a C-contiguous CPU tensor of shape (an int or a tuple) "
     "and DLPack dtype (code | bits << 8) over the block, which it takes over: "
     "resource.deallocate(address, nbytes) runs once when the tensor, or the unconsumed "
     "capsule, dies."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tensorarena.interop._native_dlpack",
    .m_doc = "DLPack capsules over tensorarena's blocks (see tensorarena.interop._torch_route).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__native_dlpack(void)
{
    if (intern_deallocate_name() < 0)
        return NULL;
    return PyModule_Create(&module_def);
}
