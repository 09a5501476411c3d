"""One CA bundle load per worker (the ``_one_ca_bundle`` fixture of conftest.py): httpx loads
the bundle (certifi's, or ``SSL_CERT_FILE``/``SSL_CERT_DIR``) into a new SSL context for every
client or transport made without one, ~40 ms of CPU each, and the suite makes hundreds
(mostly to talk plain HTTP to loopback servers).

:class:`SharedContext` stands in for httpx's ``create_ssl_context`` in its transports: the
default case (``verify=True``, no client certificate) gets one context per bundle, made once
by httpx itself; any other call goes to httpx as before. (httpcore sets the ALPN protocols
on a context when it connects over TLS: the same for every client here, none asks for
HTTP/2.)
"""

from __future__ import annotations

import os
import ssl
import threading
from collections.abc import Callable
from typing import Any

import httpx._transports.default as transports

#: Where httpx's transports take their SSL contexts from.
MODULE = transports
NAME = "create_ssl_context"


class SharedContext:
    """httpx's ``create_ssl_context``, made once for the default case."""

    def __init__(self) -> None:
        self.real: Callable[..., ssl.SSLContext] = getattr(MODULE, NAME)
        self.lock = threading.Lock()
        self.shared: dict[tuple[bool, str | None, str | None], ssl.SSLContext] = {}

    def __call__(
        self, verify: Any = True, cert: Any = None, trust_env: bool = True
    ) -> ssl.SSLContext:
        if verify is not True or cert:
            return self.real(verify=verify, cert=cert, trust_env=trust_env)
        # What httpx reads to choose the bundle: a test may set them.
        key = (trust_env, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
        with self.lock:
            if key not in self.shared:
                self.shared[key] = self.real(verify=True, cert=None, trust_env=trust_env)
            return self.shared[key]
