"""The states of a delivery, named once, in a module that imports nothing: the command line
builds its ``--status`` choices before any command runs, without loading the relay."""

from __future__ import annotations

from typing import Final, Literal, get_args

#: Every state a delivery can be in, as the store writes it.
DeliveryStatus = Literal["pending", "failed", "dead", "delivered"]
DELIVERY_STATUSES: Final[tuple[DeliveryStatus, ...]] = get_args(DeliveryStatus)


def error_is_current(
    last_error: str | None, last_error_at: float | None, last_success_at: float | None
) -> bool:
    """Whether an endpoint's last error is news: no success came since (a later success
    makes it history: ``failing_since`` is ``None`` then, and the overviews leave it out)."""
    if last_error is None or last_error_at is None:
        return False
    return last_success_at is None or last_error_at > last_success_at
