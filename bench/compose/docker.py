"""The Docker engine and compose, as commands: what is installed, whether an engine answers,
and one call that runs a command and says clearly what failed."""

from __future__ import annotations

import functools
import http.client
import json
import os
import shutil
import socket
import subprocess
from collections.abc import Sequence

from shared.errors import KvstackError


def run(argv: Sequence[str], timeout: float = 600, env: dict | None = None, check: bool = True):
    """Run `argv`; with `check`, a non-zero exit is a KvstackError carrying its stderr."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        raise KvstackError(f"{' '.join(argv[:4])} ... did not end within {timeout:.0f}s") from None
    if check and done.returncode != 0:
        raise KvstackError(
            f"{' '.join(argv)} exited with {done.returncode}: {done.stderr.strip()[-2000:]}"
        )
    return done


def unavailable() -> str:
    """Why containers cannot run here ("": they can)."""
    if shutil.which("docker") is None:
        return "docker is not installed"
    if run(["docker", "info"], timeout=30, check=False).returncode != 0:
        return "no Docker engine answers (dockerd not running, or no permission)"
    try:
        compose_command()
    except KvstackError as e:
        return str(e)
    return ""


@functools.cache
def compose_command() -> tuple[str, ...]:
    """`docker compose` (v2) where its plugin is installed, else `docker-compose` (v1)."""
    if run(["docker", "compose", "version"], timeout=30, check=False).returncode == 0:
        return ("docker", "compose")
    if shutil.which("docker-compose"):
        return ("docker-compose",)
    raise KvstackError("neither `docker compose` (v2) nor `docker-compose` (v1) is installed")


def inspect(ids: Sequence[str]) -> list[dict]:
    """`docker inspect` of these containers (those that exist)."""
    if not ids:
        return []
    return json.loads(run(["docker", "inspect", *ids], check=False).stdout or "[]")


ENGINE_SOCKET = "/var/run/docker.sock"


class _EngineConnection(http.client.HTTPConnection):
    """HTTP to the Docker engine over its unix socket."""

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(ENGINE_SOCKET)


def kill(container_id: str) -> None:
    """SIGKILL a container through the engine, as `docker kill` does, but straight to its
    API where the local socket is there: the CLI's own start can take longer than a short
    request has left, and a fault must land while it is in flight."""
    if os.environ.get("DOCKER_HOST") or not os.path.exists(ENGINE_SOCKET):
        run(["docker", "kill", container_id])
        return
    engine = _EngineConnection("localhost", timeout=30)
    try:
        engine.request("POST", f"/containers/{container_id}/kill")
        answer = engine.getresponse()
        body = answer.read().decode(errors="replace")
    finally:
        engine.close()
    if answer.status != 204:
        raise KvstackError(f"docker kill {container_id[:12]}: {answer.status} {body.strip()}")


def image_exists(image: str) -> bool:
    return run(["docker", "image", "inspect", image], check=False).returncode == 0
