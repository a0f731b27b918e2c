"""Lets PyPI's torchvision import beside CPU torch (``docs/cpu-runtime.md``)."""

from __future__ import annotations

import importlib.abc
import sys

_TARGET = "torchvision._meta_registrations"
# Schemas as torchvision's own csrc/ops/nms.cpp declares them.
_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_library = None  # keep the torch.library.Library alive for the process lifetime


def define_missing_schemas() -> list[str]:
    """Define the torchvision op schemas that are missing. Returns the names defined."""
    global _library
    import torch

    defined = []
    for name, schema in _SCHEMAS.items():
        try:
            torch._C._dispatch_find_schema_or_throw(f"torchvision::{name}", "")
            continue  # defined already
        except RuntimeError:
            pass
        if _library is None:
            _library = torch.library.Library("torchvision", "FRAGMENT")
        _library.define(schema)
        defined.append(name)
    return defined


class TorchvisionSchemaFinder(importlib.abc.MetaPathFinder):
    """Runs :func:`define_missing_schemas` when ``torchvision._meta_registrations`` is imported."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == _TARGET:
            define_missing_schemas()
        return None  # the normal finders load the module itself


def install() -> bool:
    if any(isinstance(f, TorchvisionSchemaFinder) for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, TorchvisionSchemaFinder())
    return True
