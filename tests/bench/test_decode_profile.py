"""decode-profile charges the engine thread's samples to their innermost frames."""

from __future__ import annotations

from bench.decode_profile import summarize

RAW = """thread (7): MainThread;step (engine.py:1);small_linear (kvstack_cpu_ops_avx2.so) 6
thread (7): MainThread;step (engine.py:1);mkl_blas_def_xsgemv (libtorch_cpu.so) 3
thread (7): MainThread;step (engine.py:2) 1
thread (9);0x7f (libgomp.so.1) 50
"""


def test_only_the_engine_thread_counts_and_frames_are_grouped() -> None:
    report = summarize(RAW, top=2, thread=7)
    assert report["samples"] == 10  # the OpenMP worker's spinning is left out
    assert report["groups"] == {"kvstack kernels": 60.0, "BLAS (MKL/oneDNN)": 30.0, "Python": 10.0}
    assert report["top"][0] == ("small_linear (kvstack_cpu_ops_avx2.so)", 60.0)
