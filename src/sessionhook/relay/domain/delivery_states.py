"""The states of a delivery, named once, in a module that imports nothing: the command line
builds its ``--status`` choices before any command runs, without loading the relay."""

from __future__ import annotations

from typing import Final

__all__ = ["DELIVERY_STATUSES"]

#: Every state a delivery can be in, as the store writes it.
DELIVERY_STATUSES: Final = ("pending", "failed", "dead", "delivered")
