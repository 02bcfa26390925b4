"""griffe extensions for the docs build (mkdocs.yml loads them; nothing in the package uses them).

- ``RstRoles``: the docstrings name other objects with Sphinx roles (``:func:`share```), which
  Markdown would print as they are; this shows them as code.
- ``JaxModuleClass``: ``dlpack.interop.JaxModule`` subclasses ``torch.nn.Module``, so the package
  defines it inside a function that runs on first use (importing ``dlpack.interop`` doesn't import
  torch); griffe reads source without running it and so never sees the class. This reads the
  class's source out of that function and adds it to ``dlpack.interop``, docstrings and all.
"""

from __future__ import annotations

import ast
import re
import textwrap
from typing import Any

import griffe

_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj):`~?([^`]+)`")


class RstRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(r"`\1`", obj.docstring.value)


class JaxModuleClass(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.path != "dlpack":
            return
        interop = pkg.members["interop"]
        modules = interop.members["_modules"]
        source = modules.filepath.read_text()
        # The class is defined inside the function that makes it (it needs torch imported).
        node = next(
            inner
            for factory in ast.parse(source).body
            if isinstance(factory, ast.FunctionDef)
            for inner in factory.body
            if isinstance(inner, ast.ClassDef) and inner.name == "JaxModule"
        )
        code = textwrap.dedent(ast.get_source_segment(source, node, padded=True))
        module = griffe.visit(
            "_jax_module", filepath=modules.filepath, code=code, extensions=griffe.Extensions()
        )
        cls = module.members["JaxModule"]
        interop.set_member("JaxModule", cls)
        for extension in (RstRoles(),):
            for obj in (cls, *cls.members.values()):
                extension.on_instance(obj=obj)
