"""The exceptions flowbus raises: every one derives from :class:`FlowbusError`.

A user's bad input (a filter with a syntax error, an event that does not fit its
schema, ...) raises one of these with a message naming what was wrong and where;
the operation that raised it has changed no state.
"""

from __future__ import annotations


class FlowbusError(Exception):
    """Root of every error flowbus raises on purpose."""


class FilterError(FlowbusError):
    """A filter is well formed text but cannot be used (unknown function, too complex...)."""


class FilterSyntaxError(FilterError):
    """A filter's text does not follow the grammar.

    ``line`` and ``column`` are 1-based; ``expected`` lists what the parser would
    have accepted at that point.
    """

    def __init__(
        self,
        message: str,
        *,
        text: str = "",
        line: int = 0,
        column: int = 0,
        expected: tuple[str, ...] = (),
    ) -> None:
        self.text = text
        self.line = line
        self.column = column
        self.expected = expected
        where = f" at line {line}, column {column}" if line else ""
        want = f" (expected one of: {', '.join(expected)})" if expected else ""
        super().__init__(f"{message}{where}{want}")


class SchemaError(FlowbusError):
    """An event or filter does not fit a schema; ``field`` names the culprit."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(message)


class OverlayError(FlowbusError):
    """A change or query of a broker overlay that cannot be done (the overlay is unchanged)."""


class ProtocolError(FlowbusError):
    """A protocol core received a message it cannot handle."""
