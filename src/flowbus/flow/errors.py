"""The errors of information flow graphs.

:class:`FlowError` is what a bad flow gets: a spec that is not valid YAML, an
unknown space, a cycle, an expression naming a field its space does not have.
Its message names the spec file, the arc or space, and what was wrong.
:class:`ExpandError` is an expansion (000 document, section 4.2) that has no
answer: no event sequence takes the start state to the goal state, or none
within the cost bound.
"""

from __future__ import annotations

from flowbus.errors import FlowbusError


class FlowError(FlowbusError):
    """An information flow graph, its spec or its input is not usable; the message says where."""


class ExpandError(FlowError):
    """No event sequence takes the start state to the goal (within the bound, if one was given)."""
