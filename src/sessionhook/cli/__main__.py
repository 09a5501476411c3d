"""``python -m sessionhook.cli``: the ``sessionhook`` command without the console script."""

from __future__ import annotations

from ..__main__ import main

if __name__ == "__main__":
    main()
