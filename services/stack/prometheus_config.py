"""The Prometheus config that scrapes one `kvstack up` stack: every service's /metrics at
its fixed port (ports.py), each target labelled with its service and worker id.

Written as JSON, which is YAML too, so no YAML library is needed at run time:
`prometheus --config.file=.kvstack/prometheus.yml`.
"""

from __future__ import annotations

import json
from pathlib import Path

from services.stack.ports import Listener

SCRAPE_INTERVAL = "5s"


def scrape_config(listeners: list[Listener]) -> dict:
    return {
        "global": {"scrape_interval": SCRAPE_INTERVAL},
        "scrape_configs": [
            {
                "job_name": "kvstack",
                "static_configs": [
                    {
                        "targets": [f"{_dialable(x.host)}:{x.port}"],
                        "labels": {"service": x.service, "worker_id": x.name},
                    }
                    for x in listeners
                ],
            }
        ],
    }


def write(path: Path, listeners: list[Listener]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "# Written by `kvstack up` at each start; scrapes every service of the stack.\n"
    path.write_text(header + json.dumps(scrape_config(listeners), indent=2) + "\n")


def _dialable(host: str) -> str:
    """A bind address Prometheus can dial (0.0.0.0 binds everything, dials nothing)."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
