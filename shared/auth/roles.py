"""Who may publish and subscribe to what on the control bus: one table, one row per role.

nats-server enforces it (shared/auth/server_config.py writes it into the server's config),
so a stolen gateway password cannot register a worker, and a worker's cannot submit
requests. `{id}` stands for the worker's own id: a deployment whose workers have their own
credentials (`kvstack up`) fills it in, so that a worker can beat, publish KV events and
serve requests only under its own name; credentials shared by every worker of a role
(compose's `--scale`) put `*` there instead.

Replies need no row: a service may answer the requests it receives (`allow_responses`),
and a requester hears answers on its own inbox (`_INBOX.<user>.>`, see credentials.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from shared import subjects

ID = "{id}"
ANY = "*"


@dataclass(frozen=True)
class Role:
    name: str
    publish: tuple[str, ...]  # events it sends and requests it makes
    subscribe: tuple[str, ...]  # events it hears and requests it serves

    def for_worker(self, worker_id: str) -> Role:
        """This role's subjects for one worker id (or ANY: every worker of the role)."""
        fill = lambda patterns: tuple(p.replace(ID, worker_id) for p in patterns)
        return Role(self.name, fill(self.publish), fill(self.subscribe))


def _service(name: str, publish: tuple[str, ...], subscribe: tuple[str, ...]) -> Role:
    """What every service does besides its own work: beat under its own id (and hear its
    own beats come back: its lease on the bus, shared/runtime/heartbeats.py), beat again when a
    conductor asks for a resync, answer `nats micro` discovery."""
    beat = subjects.heartbeat(name, ID)
    status = f"{subjects.PREFIX}.{name}.{ID}.status"
    return Role(name, (beat, *publish), (beat, subjects.kv_resync(), "$SRV.>", status, *subscribe))


# NOTE: a worker with --kv-pool mooncake reports the pool as the kvstore instance
# "<its id>-mooncake" (shared/kvpool/mooncake_pool.py); with credentials shared by a role (`*`)
# these name no subject a worker may use, and the conductor does not hear the pool
_MOONCAKE_POOL = (
    subjects.heartbeat("kvstore", f"{ID}-mooncake"),
    subjects.kv_events(f"{ID}-mooncake"),
)

ROLES: dict[str, Role] = {
    role.name: role
    for role in (
        _service(
            "gateway",
            publish=(
                subjects.place(),
                subjects.prefill_submit(ANY),
                subjects.abort(),
                subjects.request_done(),
            ),
            subscribe=(subjects.tokens(ANY), subjects.all_heartbeats()),
        ),
        _service(
            "conductor",
            publish=(
                subjects.kv_resync(),
                # NOTE: the failover lease and the placed-once records (docs/conductor.md)
                *subjects.key_value_access(subjects.CONDUCTOR_LEASE),
                *subjects.key_value_access(subjects.PLACEMENTS),
            ),
            subscribe=(
                subjects.place(),
                subjects.conductor_stats(),
                subjects.all_heartbeats(),
                subjects.all_kv_events(),
                subjects.request_done(),
            ),
        ),
        _service(
            "prefill",
            publish=(
                subjects.tokens(ANY),
                subjects.decode_reserve(ANY),
                subjects.decode_commit(ANY),
                subjects.kvstore_op(ANY, ANY),
                subjects.prefill_get(ANY),
                subjects.kv_events(ID),
                *_MOONCAKE_POOL,
            ),
            subscribe=(
                subjects.prefill_submit(ID),
                subjects.prefill_get(ID),
                subjects.worker_stats("prefill", ID),
                subjects.abort(),
                subjects.all_heartbeats(),
            ),
        ),
        _service(
            "decode",
            publish=(
                subjects.tokens(ANY),
                subjects.attention_op(ANY, ANY),
                subjects.worker_stats("attention-worker", ANY),
                subjects.kvstore_op(ANY, ANY),
                subjects.kv_events(ID),
                *_MOONCAKE_POOL,
            ),
            subscribe=(
                subjects.decode_reserve(ID),
                subjects.decode_commit(ID),
                subjects.worker_stats("decode", ID),
                subjects.abort(),
                subjects.all_heartbeats(),
            ),
        ),
        _service(
            "kvstore", publish=(subjects.kv_events(ID),), subscribe=(subjects.kvstore_op(ID, ANY),)
        ),  # its stats subject included
        _service(
            "attention-worker",
            publish=(),
            subscribe=(
                subjects.attention_op(ID, ANY),
                subjects.worker_stats("attention-worker", ID),
            ),
        ),
        # The operator's own tools (kvstack up's readiness check, python -m bench, tests):
        # everything. Keep its credentials where only the operator can read them.
        Role("admin", publish=(">",), subscribe=(">",)),
    )
}
