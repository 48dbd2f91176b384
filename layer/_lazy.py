"""Package exports that import their module on first use (PEP 562).

A package ``__init__`` that imports every name it exports makes ``import layer.x`` pay for all of
them: the client would load the coordinator's server, the CLI's ``--help`` the Avro codec and the
expression parser. A package lists its exports by module instead, imports them under
``TYPE_CHECKING`` for type checkers, and takes the two module hooks from here::

    __getattr__, __dir__ = lazy_exports(__name__, {"layer.client": ("QueueClient",)})
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, Iterable[str]]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: each name of ``exports`` (module ->
    names) is imported from its module when first read, then kept in the package's namespace."""
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> object:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return __getattr__, __dir__
