"""The Jinja2 sandbox templates run in, with a step budget and a size budget per render (pure).

Templates are the operator's but run on upstream data, so :class:`Sandbox` counts a render's
steps (each loop iteration, attribute or item read, call, number a ``range()`` makes, and
:data:`~.template_meter.MACRO_STEPS` per macro call): everything else a template runs sits
in a loop body or a macro, so the steps bound its work. What it makes is charged to the size
budget (:mod:`.template_sizes`). Over either: :class:`~.template_meter.OverBudget`, fast and
naming the budget; the hard bound on a user template is the child process it renders in
(``delivery.render_process``). Counting happens only inside :func:`~.template_meter.metered`
and while a template is compiled (Jinja2 runs filters on constants then).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jinja2 import nodes
from jinja2.runtime import Context, LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range
from jinja2.visitor import NodeTransformer

from . import template_sizes as sizes
from .template_meter import MACRO_STEPS, check_size, counted, current, make_size, metered, spend

#: The filter the parser wraps every for loop's iterable in (not meant for templates).
COUNTED_FILTER = "_steps"
#: The filter ``~`` becomes, its operands in a tuple (not meant for templates).
CONCAT_FILTER = "_concat"


def _range(*args: int) -> range:
    numbers = safe_range(*args)  # the sandbox's own cap: 100000 numbers
    spend(len(numbers))
    return numbers


class _Rewrite(NodeTransformer):
    """Every for loop's iterable counted, every ``~`` charged (see the module docstring)."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, COUNTED_FILTER, [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        operands = nodes.Tuple(node.nodes, "load", lineno=node.lineno)
        return nodes.Filter(operands, CONCAT_FILTER, [], [], None, None, lineno=node.lineno)


class Sandbox(ImmutableSandboxedEnvironment):
    """Jinja2's immutable sandbox that counts steps and charges sizes (see the module
    docstring); ``filters``: more filters, charged as Jinja2's own are."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(
        self, *, filters: Mapping[str, Callable[..., Any]] | None = None, **options: Any
    ) -> None:
        super().__init__(finalize=sizes.output, **options)
        self.filters.update(filters or {})
        for name, fn in list(self.filters.items()):
            self.filters[name] = sizes.charged(name, fn)
        self.filters[COUNTED_FILTER] = counted
        self.filters[CONCAT_FILTER] = sizes.concatenated
        self.globals["range"] = _range
        self.globals["lipsum"] = sizes.lipsum

    def compile(self, *args: Any, **kwargs: Any) -> Any:
        """Compile a template. Jinja2 runs a filter on constants at compile time (``"x" |
        center(10**9)``): metered too, so that one over the budget is left to run (and be
        refused) at render time instead."""
        with metered():
            return super().compile(*args, **kwargs)

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        # Every template passes here (from_string and the loader alike). A recursive
        # loop's later levels come through call() below.
        tree = super()._parse(source, name, filename)
        rewritten: nodes.Template = _Rewrite().visit(tree)
        return rewritten

    def concat(self, parts: Iterable[str]) -> str:
        """What a render outputs, and every block it captures (``{% set %}``, a macro's
        body, ``caller()``): charged piece by piece, before the string is made."""
        meter = current()
        if meter is None:
            return "".join(parts)
        pieces = []
        for piece in parts:
            meter.room -= len(piece)  # make(), inlined: this runs for every piece output
            if meter.room < 0:
                meter.full()
            pieces.append(piece)
        return "".join(pieces)

    def getattr(self, obj: Any, attribute: str) -> Any:
        """``obj.attribute`` in the template: one step."""
        meter = current()
        if meter is not None:  # spend(1), inlined: templates read attributes all the time
            meter.left -= 1
            if meter.left < 0:
                meter.stop()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        """``obj[argument]`` in the template: one step."""
        meter = current()
        if meter is not None:
            meter.left -= 1
            if meter.left < 0:
                meter.stop()
        return super().getitem(obj, argument)

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        """Call ``obj`` from the template: one step, a macro or ``caller()``
        :data:`~.template_meter.MACRO_STEPS` (a recursive ``loop(items)`` also one per
        item); what a string method makes is charged, checked first where its arguments
        tell."""
        if isinstance(obj, Macro):
            spend(MACRO_STEPS)
        elif isinstance(obj, LoopContext) and args:
            spend(MACRO_STEPS)
            args = (counted(args[0]), *args[1:])
        else:
            spend()
            text = getattr(obj, "__self__", None)
            if isinstance(text, str | bytes):
                return self._string_method(context, obj, text, args, kwargs)
        return super().call(context, obj, *args, **kwargs)

    def _string_method(
        self,
        context: Context,
        method: Any,
        text: str | bytes,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        name = getattr(method, "__name__", "")
        if name == "join" and args:
            items = list(args[0])
            check_size(sum(map(sizes.size_of, items)) + len(text) * max(len(items) - 1, 0))
            args = (items, *args[1:])
        else:
            check_size(sizes.method_size(name, text, args))
        result = super().call(context, method, *args, **kwargs)
        if result is not text:
            make_size(sizes.size_of(result))
        return result

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """``str.format`` and ``format_map`` as the sandbox runs them, checked first
        (their fields and widths) and charged."""
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt: str = value.__self__
        is_map = value.__name__ == "format_map"

        @functools.wraps(wrapped)
        def checked(*args: Any, **kwargs: Any) -> str:
            given: Iterable[Any] = (*args, *kwargs.values())
            if is_map and args and isinstance(args[0], Mapping):
                given = args[0].values()
            check_size(sizes.format_size(fmt, sizes.brace_specs(fmt), given))
            result = wrapped(*args, **kwargs)
            make_size(len(result))
            return result

        return checked

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        """``*``, ``**``, ``+`` and ``%`` (the intercepted operators): refused when the
        result would be over its bound, charged when it is text or a list."""
        if operator == "+":
            sizes.check_concatenation(left, right)
        elif operator == "*":
            sizes.check_repeat(left, right)
            sizes.check_repeat(right, left)
            sizes.check_product(left, right)
        elif operator == "**":
            sizes.check_power(left, right)
        elif isinstance(left, str):  # "%": formatting
            check_size(sizes.percent_size(left, right))
            result = super().call_binop(context, operator, left, right)
            make_size(sizes.size_of(result))
            return result
        return super().call_binop(context, operator, left, right)
