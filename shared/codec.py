"""orjson encoding of frozen dataclasses, with a decoder that checks what it builds.

A message is `{"kind": <registered name>, "body": {...}}`. Decoding rebuilds the
dataclass (nested dataclasses, tuples, optionals) and reports anything malformed as
a `MessageError` with one clear line, never a half-built object.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import cache
from typing import Any

import orjson

from shared.errors import KvstackError

_KINDS: dict[str, type] = {}


class MessageError(KvstackError):
    """A message that cannot be decoded into its declared type."""


def message(kind: str):
    """Class decorator registering a dataclass under a wire name."""

    def register(cls: type) -> type:
        assert kind not in _KINDS, f"message kind {kind!r} registered twice"
        _KINDS[kind] = cls
        setattr(cls, "KIND", kind)  # noqa: B010 (a class attribute added at registration)
        return cls

    return register


def encode(msg: Any) -> bytes:
    return orjson.dumps({"kind": type(msg).KIND, "body": msg})


def decode(data: bytes, expected: type | tuple[type, ...] | None = None) -> Any:
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise MessageError(f"message is not valid JSON: {e}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("kind"), str):
        raise MessageError("message lacks a 'kind'")
    cls = _KINDS.get(raw["kind"])
    if cls is None:
        raise MessageError(f"unknown message kind {raw['kind']!r}")
    if expected is not None and not issubclass(cls, expected):
        raise MessageError(f"expected {_names(expected)}, got {raw['kind']!r}")
    return build(cls, raw.get("body"))


def build(cls: type, data: Any, path: str = "") -> Any:
    """Turn decoded JSON into an instance of the dataclass `cls`, checking types."""
    where = path or cls.__name__
    if not isinstance(data, dict):
        raise MessageError(f"{where}: expected an object")
    fields = _fields(cls)
    unknown = set(data) - set(fields)
    if unknown:
        raise MessageError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    values = {}
    for name, (hint, required) in fields.items():
        if name not in data:
            if required:
                raise MessageError(f"{where}: missing field {name!r}")
            continue
        values[name] = _convert(hint, data[name], f"{where}.{name}")
    try:
        return cls(**values)
    except (KvstackError, ValueError) as e:  # the dataclass's own validation
        raise MessageError(f"{where}: {e}") from None


@cache
def _fields(cls: type) -> dict[str, tuple[Any, bool]]:
    hints = typing.get_type_hints(cls)
    missing = dataclasses.MISSING
    return {
        f.name: (hints[f.name], f.default is missing and f.default_factory is missing)
        for f in dataclasses.fields(cls)
        if f.init
    }


def _convert(hint: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return _convert_union(typing.get_args(hint), value, path)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return build(hint, value, path)
    if origin in (tuple, list):
        return _convert_sequence(hint, origin, value, path)
    if origin is dict:
        if not isinstance(value, dict):
            raise MessageError(f"{path}: expected an object")
        return value
    if hint is Any:
        return value
    return _convert_scalar(hint, value, path)


def _convert_union(options: tuple, value: Any, path: str) -> Any:
    if value is None and type(None) in options:
        return None
    errors = []
    for option in (o for o in options if o is not type(None)):
        try:
            return _convert(option, value, path)
        except MessageError as e:
            errors.append(str(e))
    raise MessageError(errors[0] if len(errors) == 1 else f"{path}: unexpected value {value!r}")


def _convert_sequence(hint: Any, origin: type, value: Any, path: str) -> Any:
    if not isinstance(value, list):
        raise MessageError(f"{path}: expected a list")
    args = typing.get_args(hint)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return tuple(_convert(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is tuple:
        if len(args) != len(value):
            raise MessageError(f"{path}: expected {len(args)} items")
        return tuple(_convert(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    return [_convert(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)] if args else value


def _convert_scalar(hint: type, value: Any, path: str) -> Any:
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float) and isinstance(value, bool):
        raise MessageError(f"{path}: expected {hint.__name__}, got a boolean")
    if not isinstance(value, hint):
        raise MessageError(f"{path}: expected {hint.__name__}, got {type(value).__name__}")
    return value


def _names(expected: type | tuple[type, ...]) -> str:
    types_ = expected if isinstance(expected, tuple) else (expected,)
    return " or ".join(t.KIND if hasattr(t, "KIND") else t.__name__ for t in types_)
