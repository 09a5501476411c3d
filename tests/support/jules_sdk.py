"""The official Jules SDK (``@google/jules-sdk``, Node) driven against a loopback server.

``make jules-sdk`` installs it with npm into ``.cache/jules-sdk`` (or point
``SESSIONHOOK_JULES_SDK`` at a folder holding ``node_modules/@google/jules-sdk``). Where
Node or the package is missing, the test that asks for it is skipped with the reason;
under ``CI=true`` it fails instead (``make test`` installs both).

Nothing here imports ``sessionhook``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, NoReturn

import pytest

#: The version ``make jules-sdk`` installs and the tests were written against.
SDK_VERSION = "0.2.0"
_ROOT = Path(__file__).resolve().parents[2]


def _missing(reason: str) -> NoReturn:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: this test must run)")
    pytest.skip(reason)


def sdk_entry() -> Path:
    """The SDK's ES module; else the test is skipped saying how to install it (failed
    under ``CI=true``)."""
    if shutil.which("node") is None:
        _missing("Node is not installed: the official SDK's test needs it")
    folder = Path(os.environ.get("SESSIONHOOK_JULES_SDK", _ROOT / ".cache" / "jules-sdk"))
    entry = folder / "node_modules" / "@google" / "jules-sdk" / "dist" / "index.mjs"
    if not entry.is_file():
        _missing(f"the official Jules SDK is not installed in {folder}: run make jules-sdk")
    return entry


def run_sdk(script: str, workdir: Path, *, base_url: str, api_key: str) -> Any:
    """Run ``script`` (an ES module body that has ``jules``, the SDK's client connected to
    ``base_url``, and prints one JSON line) and return what it printed, parsed."""
    entry = sdk_entry()
    module = workdir / "sdk_script.mjs"
    module.write_text(
        f"import {{ connect }} from {json.dumps(entry.as_uri())};\n"
        f"const jules = connect({{ apiKey: {json.dumps(api_key)}, "
        f"baseUrl: {json.dumps(base_url)}, "
        "config: { rateLimitRetry: { maxRetryTimeMs: 0 } } });\n" + script
    )
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(workdir),
        "JULES_HOME": str(workdir / "jules-home"),
    }
    done = subprocess.run(
        ["node", str(module)], capture_output=True, text=True, timeout=60, env=env, cwd=workdir
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
