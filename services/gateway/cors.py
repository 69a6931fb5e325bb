"""CORS for browser clients: off unless origins are configured (`--cors-origins`).

Only the configured origins get `Access-Control-Allow-Origin` (their own origin echoed,
with `Vary: Origin`); a preflight (OPTIONS with Access-Control-Request-Method) from one of
them is answered 204 before authentication, since browsers send no credentials on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

ALLOWED_METHODS = "GET, POST, OPTIONS"
EXPOSED_HEADERS = "Retry-After, WWW-Authenticate"
PREFLIGHT_MAX_AGE_S = 600


def parse_origins(text: str) -> tuple[str, ...]:
    """`--cors-origins`: a comma-separated list; `*` allows any origin."""
    return tuple(origin.strip().rstrip("/") for origin in text.split(",") if origin.strip())


@dataclass(frozen=True)
class Cors:
    origins: tuple[str, ...]

    def allows(self, origin: str | None) -> bool:
        return bool(origin) and ("*" in self.origins or origin in self.origins)

    @web.middleware
    async def preflight_middleware(self, request: web.Request, handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        is_preflight = (
            request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers
        )
        if not (is_preflight and self.allows(origin)):
            return await handler(request)
        requested = request.headers.get("Access-Control-Request-Headers", "")
        return web.Response(
            status=204,
            headers={
                "Access-Control-Allow-Methods": ALLOWED_METHODS,
                "Access-Control-Allow-Headers": requested or "Authorization, Content-Type",
                "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S),
            },
        )

    async def on_response_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """Every response, streams and errors too, right before its headers go out."""
        response.headers.add("Vary", "Origin")
        origin = request.headers.get("Origin")
        if origin is not None and self.allows(origin):
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = EXPOSED_HEADERS
