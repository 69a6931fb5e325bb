"""The names the gateway's model answers to, as vLLM's `--served-model-name` has them.

- `served`: the names `--served-model-name` gave (default: `--model` as given). The first
  is the one every response reports as its `model`; GET /v1/models lists each of them.
- a known model's Hugging Face repo id (`HuggingFaceTB/SmolLM2-135M-Instruct`) is listed
  too, and `root` of every card is that id (what `vllm bench serve` loads a tokenizer
  from); for another model, `root` is `--model` as given.
- accepted in requests: every listed name, `--model`, the model directory's name and a
  known model's aliases, each in any case (vLLM compares names exactly; kvstack forgives
  case, as `resolve_model` does).

`ModelNames` is a `Collection[str]` of the accepted names, so protocol.py's `aliases`
check takes it as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from shared.model.registry import known_model


class ModelNames:
    def __init__(self, served: Iterable[str], root: str, accepted: Iterable[str]) -> None:
        served = tuple(served)
        listed: dict[str, str] = {}  # casefolded -> the spelling listed (the first given)
        for name in served:
            listed.setdefault(name.casefold(), name)
        if not listed or "" in listed:
            raise ValueError(f"served model names must be non-empty: {served}")
        self.served = tuple(listed.values())
        self.root = root
        self._listed = listed
        self._accepted = frozenset({*listed, *(name.casefold() for name in accepted)} - {""})

    @classmethod
    def for_model(cls, model: str, served: Iterable[str], model_dir: Path) -> ModelNames:
        """The names of `--model model` (resolved to `model_dir`) served as `served`."""
        served = tuple(served) or (model,)
        known = known_model(model)
        if known is None:
            return cls(served, model, (model, model_dir.name))
        repo = (known.hf_repo,) if known.hf_repo else ()
        accepted = (model, model_dir.name, known.name, *known.names())
        return cls((*served, *repo), known.hf_repo or model, accepted)

    @property
    def reported(self) -> str:
        """The name responses carry, whichever name a request used."""
        return self.served[0]

    def listed(self, name: str) -> str | None:
        """The card id for `name`: its listed spelling, `name` itself for another accepted
        name, None for a name this gateway does not serve."""
        folded = name.casefold()
        if folded not in self._accepted:
            return None
        return self._listed.get(folded, name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.casefold() in self._accepted

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._accepted))

    def __len__(self) -> int:
        return len(self._accepted)
