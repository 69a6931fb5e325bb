"""Outputs sampled under the mask (seeded random logits, the real SmolLM2 tokenizer) parse
and validate; the compiler compiles once per spec; a matcher rebuilt from a request's tokens
is in the same state."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest
import torch

from shared.errors import InvalidRequest
from shared.structured.compiler import GrammarCompiler
from shared.structured.logits import mask_batch_, mask_logits_
from shared.structured.matcher import GrammarViolation
from shared.structured.spec import GrammarSpec
from tests.shared.structured.conftest import sample_masked

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["zip"],
            "additionalProperties": False,
        },
        "nickname": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]},
    },
    "required": ["name", "age", "tags", "address"],
    "additionalProperties": False,
}


def text_of(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids)  # special tokens (the final EOS) left out


@pytest.mark.parametrize("seed", range(4))
def test_random_logits_under_a_schema_give_valid_json(compiler, tokenizer, random_logits, seed):
    matcher = compiler.matcher(GrammarSpec.json_schema(PERSON))
    ids = sample_masked(matcher, random_logits(seed), tokenizer.eos_token_id, seed=seed)
    assert ids[-1] == tokenizer.eos_token_id and matcher.is_finished
    jsonschema.validate(json.loads(text_of(tokenizer, ids)), PERSON)


@pytest.mark.parametrize("seed", range(3))
def test_json_object_gives_an_object(compiler, tokenizer, random_logits, seed) -> None:
    matcher = compiler.matcher(GrammarSpec("json_object"))
    ids = sample_masked(matcher, random_logits(seed), tokenizer.eos_token_id, seed=seed)
    assert isinstance(json.loads(text_of(tokenizer, ids)), dict)


@pytest.mark.parametrize("seed", range(3))
def test_regex_and_choice_are_respected(compiler, tokenizer, random_logits, seed) -> None:
    pattern = r"[A-Z][a-z]{2,6} [0-9]{3}(-[0-9]{2})?"
    ids = sample_masked(compiler.matcher(GrammarSpec("regex", pattern)), random_logits(seed), 2)
    assert re.fullmatch(pattern, text_of(tokenizer, ids))
    choices = ["yes", "no", 'maybe "so"', "ünïcode"]
    ids = sample_masked(compiler.matcher(GrammarSpec.choice(choices)), random_logits(seed), 2)
    assert text_of(tokenizer, ids) in choices


def test_a_lark_and_a_gbnf_grammar_are_respected(compiler, tokenizer, random_logits) -> None:
    lark = 'start: "(" num ("+" num)* ")"\nnum: /[0-9]{1,3}/'
    gbnf = 'root ::= "(" num ("+" num)* ")"\nnum ::= [0-9] [0-9]? [0-9]?'
    for text in (lark, gbnf):
        ids = sample_masked(compiler.matcher(GrammarSpec("grammar", text)), random_logits(1), 2)
        assert re.fullmatch(r"\([0-9]{1,3}(\+[0-9]{1,3})*\)", text_of(tokenizer, ids))


def test_only_eos_is_allowed_once_the_grammar_is_complete(compiler, tokenizer) -> None:
    matcher = compiler.matcher(GrammarSpec.choice(["yes"]))
    assert tokenizer.eos_token_id not in matcher.allowed_token_ids()
    matcher.replay(tokenizer.encode("yes", add_special_tokens=False))
    assert matcher.is_finished and matcher.can_stop
    assert matcher.allowed_token_ids().tolist() == [tokenizer.eos_token_id]


def test_eos_is_allowed_early_only_where_the_output_may_end(compiler, tokenizer) -> None:
    matcher = compiler.matcher(GrammarSpec("regex", "a+"))
    matcher.accept(tokenizer.encode("a", add_special_tokens=False)[0])
    assert matcher.can_stop and not matcher.is_finished
    assert tokenizer.eos_token_id in matcher.allowed_token_ids()


def test_a_matcher_rebuilt_from_the_tokens_so_far_is_in_the_same_state(
    compiler, tokenizer, random_logits
) -> None:
    spec = GrammarSpec.json_schema(PERSON)
    ids = sample_masked(compiler.matcher(spec), random_logits(7), tokenizer.eos_token_id, seed=7)
    for cut in (0, 1, len(ids) // 2, len(ids) - 1):
        live = compiler.matcher(spec, ids[:cut])
        moved = compiler.compile(spec).start(ids[:cut])  # as on another worker
        assert live.num_tokens == moved.num_tokens == cut
        assert np.array_equal(live.bitmask().copy(), moved.bitmask())


def test_a_token_outside_the_grammar_is_a_violation(compiler, tokenizer) -> None:
    matcher = compiler.matcher(GrammarSpec("regex", "[0-9]+"))
    with pytest.raises(GrammarViolation, match="after 0 tokens"):
        matcher.accept(tokenizer.encode("x", add_special_tokens=False)[0])
    with pytest.raises(GrammarViolation):
        compiler.matcher(GrammarSpec("regex", "[0-9]+"), tokenizer.encode("x1"))


def test_each_spec_compiles_once(tokenizer) -> None:
    compiler = GrammarCompiler(tokenizer)
    spec = GrammarSpec.json_schema(PERSON)
    first = compiler.compile(spec)
    assert compiler.compile(GrammarSpec.from_dict(spec.to_dict())) is first
    compiler.matcher(spec)
    info = compiler.compile.cache_info()
    assert (info.misses, info.hits) == (1, 2)


@pytest.mark.parametrize(
    "spec, reason",
    [
        (GrammarSpec.json_schema({"type": "objekt"}), "json_schema does not compile"),
        (GrammarSpec.json_schema({"$ref": "#/nowhere"}), "json_schema does not compile"),
        (GrammarSpec("json_schema", "[1, 2]"), "json_schema"),
        (GrammarSpec("regex", "(?=a)b"), "regex does not compile"),
        (GrammarSpec("regex", "(unclosed"), "regex does not compile"),
        (GrammarSpec("grammar", "start: nothing_defined"), "grammar does not compile"),
    ],
)
def test_a_spec_that_does_not_compile_is_an_invalid_request(compiler, spec, reason) -> None:
    with pytest.raises(InvalidRequest, match=reason) as raised:
        compiler.compile(spec)
    assert "\n" not in str(raised.value)


def test_padded_logits_past_the_vocabulary_are_masked(compiler) -> None:
    matcher = compiler.matcher(GrammarSpec("json_object"))
    row = torch.zeros(compiler.vocab_size + 64)
    mask_logits_(row, matcher)
    assert torch.isinf(row[compiler.vocab_size :]).all()
    allowed = torch.isfinite(row).nonzero().flatten().tolist()
    assert allowed == matcher.allowed_token_ids().tolist() and allowed


def test_a_batch_masks_only_the_rows_with_a_grammar(compiler) -> None:
    logits = torch.zeros(2, compiler.vocab_size)
    mask_batch_(logits, [None, compiler.matcher(GrammarSpec("regex", "[0-9]"))])
    assert torch.isfinite(logits[0]).all()
    assert 0 < int(torch.isfinite(logits[1]).sum()) < compiler.vocab_size
