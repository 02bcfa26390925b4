"""The C extension: plain C against the dlpack package's header, on CPython's stable ABI (one
wheel for every CPython from 3.11)."""

import os

from setuptools import Extension, setup

import dlpack

setup(
    ext_modules=[
        Extension(
            "dlpack_c_example",
            ["dlpack_c_example.c"],
            include_dirs=[dlpack.get_include()],
            depends=[os.path.join(dlpack.get_include(), "dlpack_adapter.h")],
            define_macros=[("Py_LIMITED_API", "0x030B0000")],
            extra_compile_args=["-std=c11", "-Wall", "-Wextra"],
            py_limited_api=True,
        )
    ],
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
