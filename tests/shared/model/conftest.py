"""The kernels fixture of the tests on GGUF blocks (test_quant_ops.py, test_quant_x8.py)."""

from __future__ import annotations

import pytest

from shared.model.kernels import cpu_ops, supported_isas


@pytest.fixture(params=supported_isas() or [None])
def kernels(request):
    """Each build this CPU runs: the AVX2 one too on AVX-512 machines."""
    if request.param is None:
        pytest.skip("no native kernels on this CPU")
    module = cpu_ops(request.param)
    assert module is not None, f"the {request.param} build failed"
    return module
