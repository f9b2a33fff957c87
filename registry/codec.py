"""The old import path of :mod:`registry.wire`: the Avro codec of the registry log.

The codec, the schema catalog and the schemas now live in the package :mod:`registry.wire`
(one module per job; its docstring lists them). This module re-exports the names callers
have imported from here, so that ``from registry.codec import encode`` keeps working;
nothing in ``registry`` imports it any more.
"""

from . import wire
from .wire import *  # noqa: F403  (the same names, listed once in registry.wire)

__all__ = list(wire.__all__)
