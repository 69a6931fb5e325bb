"""`kvstack up --kv-pool mooncake`: no kvstore instances, and every worker is pointed at
the master up started; a worker told to use the store without one is refused; and the
workers and kvstores up starts keep KV off shared memory when told to."""

from __future__ import annotations

import pytest

from services.cli.main import build_parser
from services.cli.service import worker_config
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


def test_no_shared_memory_reaches_every_process_that_moves_kv() -> None:
    args = build_parser().parse_args(["up", "--no-shared-memory"])
    config = stack_config(args)
    assert "--no-shared-memory" in config.worker_args  # prefill and decode
    assert "--no-shared-memory" in config.kvstore_args
    plain = stack_config(build_parser().parse_args(["up"]))
    assert "--no-shared-memory" not in (*plain.worker_args, *plain.kvstore_args)
    parsed = build_parser().parse_args(["kvstore", *config.kvstore_args])
    assert parsed.no_shared_memory
