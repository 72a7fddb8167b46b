"""Run a function on a module right after it is first imported (for the serving tier's
sitecustomize files: tests/engines/cpu_connector/, tests/engines/cpu_dflash/). Never part of
kquant."""

import importlib.abc
import importlib.util
import sys


class _After(importlib.abc.MetaPathFinder):
    def __init__(self, name, then):
        self.name, self.then = name, then

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            self.then(module)

        spec.loader.exec_module = exec_module
        return spec


def after_import(name, then):
    """Call `then(module)` once module `name` has run (the first time it is imported)."""
    sys.meta_path.insert(0, _After(name, then))
