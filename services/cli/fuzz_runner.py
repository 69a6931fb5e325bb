"""Schemathesis against a live gateway: every operation of its GET /openapi.json, fed data
that fits the document (positive) and data that does not (negative), each answer checked:

- no 5xx (`not_a_server_error`);
- the status, Content-Type, headers and body are ones the document declares;
- data the document rejects is rejected with a 4xx (`negative_data_rejection`);
- every error is an OpenAI error object (`openai_error_object`, below).

Needs the `dev` extra (schemathesis); `kvstack fuzz` and tests/e2e/test_fuzz.py run it.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import hypothesis
import requests
import schemathesis
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Err
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
# Their 503 is a health (readiness) report, not a failed request.
NOT_ERRORS = frozenset({"/health", "/ready"})


@dataclass(frozen=True)
class FuzzConfig:
    base_url: str  # the gateway, e.g. http://127.0.0.1:8000
    api_key: str = ""
    max_examples: int = 50  # per operation and mode
    seed: int | None = 0  # None: different data on every run
    request_timeout: float = 120.0


@dataclass
class OperationReport:
    """What fuzzing one operation in one mode found."""

    operation: str  # e.g. "POST /v1/completions"
    mode: str  # positive or negative
    cases: int = 0
    statuses: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    skipped: str = ""  # why no case ran, when none did
    seconds: float = 0.0


def openai_error_object(ctx, response, case) -> None:
    """An error answer's body is {"error": {"message", "type", "param", "code"}}."""
    if response.status_code < 400 or case.path in NOT_ERRORS:
        return
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error"}, f"not an error object: {body}"
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, f"error fields: {set(error)}"
    assert isinstance(error["message"], str) and error["message"], "an empty message"


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
    openai_error_object,
]


def fuzz(config: FuzzConfig) -> list[OperationReport]:
    """Every operation of the gateway's document in both modes; one report each."""
    schema = schemathesis.openapi.from_url(
        f"{config.base_url}/openapi.json", timeout=config.request_timeout
    )
    operations = []
    for result in schema.get_all_operations():
        if isinstance(result, Err):  # a part of the document schemathesis cannot use
            raise result.err()
        operations.append(result.ok())
    return [fuzz_operation(operation, mode, config) for operation in operations for mode in MODES]


def fuzz_operation(operation, mode: GenerationMode, config: FuzzConfig) -> OperationReport:
    report = OperationReport(operation.label, mode.value)
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    session = requests.Session()

    # NOTE: generation only (no shrinking): every failing case is reported as found.
    @hypothesis.settings(
        max_examples=config.max_examples,
        deadline=None,
        database=None,
        phases=[hypothesis.Phase.generate],
        suppress_health_check=list(hypothesis.HealthCheck),
        verbosity=hypothesis.Verbosity.quiet,
    )
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    def run(case) -> None:
        response = case.call(
            base_url=config.base_url,
            session=session,
            headers=headers,
            timeout=config.request_timeout,
        )
        report.cases += 1
        report.statuses[response.status_code] += 1
        try:
            case.validate_response(response, checks=CHECKS, headers=headers)
        except schemathesis.errors.FailureGroup as failed:
            report.failures.append(str(failed))

    if config.seed is not None:
        run = hypothesis.seed(config.seed)(run)
    began = time.monotonic()
    try:
        run()
    except (hypothesis.errors.Unsatisfiable, schemathesis.errors.SchemathesisError) as exc:
        report.skipped = f"{type(exc).__name__}: {exc}".splitlines()[0]
    report.seconds = time.monotonic() - began
    return report
