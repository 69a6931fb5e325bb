"""The processes that never hold a tensor start without torch: the command line itself (its
one-line errors, --help, `kvstack up`'s supervisor), the conductor, the gateway and the
kvstore. torch costs each a second or more of CPU and some 200 MB at every (re)start."""

from __future__ import annotations

import subprocess
import sys

LEAN = (
    "services.cli.main",
    "services.conductor.service",
    "services.gateway.service",
    "services.kvstore.service",
)


def test_the_command_line_and_the_control_plane_import_without_torch() -> None:
    code = f"import sys\nfor m in {LEAN!r}: __import__(m)\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_engine_does_import_it() -> None:  # the check above can tell
    code = "import sys, shared.engine.engine\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
