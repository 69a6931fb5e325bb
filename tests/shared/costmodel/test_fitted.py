"""The fitted cost model: least squares recovers known coefficients, and profiles survive a
trip through a file (or fail to load with a one-line reason)."""

from __future__ import annotations

import json
import random
import warnings

import pytest

from shared.costmodel.fitted import FittedCostModel, decode_features, fit, prefill_features
from shared.errors import KvstackError

PREFILL = (0.05, 2e-3, 1e-6, 6e-7, 3e-5)  # 1, n, n^2, n*c, c
DECODE = (0.04, 6e-3, 1e-5)  # 1, batch, total context
PREFILL_POINTS = [(n, c) for n in (16, 128, 512, 1536) for c in (0, 1024)]
DECODE_POINTS = [(b, b * ctx) for b in (1, 8, 24) for ctx in (128, 768)]


def model(**overrides) -> FittedCostModel:
    values = {
        "model": "m",
        "prefill_coef": PREFILL,
        "decode_coef": DECODE,
        "link_bw": 2e9,
        "link_latency": 1e-3,
        "kv_bytes_per_token": 46_080,
        "request_overhead": 0.02,
        "dtype": "float32",
        "threads": 1,
    }
    return FittedCostModel(**{**values, **overrides})


def rows(points, coef, features, noise: float = 0.0) -> list[tuple[float, ...]]:
    rng = random.Random(0)
    true = lambda x, y: sum(a * f for a, f in zip(coef, features(x, y)))
    return [(x, y, true(x, y) * (1 + rng.uniform(-noise, noise))) for x, y in points]


@pytest.mark.parametrize(
    "coef,features,points",
    [(PREFILL, prefill_features, PREFILL_POINTS), (DECODE, decode_features, DECODE_POINTS)],
)
def test_fit_recovers_known_coefficients(coef, features, points) -> None:
    assert fit(rows(points, coef, features), features) == pytest.approx(coef, rel=1e-6)


def test_with_noise_the_fit_still_predicts_within_the_noise() -> None:
    noisy = rows(PREFILL_POINTS, PREFILL, prefill_features, noise=0.03)
    fitted = model(prefill_coef=fit(noisy, prefill_features))
    for n, c in PREFILL_POINTS + [(1000, 0), (64, 512)]:
        assert fitted.prefill_time(n, c) == pytest.approx(model().prefill_time(n, c), rel=0.05)


def test_predictions_follow_the_terms() -> None:
    m = model()
    assert m.prefill_time(100, 50) == pytest.approx(
        0.05 + 2e-3 * 100 + 1e-6 * 100**2 + 6e-7 * 100 * 50 + 3e-5 * 50
    )
    assert m.decode_step_time(8, 4000) == pytest.approx(0.04 + 6e-3 * 8 + 1e-5 * 4000)
    assert m.transfer_time(2e9) == pytest.approx(1.001)


def test_a_negative_extrapolation_is_clamped_to_zero() -> None:
    m = model(prefill_coef=(-1.0, 0, 0, 0, 0), decode_coef=(-1.0, 0, 0))
    assert m.prefill_time(10) == 0.0 and m.decode_step_time(1, 10) == 0.0


def test_save_and_load_round_trip(tmp_path) -> None:
    path = tmp_path / "profiles" / "m.json"
    model().save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert FittedCostModel.load(path) == model()


def test_files_without_the_newer_fields_load_and_unknown_keys_are_ignored(tmp_path) -> None:
    data = json.loads(json.dumps(model().__dict__))
    del data["dtype"], data["threads"], data["request_overhead"]
    data["written_by"] = "a newer kvstack"
    (path := tmp_path / "old.json").write_text(json.dumps(data))
    loaded = FittedCostModel.load(path)
    assert (loaded.dtype, loaded.threads, loaded.request_overhead) == ("", 0, 0.0)
    assert loaded.prefill_coef == PREFILL


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("{not json", "is not a cost model file"),
        ("[1, 2]", "expected a JSON object"),
        ('{"model": "m"}', "no 'prefill_coef'"),
        (json.dumps({**model().__dict__, "prefill_coef": [1, 2]}), "needs 5 coefficients"),
        (json.dumps({**model().__dict__, "link_bw": 0}), "must be positive"),
        (json.dumps({**model().__dict__, "decode_coef": ["a", 1, 2]}), "is not a cost model"),
    ],
)
def test_bad_files_fail_with_a_one_line_reason(tmp_path, text, fragment) -> None:
    (path := tmp_path / "bad.json").write_text(text)
    with pytest.raises(KvstackError, match=fragment) as info:
        FittedCostModel.load(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_a_missing_file_says_how_to_make_one(tmp_path) -> None:
    with pytest.raises(KvstackError, match="run `kvstack profile`"):
        FittedCostModel.load(tmp_path / "none.json")


def test_noise_that_would_make_a_coefficient_negative_leaves_its_term_out() -> None:
    """Flat, noisy steps (a tiny model on a busy machine): plain least squares gives some
    term a negative weight and predictions that fall as the prompt grows; the fit keeps
    every coefficient at 0 or above, so they never fall."""
    rng = random.Random(3)
    rows = [(n, c, 1e-3 * rng.uniform(0.7, 1.3)) for n in (8, 64, 128, 256) for c in (0, 128)]
    coef = fit(rows, prefill_features)
    assert min(coef) >= 0 and max(coef) > 0
    cost = model(prefill_coef=coef)
    times = [cost.prefill_time(n, c) for c in (0, 128) for n in (8, 64, 128, 256)]
    assert times[:4] == sorted(times[:4]) and times[4:] == sorted(times[4:])
    exact = [(n, c, FittedCostModel.prefill_time(model(), n, c)) for n, c in PREFILL_POINTS]
    assert fit(exact, prefill_features) == pytest.approx(PREFILL, rel=1e-6)  # unchanged
