"""How often and how patiently a call of the client is retried: :class:`RetryPolicy` (pure).
Which calls are retried after which failures is :mod:`sessionhook.api.exchange`'s rule.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Final

# 2**64 seconds is already far beyond any cap; bounding the exponent avoids float overflow.
_MAX_EXPONENT: Final = 64


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a call is retried; :meth:`delay` is a pure function.

    ``max_attempts`` counts the first try, so ``1`` disables retries. The wait after the
    n-th failed attempt is ``base_delay * 2**(n-1)``, capped at ``max_delay``, then spread
    by a random factor in ``[1 - jitter, 1 + jitter]`` so that many clients do not retry in
    step (at the cap the waits therefore spread around ``max_delay``). A server's
    ``Retry-After`` is a floor: the wait is at least that long. Advice longer than
    ``max_retry_after`` is not waited out by the client (the error is raised instead).
    """

    max_attempts: int = 5
    base_delay: float = 1.0
    max_delay: float = 30.0
    jitter: float = 0.2
    max_retry_after: float = 120.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1 (1 disables retries)")
        for field in ("base_delay", "max_delay", "max_retry_after"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{field} must be a finite number >= 0, not {value!r}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), not {self.jitter!r}")

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1 is the first try);
        ``retry_after`` is the server's advice (``None``: none), ``rng`` the jitter's source."""
        if attempt < 1:
            raise ValueError(f"attempt numbers start at 1, not {attempt}")
        exponent = min(attempt - 1, _MAX_EXPONENT)
        wait = min(self.max_delay, self.base_delay * 2.0**exponent)
        if self.jitter:
            wait *= 1.0 + rng.uniform(-self.jitter, self.jitter)
        if retry_after is not None:
            wait = max(wait, min(max(retry_after, 0.0), self.max_retry_after))
        return wait

    def gives_up_on(self, retry_after: float | None) -> bool:
        """Whether a server asking to wait ``retry_after`` seconds asks for too long."""
        return retry_after is not None and retry_after > self.max_retry_after
