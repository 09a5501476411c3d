# Confusable characters (fullwidth digits, ideographic full stops) are what this tests.
# ruff: noqa: RUF001
"""Spellings of private hosts that HTTP clients normalize (issue 26): the table the SSRF
tests walk at every door (the config, the management API, the console, the CLI, the test
ping, each POST).

:func:`loopback_spellings` all lead to ``127.0.0.1:port`` (or ``localhost``), so that a
test can run a listener there and count what reaches it; :data:`ELSEWHERE` lead to the
metadata address or a private network, and are only ever judged, never sent to (a test
talks only to loopback servers it starts)."""

from __future__ import annotations

__all__ = ["ELSEWHERE", "loopback_spellings"]


def loopback_spellings(port: int) -> list[str]:
    """URLs whose host, once normalized as aiohttp/yarl and httpx normalize it, is a
    loopback address or name, on ``port``."""
    hosts = [
        "１２７.0.0.1",  # fullwidth digits
        "127。0。0。1",  # U+3002 ideographic full stop
        "１２７．０．０．１",  # fullwidth digits and U+FF0E
        "127｡0｡0｡1",  # U+FF61 halfwidth ideographic full stop
        "①②⑦.0.0.1",  # circled digits
        "ⓛⓞⓒⓐⓛⓗⓞⓢⓣ",  # circled letters: localhost
        "ＬＯＣＡＬＨＯＳＴ",
        "LocalHost",
        "127.0.0.1.",  # a trailing dot
        "%31%32%37.0.0.1",  # percent-encoded
        "%6c%6fcalhost",
        "0x7f.1",  # legacy IPv4 forms
        "0177.0.0.1",
        "2130706433",
        "０x7f.1",
        "[::ffff:127.0.0.1]",  # IPv4-mapped IPv6
        "[::ffff:7f00:1]",
        "public.example@１２７.0.0.1",  # userinfo that looks like a host
        "a@b@127.0.0.1",
    ]
    return [f"http://{host}:{port}/hook" for host in hosts]


#: URLs whose host, once normalized, is the cloud metadata address or a private one.
ELSEWHERE = [
    "http://１６９.２５４.１６９.２５４/latest/meta-data/",
    "http://１０.0.0.1/",
    "http://0xa9fea9fe/",
    "http://[::ffff:a9fe:a9fe]/",
]
