"""What a template makes, measured against its render's size budget (pure).

One step can make a big value (``s ~ s`` doubles a string), so everything a render makes is
charged to its :class:`~.template_meter.Meter` in characters, and checked before it is made
wherever its size is known then (:func:`~.template_meter.check_size`), so that one step
never makes more than the room left. :func:`size_of` finds the length of a value's text
without making it; a number made by ``**`` or ``*`` may have at most
:data:`~.template_meter.MAX_POWER_BITS` bits. What is charged: docs/security.md.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jinja2.runtime import markup_join
from jinja2.utils import Namespace, generate_lorem_ipsum, pass_eval_context

from .template_meter import MAX_POWER_BITS, OverBudget, check_size, current, make_size

#: What :func:`size_of` looks into.
_CONTAINERS = (list, tuple, dict, set, frozenset, Namespace)
#: What ``+`` and ``*`` join or repeat.
_SEQUENCES = (str, bytes, list, tuple)


def size_of(value: Any) -> int:
    """About the characters ``str(value)`` makes, without making them: a string's length;
    a list, tuple, set, dict or namespace its items' sizes and 4 per item (a shared item
    counted each time, as its text repeats it); 32 for anything else (a number, ``None``)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, bytes):
        return 4 * len(value)  # its text, at most (\xNN)
    if isinstance(value, _CONTAINERS):
        return _container_size(value, {})
    return 32


def _container_size(container: Any, known: dict[int, int]) -> int:
    """:func:`size_of` of a container; ``known``: the sizes of those met already (each
    distinct container is walked once, however often it is shared)."""
    found = known.get(id(container))
    if found is not None:
        return found
    if isinstance(container, Namespace):
        container = object.__getattribute__(container, "_Namespace__attrs")
    items: Iterable[Any] = container
    if isinstance(container, dict):
        items = [part for pair in container.items() for part in pair]
    total = 2
    for item in items:
        if type(item) is str:  # the common case first: a string of a JSON event
            total += 4 + len(item)
        elif isinstance(item, _CONTAINERS):
            total += 4 + _container_size(item, known)
        else:
            total += 4 + size_of(item)
    known[id(container)] = total
    return total


def _text(value: Any) -> str:
    """``str(value)``, refused first when the budget has no room for it."""
    check_size(size_of(value))
    return str(value)


def _number(value: Any) -> int:
    """A width or count given to a filter or method (what is no number fails there)."""
    return value if isinstance(value, int) and value > 0 else 0


# --------------------------------------------------------------------------- operators


@pass_eval_context
def concatenated(eval_ctx: Any, values: tuple[Any, ...]) -> str:
    """``a ~ b ~ ...`` (the sandbox rewrites ``~`` into this filter): charged before the
    string is made."""
    if eval_ctx.autoescape:  # an {% autoescape %} block: escaping grows it, charged after
        check_size(sum(map(size_of, values)))
        joined: str = markup_join(values)
        make_size(len(joined))
        return joined
    make_size(sum(map(size_of, values)))
    return "".join([str(value) for value in values])


def output(value: Any) -> Any:
    """Each ``{{ value }}`` (Jinja2's ``finalize``): the text of a list or dict checked
    before it is made (a string is its own text: charged with the rest of the output)."""
    if isinstance(value, _CONTAINERS):
        check_size(size_of(value))
    return value


def check_concatenation(left: Any, right: Any) -> None:
    """``left + right``: charged before, when it joins strings or lists."""
    if isinstance(left, _SEQUENCES) and isinstance(right, _SEQUENCES):
        make_size(size_of(left) + size_of(right))


def check_repeat(times: Any, value: Any) -> None:
    """``value * times``: charged before, when it repeats a string or a list (``[title]
    * n`` is judged by the text it stands for)."""
    if isinstance(times, int) and times > 0 and isinstance(value, _SEQUENCES):
        make_size(size_of(value) * times)


