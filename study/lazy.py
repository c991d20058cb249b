"""Lazy package faces: a stage package names its entry points without importing them.

`study --help`, spec parsing and the report must not pay for torch and transformers, yet each stage
package should say on its face what it offers (`from study.pretrain import train_run`). A package's
`__init__` therefore maps names to the modules that define them, and PEP 562's module `__getattr__`
imports a module on first use of one of its names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def exports(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` that resolves each name in `names` from its module, on first use."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
