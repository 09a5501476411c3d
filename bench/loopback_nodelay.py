"""Why the servers' listening sockets are created with IPPROTO_TCP, measured side by side.

asyncio sets TCP_NODELAY on accepted connections only when the listening socket's protocol
is IPPROTO_TCP. This serves the emulator twice on loopback, once on a socket created with
protocol 0 (a bare ``socket.socket()``) and once through
``sessionhook.sockets.listening_socket``, and times the same GETs against both,
interleaved so machine noise hits both alike.

    .venv/bin/python bench/loopback_nodelay.py [--requests 60]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import threading
import time

import httpx
import uvicorn

from sessionhook.emulator.app import create_app
from sessionhook.sockets import listening_socket


def _plain_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # protocol 0: no TCP_NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _serve(sock: socket.socket) -> uvicorn.Server:
    config = uvicorn.Config(create_app(api_keys=("k",)), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise SystemExit("server did not start")
        time.sleep(0.01)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=60)
    args = parser.parse_args()
    sockets = {"protocol 0": _plain_socket(), "IPPROTO_TCP": listening_socket("127.0.0.1", 0)}
    servers = [_serve(sock) for sock in sockets.values()]
    clients = {
        name: httpx.Client(
            base_url=f"http://127.0.0.1:{sock.getsockname()[1]}",
            headers={"x-vendor-api-key": "k"},
        )
        for name, sock in sockets.items()
    }
    timings: dict[str, list[float]] = {name: [] for name in sockets}
    for _ in range(args.requests):
        for name, client in clients.items():
            started = time.perf_counter()
            client.get("/v1alpha/sources").raise_for_status()
            timings[name].append((time.perf_counter() - started) * 1000)
    for server in servers:
        server.should_exit = True
    medians = {name: statistics.median(values) for name, values in timings.items()}
    for name, value in medians.items():
        print(f"{name:>12}: median {value:.2f} ms per GET ({args.requests} GETs)")
    print(f"ratio: {medians['protocol 0'] / medians['IPPROTO_TCP']:.1f}x")


if __name__ == "__main__":
    main()
