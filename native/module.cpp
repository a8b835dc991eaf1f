// The smallest CPython extension module: it exists so setuptools builds native/*.cpp into
// dlcomm/_native*.so like any extension; dlcomm/native.py loads that file with ctypes and calls
// the C ABI declared in dlcomm_native.h (no Python objects cross it, so no pybind11 needed).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "_native",
    "dlcomm's native kernels; use dlcomm.kernels (ctypes) instead of this module.", -1,
    nullptr, nullptr, nullptr, nullptr, nullptr};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&native_module); }