def check_product(left: Any, right: Any) -> None:
    """``left * right`` of two integers: at most :data:`MAX_POWER_BITS` bits."""
    if not isinstance(left, int) or not isinstance(right, int):
        return
    if abs(left).bit_length() + abs(right).bit_length() > MAX_POWER_BITS:
        raise OverBudget(
            f"template over its size budget: * would make more than {MAX_POWER_BITS} bits"
        )


def check_power(base: Any, exponent: Any) -> None:
    """``base ** exponent``: at most :data:`MAX_POWER_BITS` bits."""
    if not isinstance(base, int) or not isinstance(exponent, int) or exponent < 2:
        return
    if abs(base) > 1 and abs(base).bit_length() * exponent > MAX_POWER_BITS:
        raise OverBudget(
            f"template over its size budget: ** would make more than {MAX_POWER_BITS} bits"
        )


def lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    """Jinja2's ``lipsum()`` (its argument names), checked first: ``n`` paragraphs of at
    most ``max`` words, each under 16 characters."""
    check_size(_number(n) * _number(max) * 16)
    text: str = generate_lorem_ipsum(n, html, min, max)
    make_size(len(text))
    return text


# --------------------------------------------------------------------------- formats

#: A ``%`` conversion: its flags, width and precision (``*``: taken from the arguments).
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?([#0 +\-]*(?:\*|\d+)?(?:\.(?:\*|\d+))?)[hlL]?(.)", re.S)
_DIGITS = re.compile(r"\d+")


def format_size(fmt: str, specs: Iterable[str], values: Iterable[Any]) -> int:
    """At most what formatting ``fmt`` makes (``specs``: its fields' format specs): itself,
    each number of a spec as a width, each field as big as the biggest value (one value
    may fill many fields), a width given as an argument (``*``, ``{w}``) as the biggest
    number given."""
    values = list(values)
    biggest = max((size_of(v) for v in values), default=0)
    largest_number = max((v for v in values if isinstance(v, int)), default=0)
    size = len(fmt)
    for spec in specs:
        size += biggest + sum(int(digits) for digits in _DIGITS.findall(spec))
        if "*" in spec or "{" in spec:
            size += max(largest_number, 0)
    return size


def percent_size(fmt: str, args: Any) -> int:
    """:func:`format_size` of ``fmt % args``."""
    specs = [m.group(1) for m in _PERCENT_SPEC.finditer(fmt) if m.group(2) != "%"]
    if isinstance(args, Mapping):
        values: Iterable[Any] = args.values()
    elif isinstance(args, tuple):
        values = args
    else:
        values = (args,)
    return format_size(fmt, specs, values)


def brace_specs(fmt: str) -> list[str]:
    """The format specs of the fields of ``fmt`` (``str.format``)."""
    parsed = string.Formatter().parse(fmt)
    return [spec or "" for _literal, field, spec, _conversion in parsed if field is not None]


def _replaced(text: str, old: str, new: str, count: Any = None) -> int:
    """The length of ``text`` with ``old`` replaced by ``new`` (``count`` times at most)."""
    times = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        times = min(times, count)
    return len(text) + times * (len(new) - len(old))


def method_size(name: str, text: str | bytes, args: tuple[Any, ...]) -> int:
    """What the string method ``name`` of ``text`` makes at most, as far as its arguments
    tell (0: they do not); ``join`` is checked where its items are read."""
    if name in ("center", "ljust", "rjust", "zfill") and args:
        return max(len(text), _number(args[0]))
    if name == "expandtabs":
        tab = _number(args[0]) if args else 8
        tabs = text.count("\t") if isinstance(text, str) else text.count(b"\t")
        return len(text) + tabs * tab
    if name == "replace" and len(args) >= 2 and isinstance(text, str):
        return _replaced(text, _text(args[0]), _text(args[1]), args[2] if len(args) > 2 else None)
    if name == "translate" and args and isinstance(args[0], Mapping):
        longest = max((size_of(v) for v in args[0].values() if v is not None), default=1)
        return len(text) * max(longest, 1)
    return 0


# --------------------------------------------------------------------------- filters

# What a filter makes at most, from the arguments after the value it is given (bound as
# the filter binds them): checked before it runs.


def _center_size(value: Any, width: Any = 80) -> int:
    return max(size_of(value), _number(width))


def _indent_size(s: Any, width: Any = 4, first: Any = False, blank: Any = False) -> int:
    text = _text(s)
    step = len(width) if isinstance(width, str) else _number(width)
    return len(text) + (text.count("\n") + 1) * step


def _replace_size(s: Any, old: Any, new: Any, count: Any = None) -> int:
    return _replaced(_text(s), _text(old), _text(new), count)


def _format_size(value: Any, *args: Any, **kwargs: Any) -> int:
    return percent_size(_text(value), kwargs or args)


def _batch_size(value: Any, linecount: Any, fill_with: Any = None) -> int:
    return 0 if fill_with is None else _number(linecount)


def _slice_size(value: Any, slices: Any, fill_with: Any = None) -> int:
    return _number(slices)


def _wordwrap_size(
    s: Any,
    width: Any = 79,
    break_long_words: Any = True,
    wrapstring: Any = None,
    break_on_hyphens: Any = True,
) -> int:
    text = _text(s)
    lines = len(text) // max(_number(width), 1) + 1
    return len(text) + lines * (1 if wrapstring is None else size_of(wrapstring))


def _urlize_size(
    value: Any,
    trim_url_limit: Any = None,
    nofollow: Any = False,
    target: Any = None,
    rel: Any = None,
    extra_schemes: Any = None,
) -> int:
    text = _text(value)
    extra = size_of(target or "") + size_of(rel or "") + 40
    return 3 * len(text) + (len(text) // 2 + 1) * extra


_FILTER_SIZES: dict[str, Callable[..., int]] = {
    "center": _center_size,
    "indent": _indent_size,
    "replace": _replace_size,
    "format": _format_size,
    "batch": _batch_size,
    "slice": _slice_size,
    "wordwrap": _wordwrap_size,
    "urlize": _urlize_size,
}
#: Filters that give back one of the values they are given: nothing is made.
_PICKING = frozenset({"attr", "d", "default", "first", "last", "max", "min", "random"})


def charged(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """The filter ``fn`` (named ``name``) with its result charged. Checked first: what
    its arguments tell it will make (``join``, the filters of :data:`_FILTER_SIZES`), else
    the text of the list or dict it is given, which may not exist yet (a filter may turn
    it into text: ``string``, ``tojson``, ``upper``, ``xmlattr``...)."""
    if name in _PICKING:
        return fn
    passes = getattr(fn, "jinja_pass_arg", None) is not None  # a context or environment first
    if name == "join":
        return _checked_join(fn, passes)
    size = _FILTER_SIZES.get(name)

    @functools.wraps(fn)
    def charged_filter(*args: Any, **kwargs: Any) -> Any:
        meter = current()
        if meter is None:
            return fn(*args, **kwargs)
        value = args[passes] if len(args) > passes else None
        if size is not None:
            meter.check(size(*args[passes:], **kwargs))
        elif isinstance(value, _CONTAINERS):
            meter.check(size_of(value))
        result = fn(*args, **kwargs)
        if result is not value:  # given back as it was: nothing made
            meter.make(len(result) if type(result) is str else size_of(result))
        return result

    return charged_filter


def _checked_join(fn: Callable[..., Any], passes: bool) -> Callable[..., Any]:
    @functools.wraps(fn)
    def join(*args: Any, **kwargs: Any) -> Any:
        head, (value, *rest) = args[:passes], args[passes:]
        items = list(value)  # the filter reads it whole anyway
        separator = rest[0] if rest else kwargs.get("d", "")
        attribute = rest[1] if len(rest) > 1 else kwargs.get("attribute")
        size = size_of(separator) * max(len(items) - 1, 0)
        if attribute is None:
            size += sum(map(size_of, items))
        check_size(size)
        result = fn(*head, items, *rest, **kwargs)
        make_size(size_of(result))
        return result

    return join
