"""Native CPU kernels, compiled once per machine on first use (torch C++ extension)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import platform
import sys
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("cpu_ops.cpp")
DISABLE_ENV = "KVSTACK_CPU_KERNELS"


def build_dir() -> Path:
    """One build per source, torch version and CPU model: -march=native code is per machine."""
    cpu = _cpu_model()
    key = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode() + cpu.encode())
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "kvstack" / "kernels" / key.hexdigest()[:16]


@functools.cache
def cpu_ops():
    """The compiled module, or None when disabled or when no compiler is available."""
    if os.environ.get(DISABLE_ENV, "1") == "0" or platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        return _build()
    except Exception as e:  # no compiler, no ninja, a failed build: run the torch path
        print(
            f"kvstack: native CPU kernels unavailable ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); using torch ops",
            file=sys.stderr,
        )
        return None


def _build():
    from torch.utils.cpp_extension import load

    directory = build_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with _exclusive(directory / "build.flock"):
        # NOTE: torch's own lock file outlives a builder that was killed, and every later load
        # would wait on it forever; under our flock no other builder is alive, so it is stale.
        (directory / "lock").unlink(missing_ok=True)
        if not any(directory.glob("*.so")):
            print("kvstack: compiling native CPU kernels once (about a minute)...", file=sys.stderr)
        return load(
            name="kvstack_cpu_ops",
            sources=[str(SOURCE)],
            build_directory=str(directory),
            extra_cflags=["-O3", "-march=native", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )


@contextlib.contextmanager
def _exclusive(path: Path):
    """One builder per machine at a time; the kernel drops the lock if its holder dies."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _cpu_model() -> str:
    """The CPU's model name and feature flags (what -march=native compiles for)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags")
    return "\n".join(next((line for line in lines if line.startswith(key)), "") for key in wanted)
