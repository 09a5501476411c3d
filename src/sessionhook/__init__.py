"""sessionhook: push delivery for coding-agent sessions.

Polls the Sessions API, archives every activity once in SQLite, and delivers each as a
signed Standard Webhooks event with durable retry. Also ships a typed async client of
the whole API (:mod:`sessionhook.api`) and a local emulator of it
(:mod:`sessionhook.emulator`).
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
