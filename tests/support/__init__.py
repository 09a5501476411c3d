"""Shared fakes and harnesses of the tests (and of bench/): test modules import from here,
never from each other; conftest.py holds the fixtures built on them.

Fakes of the world around the relay:

* ``standin``: an independent stand-in of the Sessions API (the one fake upstream besides
  the emulator; the benchmarks serve it too), on ``loopback`` (a free port, an ASGI app
  served by uvicorn in a thread);
* ``receiver``: a recording webhook consumer (ASGI, in process);
  ``blackbox_consumer``: a verifying consumer on a real socket, for the real daemon;
* ``pg``: a throwaway PostgreSQL cluster; ``backends``: one test's store on SQLite or
  PostgreSQL; ``tinyfs``: a tiny filesystem that fills up; ``rebinding``: DNS rebinding
  on loopback; ``systemd_units``: the shipped units and ``systemd-analyze``;
* ``clock``: the one hand-moved clock; ``virtual_time``: an event loop whose time passes
  only while it would sleep; ``processes``: child processes, Ctrl-C, a fresh interpreter;
* ``chat_schemas``: the chat services' documented body schemas; ``conformance_check``:
  a conformance check of any Sessions API server (``python -m tests.support.conformance_check``).

Harnesses, by how much of the relay runs:

* ``relay_process``: the real ``sessionhook run`` as a subprocess (``Relay``, and
  ``Harness``, which stops a black-box test's servers and relays); ``world``: scripted
  sessions played on the stand-in; ``delivery_checks``: what the consumer must have got;
* ``daemon_setup``: the real daemon in process, the emulator and consumer behind ASGI;
* ``poller_harness``: the poller alone against the emulator, on one fake clock;
* ``web_relay``: the web app on a socket over a store, without the daemon;
* ``dispatch_rig``, ``store_rows``, ``backlog``: stores seeded for the dispatcher, the
  store tests and the outbox tests (and bench/store_rounds.py, bench/dispatcher_cpu.py).
"""
