"""A local emulator of the Sessions API: the whole ``/v1alpha`` surface and a scripted agent.

``create_app()`` gives a Starlette app (served by ``sessionhook emulator``, or used
in-process through ``httpx.ASGITransport``); ``app.state.world`` is its :class:`World`.
"""

from .agent import Account, SessionRecord
from .app import API_KEY_HEADER, FAULT_HEADER, create_app
from .world import EmulatorError, World

__all__ = [
    "API_KEY_HEADER",
    "FAULT_HEADER",
    "Account",
    "EmulatorError",
    "SessionRecord",
    "World",
    "create_app",
]
