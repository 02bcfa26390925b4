/*
 * dlpack_c_example: a C extension whose functions accept any array Python holds (numpy, torch,
 * JAX, Arrow columns, bytes, a DLPackObject...) and hand C-owned memory back as an array every
 * from_dlpack takes, through the dlpack package's C API (dlpack_adapter.h, found by
 * dlpack.get_include()). Plain C11 and CPython's stable ABI (3.11 and later).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "dlpack_adapter.h"

/* DLPack's codes this file needs (dlpack.h's kDLFloat, kDLCPU, kDLCUDAHost, kDLROCMHost). */
enum { DL_FLOAT = 2, DL_CPU = 1, DL_CUDA_HOST = 3, DL_ROCM_HOST = 11 };

/* The runtime's table, found once when the module is imported. */
static const DLPackAdapterAPI *dlpack_api;

/* How many arrays arange made have been released: the runtime calls release_doubles on
   whichever thread lets go last, without the GIL, hence an atomic. */
static atomic_ulong released;

/* The number of elements of a filled view, or -1 with an exception set where more than a
   Py_ssize_t counts (a broadcast view may describe more elements than exist). */
static Py_ssize_t element_count(const DLPackAdapterView *view) {
    Py_ssize_t count = 1;
    for (int32_t i = 0; i < view->ndim; i++) {
        if (view->shape[i] == 0) {
            return 0;
        }
    }
    for (int32_t i = 0; i < view->ndim; i++) {
        if (view->shape[i] > PY_SSIZE_T_MAX / count) {
            PyErr_SetString(PyExc_MemoryError, "this array has more elements than can be counted");
            return -1;
        }
        count *= (Py_ssize_t)view->shape[i];
    }
    return count;
}

/* 0 when the view holds float64 elements in host memory; else -1 with a TypeError or a
   BufferError saying which it isn't. */
static int check_float64_host(const DLPackAdapterView *view) {
    if (view->dtype.code != DL_FLOAT || view->dtype.bits != 64 || view->dtype.lanes != 1) {
        PyErr_Format(PyExc_TypeError,
                     "expected an array of float64, got one of DLPack type code %d, %d bits, "
                     "%d lanes",
                     (int)view->dtype.code, (int)view->dtype.bits, (int)view->dtype.lanes);
        return -1;
    }
    int type = view->device.device_type;
    if (type != DL_CPU && type != DL_CUDA_HOST && type != DL_ROCM_HOST) {
        PyErr_Format(PyExc_BufferError,
                     "this array's memory is on device type %d, which C can't read in place",
                     type);
        return -1;
    }
    return 0;
}

/* The elements are C-contiguous float64s in native byte order at view->data: readable in place
   (else copy_to gives them so). */
static int in_place(const DLPackAdapterView *view) {
    uint32_t layout = DLPACK_ADAPTER_VIEW_C_CONTIGUOUS | DLPACK_ADAPTER_VIEW_SWAPPED
                      | DLPACK_ADAPTER_VIEW_INDIRECT;
    return (view->flags & layout) == DLPACK_ADAPTER_VIEW_C_CONTIGUOUS;
}

/* A buffer for count float64s, once the runtime says this process can have it; NULL with a
   MemoryError otherwise. */
static double *new_doubles(Py_ssize_t count) {
    if ((size_t)count > SIZE_MAX / sizeof(double)) {
        PyErr_NoMemory();
        return NULL;
    }
    if (dlpack_api->check_memory((uint64_t)count * sizeof(double)) != 0) {
        return NULL;
    }
    double *buffer = malloc(count ? (size_t)count * sizeof(double) : 1);
    if (buffer == NULL) {
        PyErr_NoMemory();
    }
    return buffer;
}

PyDoc_STRVAR(total_doc, "total(x) -> float\n\n"
                        "The sum of a float64 array of any layout, read in place when it is "
                        "C-contiguous (a C-ordered copy otherwise).");

/* --8<-- [start:total] */
static PyObject *total(PyObject *self, PyObject *obj) {
    (void)self;
    DLPackAdapterView view;
    DLPACK_ADAPTER_VIEW_INIT(&view);
    if (dlpack_api->view(obj, 0, &view) != 0) {
        return NULL;
    }
    PyObject *result = NULL;
    double *copy = NULL;
    Py_ssize_t count = element_count(&view);
    if (count < 0 || check_float64_host(&view) != 0) {
        goto done;
    }
    const double *values = view.data;
    if (!in_place(&view)) {
        copy = new_doubles(count);
        if (copy == NULL
            || dlpack_api->copy_to(&view, copy, (size_t)count * sizeof(double)) != 0) {
            goto done;
        }
        values = copy;
    }
    double sum = 0.0;
    for (Py_ssize_t i = 0; i < count; i++) {
        sum += values[i];
    }
    result = PyFloat_FromDouble(sum);
done:
    free(copy);
    dlpack_api->release_view(&view);
    return result;
}
/* --8<-- [end:total] */

