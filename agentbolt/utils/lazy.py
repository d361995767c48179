"""Names a package imports from its modules only on first access (PEP 562), so importing the package stays cheap."""

from __future__ import annotations

import importlib
import sys
from functools import cached_property
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence, Tuple

__all__ = ["LazyExports"]

Locations = Dict[str, Tuple[str, str]]


class LazyExports:
    """The table of a package's lazily imported names, behind its module-level ``__getattr__`` and ``__dir__``.

    A loaded value is bound in the package's namespace, so later accesses do not come back here.

    Args:
        package: The package's ``__name__``.
        modules: Module name -> the names it provides, exported under the same names; or the path of a type stub whose
            explicit re-exports (``from module import Name as Name``) are the table. A stub is read on first use, so
            importing the package does not parse it; its other lines (such as ``__version__: str``) export nothing.
    """

    def __init__(self, package: str, modules: Mapping[str, Sequence[str]] | Path) -> None:
        self.package = package
        self._modules = modules

    @cached_property
    def locations(self) -> Locations:
        """Exported name -> (module, attribute in that module)."""
        if isinstance(self._modules, Path):
            return _stub_reexports(self._modules)
        return {name: (module, name) for module, names in self._modules.items() for name in names}

    def names(self) -> List[str]:
        """The exported names, in table order."""
        return list(self.locations)

    def load(self, name: str) -> Any:
        """Import ``name`` from its module and bind it in the package.

        Raises:
            AttributeError: ``name`` is not in the table (the message a missing module attribute gets).
        """
        try:
            module, attribute = self.locations[name]
        except KeyError:
            raise AttributeError(f"module {self.package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module), attribute)
        setattr(sys.modules[self.package], name, value)
        return value

    def dir(self) -> List[str]:
        """The package's ``dir()``: what it holds now plus every name it can load."""
        return sorted(set(vars(sys.modules[self.package])) | set(self.locations))


def _stub_reexports(stub: Path) -> Locations:
    """Name -> (module, attribute) for each ``from module import Name as Name`` at the top level of a stub."""
    import ast  # only when a name is first looked up: parsing is not part of importing the package

    tree = ast.parse(stub.read_text(encoding="utf-8"), filename=str(stub))
    return {
        alias.name: (node.module, alias.name)
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module is not None
        for alias in node.names
        if alias.asname == alias.name
    }
