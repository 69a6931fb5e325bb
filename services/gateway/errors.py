"""Errors the gateway answers with: an HTTP status and OpenAI's error object.

Every way a request can fail is built by one of the helpers below, so the status, the `type`
and the `code` a client sees for a given failure are decided in this file only.
"""

from __future__ import annotations

import math


class ApiError(Exception):
    """A failure to report to the client as `status` with `error_body(self)` as the JSON body."""

    # NOTE: not a frozen dataclass: the interpreter and contextlib assign __traceback__ and
    # __notes__ on exceptions, which a frozen __setattr__ would refuse.
    def __init__(
        self,
        status: int,
        type: str,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        close_connection: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        self.close_connection = close_connection  # the rest of the body is not worth reading

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.type!r}, {self.message!r}, param={self.param!r})"


def error_body(err: ApiError) -> dict:
    """OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""
    return {
        "error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}
    }


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, "invalid_request_error", message, param=param, code=code)


def authentication_failed(message: str = "Invalid or missing API key.") -> ApiError:
    return ApiError(
        401,
        "authentication_error",
        message,
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404,
        "not_found_error",
        f"The model `{model}` does not exist.",
        param="model",
        code="model_not_found",
    )


def route_not_found(method: str, path: str) -> ApiError:
    return ApiError(404, "not_found_error", f"No route for {method} {path}.", code="not_found")


def body_too_large(limit_bytes: int) -> ApiError:
    return ApiError(
        413,
        "invalid_request_error",
        f"The request body is larger than the limit of {limit_bytes} bytes.",
        code="request_too_large",
    )


def method_not_allowed(method: str, path: str, allowed: set[str]) -> ApiError:
    return ApiError(
        405,
        "invalid_request_error",
        f"{method} is not allowed on {path}.",
        code="method_not_allowed",
        headers={"Allow": ", ".join(sorted(allowed))},
    )


def read_timeout(seconds: float) -> ApiError:
    """The body stopped arriving (a stalled or slowloris client)."""
    return ApiError(
        408,
        "invalid_request_error",
        f"The request body did not arrive within {seconds:g} seconds.",
        code="request_timeout",
        close_connection=True,
    )


def unsupported_encoding(supported: tuple[str, ...], encoding: str = "") -> ApiError:
    which = f"Content-Encoding {encoding!r}" if encoding else "This Content-Encoding"
    return ApiError(
        415,
        "invalid_request_error",
        f"{which} is not supported; use one of {', '.join(supported)}.",
        code="unsupported_content_encoding",
    )


def undecodable_body(why: str) -> ApiError:
    return ApiError(
        400,
        "invalid_request_error",
        f"The request body could not be read: {why}",
        code="invalid_body",
        close_connection=True,
    )


def headers_too_large(why: str) -> ApiError:
    return ApiError(
        431,
        "invalid_request_error",
        f"The request headers are too large: {why}",
        code="request_header_fields_too_large",
    )


def bad_http(why: str) -> ApiError:
    """A request aiohttp could not parse as HTTP (answered before any route runs)."""
    return ApiError(
        400, "invalid_request_error", f"Malformed HTTP request: {why}", code="bad_request"
    )


def too_many_concurrent(limit: int) -> ApiError:
    return ApiError(
        429,
        "rate_limit_error",
        f"This API key already has {limit} requests in flight, the most allowed "
        f"at once; retry when one has finished.",
        code="rate_limit_exceeded",
        headers={"Retry-After": "1"},
    )


def service_unavailable(message: str, retry_after_s: float | None = None) -> ApiError:
    """503 for overload, no workers or a dead engine; clients retry after `Retry-After`."""
    headers = {} if retry_after_s is None else {"Retry-After": _whole_seconds(retry_after_s)}
    return ApiError(
        503, "service_unavailable_error", message, code="service_unavailable", headers=headers
    )


def internal_error(
    message: str = "The server had an error while processing the request.",
) -> ApiError:
    return ApiError(500, "server_error", message)


def from_status(status: int, message: str) -> ApiError:
    """An error a backend reported as an HTTP-like status (e.g. a worker's error event)."""
    if status == 400:
        return invalid_request(message)
    if status == 503:
        return service_unavailable(message)
    return internal_error(message)


def _whole_seconds(seconds: float) -> str:
    # Retry-After takes whole seconds; rounding down to 0 would invite an immediate retry.
    return str(max(1, math.ceil(seconds)))
