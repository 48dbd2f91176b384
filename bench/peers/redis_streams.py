"""Redis Streams: pipelined XADD, a consumer group, XREADGROUP with COUNT, batched XACK.

Client: redis-py. The publisher pipelines up to ``PUBLISH_WINDOW`` XADDs per round trip; each
consumer reads up to ``count`` entries per XREADGROUP (blocking up to 50 ms when idle) and acks
them with one XACK. The server is at ``BENCH_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``).
"""

from __future__ import annotations

import os
import time
import uuid
from importlib.metadata import version
from typing import Any
from urllib.parse import urlparse

import redis
import redis.exceptions

from bench.harness import (
    PUBLISH_WINDOW,
    Pacer,
    Published,
    Recorder,
    ServiceUnavailable,
    payload,
)

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
START = (
    'redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" '
    "--appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log"
)
DEFAULT_COUNT = 100
_FIELD = b"d"


def _client() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)


def check_available() -> None:
    """Raise ``ServiceUnavailable`` unless the server answers PING."""
    client = _client()
    try:
        client.ping()
    except (redis.exceptions.RedisError, OSError) as exc:
        where = client.connection_pool.connection_kwargs
        raise ServiceUnavailable(
            f"Redis is not reachable at {where.get('host')}:{where.get('port')} "
            f"({type(exc).__name__}: {exc}); start it with: {START}"
        ) from exc
    finally:
        client.close()


class RedisPeer:
    name = "redis"
    worker_module = "bench.peers.redis_streams"
    # the server process, for bench.peer_memory: found by its port; it keeps nothing on disk
    port = urlparse(REDIS_URL).port or 6379
    data_dir = None
    start_command = START

    def __init__(self, count: int = DEFAULT_COUNT, window: int = PUBLISH_WINDOW) -> None:
        self.count = count
        self.window = window
        self._settings: dict[str, Any] | None = None

    def create(self) -> dict[str, Any]:
        uid = uuid.uuid4().hex[:10]
        target = {"stream": f"qbench:{uid}", "group": f"qbench-{uid}", "count": self.count}
        with _client() as r:
            r.xgroup_create(target["stream"], target["group"], id="0", mkstream=True)
        return target

    def delete(self, target: dict[str, Any]) -> None:
        with _client() as r:
            r.delete(target["stream"])

    def outstanding(self, target: dict[str, Any]) -> int:
        # entries read but not acked (pending) plus entries nobody has read yet (lag)
        with _client() as r:
            if not r.exists(target["stream"]):
                return 0  # gone with a restart: the server keeps nothing on disk
            for g in r.xinfo_groups(target["stream"]):
                if g["name"].decode() == target["group"]:
                    return int(g["pending"]) + int(g.get("lag") or 0)
        raise RuntimeError(f"consumer group {target['group']} vanished")

    def publish(
        self, target: dict[str, Any], n: int, size: int, rate: float = 0.0, seconds: float = 0.0
    ) -> Published:
        key = target["stream"]
        with _client() as r:
            pipe = r.pipeline(transaction=False)
            pacer = Pacer(rate, seconds)
            first = time.time()
            i = 0
            while i < n and not pacer.over():
                wait = pacer.wait(i)
                if wait > 0:
                    time.sleep(wait)
                # everything due now goes in one round trip
                while i < n and len(pipe) < self.window and pacer.wait(i) <= 0:
                    pipe.xadd(key, {_FIELD: payload(size, i)})
                    i += 1
                pipe.execute()
            last = time.time()
        return Published(i, first, last, last)

    def settings(self) -> dict[str, Any]:
        if self._settings is None:
            with _client() as r:
                server = r.info("server")["redis_version"]
                conf = r.config_get("appendonly")
                conf.update(r.config_get("save"))
            self._settings = {
                "client": f"redis-py {version('redis')}",
                "server": f"Redis {server}",
                "queue": "one stream, one consumer group, a named consumer per process",
                "durability": f"in memory (appendonly={conf.get('appendonly')!s}, "
                f"save={conf.get('save')!r})",
                "publish": f"pipelined XADD, up to {self.window} per round trip",
                "xreadgroup_count": self.count,
                "ack": "one XACK per XREADGROUP batch",
            }
        return self._settings


def consume(target: dict[str, Any], rec: Recorder, stop: Any) -> None:
    """A consumer process: read a batch, record it, ack it with one XACK."""
    key, group = target["stream"], target["group"]
    name = f"consumer-{rec.index}"
    with _client() as r:
        rec.ready()
        while not stop.is_set():
            # the short block keeps the stop check prompt; a reply comes as soon as one entry is in
            resp = r.xreadgroup(group, name, {key: ">"}, count=target["count"], block=50)
            if not resp:
                continue
            ids = []
            for entry_id, fields in resp[0][1]:
                rec.delivered(fields[_FIELD])
                ids.append(entry_id)
            r.xack(key, group, *ids)
            rec.acked(len(ids))
