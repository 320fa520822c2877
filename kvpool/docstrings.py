"""Attribute docstrings (the string literal under a dataclass field) as data, so a setting is
described once -- where it is defined -- and every layer that offers it (the server's flags and
``--help``) reads that description instead of writing its own."""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
from functools import cache


@cache
def attribute_docs(cls: type) -> dict[str, str]:
    """Field name -> its docstring, first sentence joined onto one line."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    out: dict[str, str] = {}
    for stmt, nxt in itertools.pairwise(body):
        is_doc = isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and is_doc:
            out[stmt.target.id] = " ".join(nxt.value.value.split())
    return out
