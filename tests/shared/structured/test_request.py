"""grammar_from_request: each OpenAI and vLLM request shape gives its spec; bad input is an
InvalidRequest that names the parameter."""

from __future__ import annotations

import json

import pytest

from shared.errors import InvalidRequest
from shared.structured.request import grammar_from_request
from shared.structured.spec import GrammarSpec

LARK = 'start: x\nx: "x"'
SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}


@pytest.mark.parametrize(
    "body, want",
    [
        ({}, None),
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, GrammarSpec("json_object")),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
            GrammarSpec.json_schema(SCHEMA),
        ),
        ({"guided_json": SCHEMA}, GrammarSpec.json_schema(SCHEMA)),
        ({"guided_json": json.dumps(SCHEMA)}, GrammarSpec.json_schema(SCHEMA)),
        ({"guided_regex": "[0-9]+"}, GrammarSpec("regex", "[0-9]+")),
        ({"guided_choice": ["yes", "no"]}, GrammarSpec("choice", '["yes", "no"]')),
        ({"guided_grammar": "start: /a+/"}, GrammarSpec("grammar", "start: /a+/")),
        ({"structured_outputs": {"json": SCHEMA}}, GrammarSpec.json_schema(SCHEMA)),
        (
            {"structured_outputs": {"regex": "a|b", "disable_any_whitespace": True}},
            GrammarSpec("regex", "a|b"),
        ),
        ({"structured_outputs": {"choice": ["x"]}}, GrammarSpec("choice", '["x"]')),
        ({"structured_outputs": {"json_object": True}}, GrammarSpec("json_object")),
        ({"structured_outputs": {"grammar": LARK}}, GrammarSpec("grammar", LARK)),
        ({"guided_json": None, "response_format": None}, None),
    ],
)
def test_each_request_shape_gives_its_spec(body, want) -> None:
    assert grammar_from_request(body) == want


def test_the_schema_keeps_its_key_order() -> None:
    spec = grammar_from_request({"guided_json": SCHEMA})
    assert spec is not None and spec.text.index('"b"') < spec.text.index('"a"')


def test_a_spec_round_trips_through_json() -> None:
    spec = GrammarSpec.json_schema(SCHEMA)
    assert GrammarSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert hash(spec) == hash(GrammarSpec.from_dict(spec.to_dict()))


@pytest.mark.parametrize(
    "body, names",
    [
        ({"response_format": "json"}, "response_format"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": []}}},
            "response_format.json_schema.schema",
        ),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_regex": ""}, "guided_regex"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_choice": ["a", 1]}, "guided_choice"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.regex"),
        ({"structured_outputs": {"yaml": "a"}}, "structured_outputs"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
        ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_bad_input_names_the_parameter(body, names) -> None:
    with pytest.raises(InvalidRequest, match=names.replace(".", r"\.")):
        grammar_from_request(body)


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="unknown grammar kind"):
        GrammarSpec("xml", "")
