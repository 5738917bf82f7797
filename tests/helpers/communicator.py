"""The members of the Communicator Protocol, for the tests that hold each implementation to it."""
from __future__ import annotations

import inspect

from mpifgl.communicator import Communicator


def protocol_members() -> tuple[set[str], dict[str, list[str]]]:
    """(attribute names, method name -> parameter names) of the Protocol."""
    attributes = set(Communicator.__annotations__)
    methods = {name: list(inspect.signature(value).parameters)
               for name, value in vars(Communicator).items()
               if inspect.isfunction(value) and not name.startswith("_")}
    return attributes, methods
