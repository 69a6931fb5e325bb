"""Native CPU kernels, compiled once per machine and instruction set on first use (torch C++
extension).

Two builds exist: `avx2` (AVX2 + FMA + F16C, x86-64-v3: any x86 CPU of the last decade) and
`avx512` (-march=native, built only where the CPU has AVX-512). The best one the CPU runs is
chosen from its flags; KVSTACK_CPU_ISA=avx2 forces the AVX2 build on an AVX-512 machine, so
both paths can be run and tested there. Every source in SOURCES is linked into each build.
"""

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

HERE = Path(__file__).parent
SOURCES = (
    HERE / "cpu_ops.cpp",
    HERE / "prefill_attention.cpp",
    HERE / "quant_ops.cpp",
    HERE / "quant_dot.cpp",
    HERE / "decode_stack.cpp",
    HERE / "greedy.cpp",
    HERE / "bindings.cpp",
)
HEADERS = (
    HERE / "simd.h",
    HERE / "quant_blocks.h",
    HERE / "quant_x8.h",
    HERE / "kernels.h",
    HERE / "parallel.h",
    HERE / "dispatch.h",
)  # included by the sources: part of the build's key
DISABLE_ENV = "KVSTACK_CPU_KERNELS"
_LOADED: dict[str, object] = {}  # the builds this process has loaded, by instruction set
ISA_ENV = "KVSTACK_CPU_ISA"
# Each build: the CPU flags it needs and the compiler flags it is built with.
ISAS = {
    "avx512": (("avx512f", "avx512bw", "avx512vl", "avx2", "fma"), ("-march=native",)),
    "avx2": (("avx2", "fma", "f16c"), ("-march=x86-64-v3", "-mtune=native")),
}


def build_dir(isa: str | None = None) -> Path:
    """One build per sources (their content and where they are), torch version, CPU model and
    instruction set."""
    isa = isa or chosen_isa()
    key = hashlib.sha256(b"".join(source.read_bytes() for source in (*SOURCES, *HEADERS)))
    key.update(torch.__version__.encode() + _cpu_model().encode() + str(isa).encode())
    # NOTE: torch's build file names the sources by path: two checkouts sharing a directory
    # rewrote it in turn and recompiled on every switch (half a minute an instruction set).
    key.update(str(HERE).encode())
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "kvstack" / "kernels" / key.hexdigest()[:16]


@functools.cache
def supported_isas() -> tuple[str, ...]:
    """The builds this CPU can run, best first."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return ()
    flags = set(_cpu_flags())
    return tuple(isa for isa, (needed, _) in ISAS.items() if flags.issuperset(needed))


@functools.cache
def chosen_isa() -> str | None:
    """KVSTACK_CPU_ISA if set (and the CPU runs it), else the best build the CPU runs; read
    once per process."""
    supported = supported_isas()
    forced = os.environ.get(ISA_ENV, "").strip().lower()
    if forced and forced != "auto":
        if forced not in ISAS:
            raise ValueError(f"{ISA_ENV}={forced!r}: choose one of {', '.join(ISAS)} or auto")
        return forced if forced in supported else None
    return supported[0] if supported else None


def cpu_ops(isa: str | None = None):
    """The compiled module for `isa` (default: the chosen one), or None when disabled
    (KVSTACK_CPU_KERNELS=0, read once per process), when the CPU cannot run it, or when no
    compiler is available."""
    if _disabled():
        return None
    return _load(isa or chosen_isa())


def loaded_cpu_ops():
    """The chosen build if this process has loaded it already, else None: never builds (for
    callers beside a model, such as the sampler, which mock engines run too)."""
    if _disabled():
        return None
    return _LOADED.get(chosen_isa())


@functools.cache
def _disabled() -> bool:
    """KVSTACK_CPU_KERNELS=0, read once per process (ops ask on every call)."""
    return os.environ.get(DISABLE_ENV, "1") == "0"


@functools.cache
def _load(isa: str | None):
    if isa is None or isa not in supported_isas():
        return None
    try:
        _LOADED[isa] = _build(isa)
        return _LOADED[isa]
    except Exception as e:  # no compiler, no ninja, a failed build: run the torch path
        print(
            f"kvstack: native CPU kernels ({isa}) unavailable ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); using torch ops",
            file=sys.stderr,
        )
        return None


def _build(isa: str):
    from torch.utils.cpp_extension import load

    directory = build_dir(isa)
    directory.mkdir(parents=True, exist_ok=True)
    with _exclusive(directory / "build.flock"):
        # NOTE: torch's own lock file outlives a builder that was killed, and every later load
        # would wait on it forever; under our flock no other builder is alive, so it is stale.
        (directory / "lock").unlink(missing_ok=True)
        if not any(directory.glob("*.so")):
            print(
                f"kvstack: compiling native CPU kernels ({isa}) once (about half a minute)...",
                file=sys.stderr,
            )
        return load(
            name=f"kvstack_cpu_ops_{isa}",
            sources=[str(source) for source in SOURCES],
            build_directory=str(directory),
            extra_cflags=["-O3", *ISAS[isa][1], "-fopenmp"],
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


def _cpu_flags() -> list[str]:
    line = next((line for line in _cpu_model().splitlines() if line.startswith("flags")), "")
    return line.partition(":")[2].split()


@functools.cache
def _cpu_model() -> str:
    """The CPU's model name and feature flags (what -march=native compiles for)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags")
    return "\n".join(next((line for line in lines if line.startswith(key)), "") for key in wanted)
