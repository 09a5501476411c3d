"""DNS rebinding on loopback: an address policy that treats ``127.0.0.2`` as public and every
other address as private (:meth:`Rebinder.policy`), a resolver that answers from a script
like a rebinding DNS server (:class:`Rebinder`), and plain HTTP listeners that record what
reaches them (:class:`Listener`; the ``listeners`` fixture of conftest.py puts a "public"
and a private one on the same port)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pydantic import SecretStr

from sessionhook.relay.config import Config, DeliveryConfig, EndpointConfig

PUBLIC, PRIVATE = "127.0.0.2", "127.0.0.1"


class Rebinder:
    """A resolver answering from a script, one answer per call, the last one repeated."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append((host, port))
        index = min(len(self.asked), len(self.answers)) - 1
        return [self.answers[index]]

    @staticmethod
    def policy(address: str) -> str | None:
        """The address policy of these tests: ``127.0.0.2`` is "public", every other
        address private."""
        return None if address == PUBLIC else "private address (test policy)"

    @classmethod
    def alternating(cls, calls: int = 64) -> Rebinder:
        """Public, private, public, private..."""
        return cls(*[(PUBLIC, PRIVATE)[i % 2] for i in range(calls)])


@dataclass
class Listener:
    """A plain HTTP server on one address: records every request, answers 200 and closes."""

    address: str
    port: int
    requests: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)
    connections: int = 0

    def __post_init__(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def setup(self) -> None:
                owner.connections += 1
                super().setup()

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                owner.requests.append((self.path, dict(self.headers.items()), body))
                self.send_response(200)
                self.send_header("content-length", "2")
                self.send_header("connection", "close")  # every attempt connects anew
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((self.address, self.port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def rebind_url(self) -> str:
        """A webhook URL on this listener's port by the name the :class:`Rebinder` answers
        for."""
        return f"http://hooks.rebind.test:{self.port}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def rebinding_config(url: str, secret: str) -> Config:
    """One endpoint ``rx`` at ``url``, private addresses refused, eight immediate retries
    (a rebinding resolver refuses every other attempt)."""
    endpoint = EndpointConfig(name="rx", url=url, secret=SecretStr(secret))
    return Config(
        delivery=DeliveryConfig(retry_delays=(0.0,) * 8, allow_private_networks=False),
        endpoints=(endpoint,),
    )
