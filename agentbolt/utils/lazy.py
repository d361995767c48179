"""Names a package imports from its modules only on first access (PEP 562), so importing the package stays cheap."""

from __future__ import annotations

import importlib
import sys
from typing import Any, Dict, List, Mapping, Sequence, Tuple

__all__ = ["LazyExports"]


class LazyExports:
    """The table of a package's lazily imported names, behind its module-level ``__getattr__`` and ``__dir__``.

    A loaded value is bound in the package's namespace, so later accesses do not come back here.

    Args:
        package: The package's ``__name__``.
        modules: Module name -> the names it provides, exported under the same names.
    """

    def __init__(
        self,
        package: str,
        modules: Mapping[str, Sequence[str]],
    ) -> None:
        self.package = package
        self.locations: Dict[str, Tuple[str, str]] = {
            name: (module, name) for module, names in modules.items() for name in names
        }

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
