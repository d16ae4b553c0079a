"""The filter language: one canonical form, many evaluators.

``parse(text_or_triples)`` turns the text form (``price > 100 & issue = "IBM"``) or
the 001 document's triple form (``[["class", "=", "trigger"], ["price", ">", 50]]``)
into a :class:`Filter`, a disjunction of conjunctions of literals.
"""

from flowbus.filters.ast import (
    BinOp,
    Call,
    Conjunction,
    Const,
    ExprPredicate,
    Field,
    Filter,
    Functions,
    Literal,
    Op,
    Predicate,
)
from flowbus.filters.parser import parse

__all__ = [
    "BinOp",
    "Call",
    "Conjunction",
    "Const",
    "ExprPredicate",
    "Field",
    "Filter",
    "Functions",
    "Literal",
    "Op",
    "Predicate",
    "parse",
]
