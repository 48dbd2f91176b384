"""The peers' side of the memory and restart rows: server RSS per queued message, and
restart-to-serving with that many queued.

For each peer (its queue as in the other measures: RabbitMQ quorum queue, NATS JetStream
work-queue stream, Redis Streams consumer group):

1. A fresh, empty queue. The base is the resident memory (RSS) of the server process (the one
   listening on the peer's port: beam.smp, nats-server, redis-server) and the bytes of the files
   in its data directory, if it keeps one.
2. ``queued`` messages of 200 B are published as in the throughput runs (confirmed, pipelined),
   with no consumers. Once the queue counts them all and the RSS has settled,
   (RSS - base) / queued is the memory per message, and the data directory's growth / queued
   the disk per message.
3. The server is SIGKILLed (as qlayer's coordinator is) and started again with its start
   command. From that command: the time until a consumer receives a message (left unacked, so
   it stays queued), and until the queue counts all ``queued`` again. Redis keeps nothing on
   disk here: what is left after its restart is recorded, and no time.

A failed restart is recorded with its reason, keeping the memory figures; whatever happened, the
server is started again if it does not answer. Every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import psutil

from bench.harness import System, loadavg, settled_rss

log = logging.getLogger(__name__)

MESSAGE_BYTES = 200


class Peer(System, Protocol):
    """A system of ``bench.peers``, with what this module needs of its server."""

    port: int  # the server listens on it: that is how its process is found
    data_dir: Path | None  # where the server stores messages; None: in memory only
    start_command: str  # a shell command that starts the server detached

    def first_delivery(self, target: dict[str, Any]) -> bool:
        """Receive one message as a consumer and leave it unacked; False if none came."""
        ...


def _server(port: int) -> psutil.Process:
    """The local process listening on ``port``."""
    for c in psutil.net_connections("tcp"):
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid:
            return psutil.Process(c.pid)
    raise RuntimeError(f"no local process listens on port {port}")


def _disk(path: Path) -> int:
    """Bytes in the files under ``path``."""
    total = 0
    for d, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(FileNotFoundError):  # a log segment rolled over meanwhile
                total += os.lstat(os.path.join(d, f)).st_size
    return total


def _available(system: Peer) -> bool:
    importlib.import_module(system.worker_module).check_available()
    return True


def _since(what: str, done: Callable[[], bool], t0: float, timeout: float) -> float:
    """Seconds from ``t0`` until ``done`` is true; RuntimeError after ``timeout`` from ``t0``.

    An error counts as not yet (the server may still be starting); the last one is in the
    RuntimeError.
    """
    last: Exception | None = None
    while time.monotonic() - t0 < timeout:
        try:
            if done():
                return time.monotonic() - t0
        except Exception as exc:
            last = exc
        time.sleep(0.1)
    raise RuntimeError(
        f"{what}: not within {timeout:.0f} s"
        + (f" (last error: {type(last).__name__}: {last})" if last else "")
    )


def _start(system: Peer) -> None:
    """Run the start command, in its own session: the server must outlive this process."""
    with tempfile.TemporaryFile() as output:
        r = subprocess.run(
            system.start_command,
            shell=True,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            timeout=60,
            start_new_session=True,
        )
        if r.returncode:
            output.seek(0)
            said = output.read().decode(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(
                f"`{system.start_command}` exited with {r.returncode}: {' / '.join(said)}"
            )


def _ensure_up(system: Peer, timeout: float) -> None:
    """Start the server again unless it answers within 30 s: a restart must not leave it down."""
    try:
        _since(f"{system.name} up", lambda: _available(system), time.monotonic(), 30)
    except RuntimeError:
        log.warning("  %s does not answer after its restart; starting it again", system.name)
        with contextlib.suppress(RuntimeError):  # e.g. it is still starting: the wait tells
            _start(system)
        _since(f"{system.name} back up", lambda: _available(system), time.monotonic(), timeout)


def _restart(system: Peer, target: dict[str, Any], queued: int, timeout: float) -> dict[str, Any]:
    """SIGKILL the server, start it again: seconds to a first delivery and to all available."""
    server = _server(system.port)
    server.kill()
    server.wait(30)
    t0 = time.monotonic()
    _start(system)
    if system.data_dir is None:
        _since(f"{system.name} up again", lambda: _available(system), t0, timeout)
        left = system.outstanding(target)
        return {"messages_after_restart": left, "lost_on_restart": left < queued}
    serving = _since("a first delivery", lambda: system.first_delivery(target), t0, timeout)
    available = _since(
        f"all {queued} available", lambda: system.outstanding(target) >= queued, t0, timeout
    )
    return {
        "restart_serving_s": round(serving, 2),
        "restart_all_available_s": round(available, 2),
    }


def memory_and_restart(system: Peer, queued: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "queued": queued,
        "message_bytes": MESSAGE_BYTES,
        "restart_by": f"SIGKILL, then `{system.start_command}`",
        "loadavg_before": loadavg(),
    }
    # generous limits: a slow shared machine must not fail the run, a hung server must
    limit = 120 + queued / 2000
    target = system.create()
    try:
        server = _server(system.port)
        out["server_process"] = server.name()

        def rss() -> int:
            return int(server.memory_info().rss)

        base = settled_rss(rss)
        disk_base = _disk(system.data_dir) if system.data_dir else 0
        pub = system.publish(target, queued, MESSAGE_BYTES)
        out["ingest_s"] = round(pub.confirmed - pub.first, 2)
        out["ingest_msgs_per_s"] = round(queued / max(1e-9, pub.confirmed - pub.first))
        held = system.outstanding(target)
        if held < queued:
            raise RuntimeError(f"the queue holds {held} of the {queued} messages published")
        now = settled_rss(rss)
        out["rss_base_mib"] = round(base / 2**20, 1)
        out["rss_queued_mib"] = round(now / 2**20, 1)
        out["bytes_per_queued_message"] = round((now - base) / queued)
        if system.data_dir:
            growth = _disk(system.data_dir) - disk_base
            out["data_dir"] = str(system.data_dir)
            out["disk_growth_mib"] = round(growth / 2**20, 1)
            out["disk_bytes_per_queued_message"] = round(growth / queued)
        log.info(
            "  %s memory: %d B per queued message (%s RSS %.0f MiB at %d queued), disk %s B",
            system.name, out["bytes_per_queued_message"], out["server_process"],
            out["rss_queued_mib"], queued, out.get("disk_bytes_per_queued_message", "-"),
        )  # fmt: skip
        try:
            restarted = _restart(system, target, queued, limit)
            out.update(restarted)
            log.info("  %s restart: %s", system.name, restarted)
        except Exception as exc:
            out["restart_error"] = f"{type(exc).__name__}: {exc}"
            log.error("  %s restart failed: %s", system.name, out["restart_error"])
        finally:
            _ensure_up(system, limit)
    finally:
        try:
            system.delete(target)
        except Exception as exc:  # recorded in the log; the figures stand
            log.warning("could not delete %s's queue %s: %s", system.name, target, exc)
    out["loadavg_after"] = loadavg()
    return out
