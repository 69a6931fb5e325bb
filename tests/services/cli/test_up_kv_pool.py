"""`kvstack up --kv-pool mooncake`: no kvstore instances, and every worker is pointed at
the master up started; a worker told to use the store without one is refused."""

from __future__ import annotations

import pytest

from services.cli.main import build_parser
from services.cli.serve import worker_config
from services.cli.up import stack_config
from shared.errors import KvstackError


def test_workers_get_the_store_and_no_kvstore_runs() -> None:
    args = build_parser().parse_args(["up", "--kv-pool", "mooncake", "--mooncake-replicas", "2"])
    config = stack_config(args, "127.0.0.1:50051")
    assert config.num_kvstore == 0
    argv = " ".join(config.worker_args)
    assert "--kv-pool mooncake" in argv and "--mooncake-replicas 2" in argv
    assert "--mooncake-master 127.0.0.1:50051" in argv
    assert stack_config(build_parser().parse_args(["up"])).num_kvstore == 1


def test_a_worker_needs_the_master_address() -> None:
    parse = lambda *extra: build_parser().parse_args(["prefill", "--insecure", *extra])
    with pytest.raises(KvstackError, match="--mooncake-master"):
        worker_config(parse("--kv-pool", "mooncake"))
    config = worker_config(parse("--kv-pool", "mooncake", "--mooncake-master", "10.0.0.9:50051"))
    assert config.mooncake is not None and config.mooncake.master == "10.0.0.9:50051"
    assert worker_config(parse()).mooncake is None