PyDoc_STRVAR(fill_doc, "fill(y, value) -> None\n\n"
                       "Set every element of a writable float64 array to value, in place, in any "
                       "layout: through a mutable view, which the runtime grants only over the "
                       "object's own writable memory that no other view holds.");

static PyObject *fill(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *obj;
    double value;
    if (!PyArg_ParseTuple(args, "Od:fill", &obj, &value)) {
        return NULL;
    }
    DLPackAdapterView view;
    DLPACK_ADAPTER_VIEW_INIT(&view);
    if (dlpack_api->view(obj, DLPACK_ADAPTER_VIEW_MUTABLE, &view) != 0) {
        return NULL;
    }
    PyObject *result = NULL;
    double *values = NULL;
    Py_ssize_t count = element_count(&view);
    if (count < 0 || check_float64_host(&view) != 0) {
        goto done;
    }
    if (in_place(&view)) {
        double *data = view.data;
        for (Py_ssize_t i = 0; i < count; i++) {
            data[i] = value;
        }
    } else {
        /* any other layout: the values C-ordered, written by the runtime (which refuses a
           broadcast view, whose elements share memory) */
        values = new_doubles(count);
        if (values == NULL) {
            goto done;
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            values[i] = value;
        }
        if (dlpack_api->copy_from(&view, values, (size_t)count * sizeof(double)) != 0) {
            goto done;
        }
    }
    result = Py_NewRef(Py_None);
done:
    free(values);
    dlpack_api->release_view(&view);
    return result;
}

/* --8<-- [start:arange] */
/* The runtime's release callback for arange's memory: once, on any thread, without the GIL. */
static void release_doubles(void *context) {
    free(context);
    atomic_fetch_add(&released, 1);
}

PyDoc_STRVAR(arange_doc, "arange(n) -> DLPackObject\n\n"
                         "0.0, 1.0, ... n - 1 as float64s in memory this extension allocates, "
                         "freed when the last consumer lets go.");

static PyObject *arange(PyObject *self, PyObject *arg) {
    (void)self;
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (n < 0) {
        PyErr_Format(PyExc_ValueError, "arange(n) takes n >= 0, not %zd", n);
        return NULL;
    }
    double *data = new_doubles(n);
    if (data == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        data[i] = (double)i;
    }
    int64_t shape[1] = {(int64_t)n};
    DLPackAdapterMemory memory;
    DLPACK_ADAPTER_MEMORY_INIT(&memory);
    memory.data = data;
    memory.dtype.code = DL_FLOAT;
    memory.dtype.bits = 64;
    memory.dtype.lanes = 1;
    memory.ndim = 1;
    memory.shape = shape; /* read during the call: the object keeps its own copy */
    memory.byte_strides = NULL; /* C order */
    memory.release = release_doubles;
    memory.context = data;
    PyObject *obj = dlpack_api->from_memory(&memory);
    if (obj == NULL) {
        free(data); /* refused: release is never called, the memory is still ours */
    }
    return obj;
}
/* --8<-- [end:arange] */

PyDoc_STRVAR(releases_doc, "releases() -> int\n\n"
                           "How many arrays arange made have been released so far.");

static PyObject *releases(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyLong_FromUnsignedLong(atomic_load(&released));
}

PyDoc_STRVAR(import_api_doc, "import_api(feature_version) -> int\n\n"
                             "dlpack_adapter_import(feature_version): the runtime's feature "
                             "level, or the ImportError naming both sides.");

static PyObject *import_api(PyObject *self, PyObject *arg) {
    (void)self;
    unsigned long level = PyLong_AsUnsignedLong(arg);
    if (level == (unsigned long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    if (level > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "a feature level is a uint32_t");
        return NULL;
    }
    const DLPackAdapterAPI *api = dlpack_adapter_import((uint32_t)level);
    if (api == NULL) {
        return NULL;
    }
    return PyLong_FromUnsignedLong(api->feature_version);
}

static PyMethodDef methods[] = {
    {"total", total, METH_O, total_doc},
    {"fill", fill, METH_VARARGS, fill_doc},
    {"arange", arange, METH_O, arange_doc},
    {"releases", releases, METH_NOARGS, releases_doc},
    {"import_api", import_api, METH_O, import_api_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "dlpack_c_example",
    .m_doc = "An example C extension on dlpack's C API.",
    .m_size = -1,
    .m_methods = methods,
};

/* --8<-- [start:init] */
PyMODINIT_FUNC PyInit_dlpack_c_example(void) {
    /* Feature level 1: every function this file calls is of level 1. */
    dlpack_api = dlpack_adapter_import(1);
    if (dlpack_api == NULL) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    /* the level of the header this was built against, for the tests */
    if (PyModule_AddIntConstant(m, "FEATURE_VERSION", DLPACK_ADAPTER_FEATURE_VERSION) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
/* --8<-- [end:init] */
