"""Errors that reach a user: each carries a one-line message meant to be shown as is."""

from __future__ import annotations


class KvstackError(Exception):
    """A problem with the user's input or set-up, reported as one line, never a traceback."""


class ModelNotFound(KvstackError):
    pass


class UnsupportedModel(KvstackError):
    pass


class InvalidRequest(KvstackError):
    pass


# Refusals for overload start with this: the gateway answers 503 at once instead of trying
# another placement, which the same overload would refuse again.
OVERLOADED = "overloaded: "


def is_overload(error: str) -> bool:
    return error.startswith(OVERLOADED)


def no_worker(kind: str) -> str:
    """The refusal when no `kind` worker can take a request (none live, or all excluded)."""
    return f"no {kind} worker available"


# A prefill's prefix fetch failed or stalled (shared/prefill/prefix.py: load_failure): the
# retry computes the prefix instead of loading it again.
PREFIX_LOAD_FAILED = "loading the prefix failed"


def is_prefix_load_failure(error: str) -> bool:
    return PREFIX_LOAD_FAILED in error


def is_no_worker(error: str) -> bool:
    return error in (no_worker("prefill"), no_worker("decode"))
