"""Running a coordinator process: broker, state store, coordinator and API server together.

Start order (``CoordinatorApp.run``), each step undone in reverse on the way out:

1. the signal handlers (``SIGNALS``: the one place the process's signals are handled);
2. the HTTP listener, if configured, so that ``/healthz``, ``/readyz`` and ``/metrics`` answer
   from the start: a long restore reads "restoring state: ..." instead of a refused connection
   (the console's API answers 503 until the coordinator serves);
3. the embedded broker (when no bootstrap address is configured) and the broker profile;
4. the state store and the coordinator, which restores every queue from its changelog;
5. the gRPC API server with the ``grpc.health.v1`` service; then the process is ready.

A stop requested during 3. or 4. (waiting for Kafka, however long, or restoring) ends the
start at once: the process exits 0. The HTTP listener stops last, so that readiness says
"stopping" while the rest shuts down.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import faulthandler
import gc
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from connectors.kafka import client_settings, with_client_logging
from layer.api.access import Access
from layer.api.health import GrpcHealth
from layer.api.server import ApiServer
from layer.api.service import QueueStats
from layer.config import Config
from layer.coordinator.access import HttpAccess
from layer.coordinator.console import console_routes
from layer.coordinator.health import Health
from layer.coordinator.http import HttpListener, Router, health_routes
from layer.coordinator.outage import wait_for_profile
from layer.coordinator.service import Coordinator
from layer.exceptions import BrokerError, ConfigError
from layer.state.ownership import check_state
from layer.state.rocksdb import RocksDBStore, discard_state_dir

if TYPE_CHECKING:
    from connectors.embedded import EmbeddedBroker
    from layer.coordinator.metrics import Metrics

log = logging.getLogger(__name__)

Ready = Callable[[str, int], None]

#: a stop still under way this long after the signal dumps every thread's stack to stderr
STOP_DUMP_S = 30.0


class CoordinatorApp:
    """One coordinator process's parts, started in order and stopped in reverse."""

    def __init__(
        self,
        config: Config,
        ready: Ready | None = None,
        progress: Callable[[str], None] | None = None,
        http_ready: Ready | None = None,
        reset_state: bool = False,
    ) -> None:
        self.config = config
        self._reset_state = reset_state
        self.health = Health()
        # what only GET /metrics reads: without an HTTP listener neither the registry nor
        # prometheus_client (~30 ms of every start) is made
        self.metrics: Metrics | None = None
        if config.coordinator.http is not None:
            from layer.coordinator.metrics import Metrics

            self.metrics = Metrics(self.health)
        self._serving: Coordinator | None = None  # the console's: set once the API serves
        self._ready = ready
        self._progress = progress or (lambda line: log.info("%s", line))
        self._http_ready = http_ready
        self.stop_requested = asyncio.Event()
        self._http: HttpListener | None = None
        self._broker: EmbeddedBroker | None = None
        self._store: RocksDBStore | None = None
        self._coordinator: Coordinator | None = None
        self._grpc_health: GrpcHealth | None = None
        self._server: ApiServer | None = None
        self._stop_step = "not started"  # where a slow stop is (``_log_stop_waits``)
        c = config.coordinator
        # who may call what, on the gRPC API and on the HTTP listener's routes alike
        self.access = Access(
            tokens_file=c.tokens_file,
            auth_token=c.auth_token,
            admin_token=c.admin_token,
            mutual_tls=c.tls_client_ca is not None,
        )

    def signals(self) -> dict[signal.Signals, Callable[[], None]]:
        """The process's signal handlers: SIGINT and SIGTERM stop it, SIGHUP reloads the
        config file."""
        return {
            signal.SIGINT: self.request_stop,
            signal.SIGTERM: self.request_stop,
            signal.SIGHUP: self.request_reload,
        }

    def request_reload(self) -> None:
        try:
            self.access.reload()
        except ConfigError as exc:
            log.error("SIGHUP: tokens file not reloaded, its principals stay as they were: %s", exc)
        if self._coordinator is None:
            log.warning("SIGHUP: reload refused: the coordinator is not serving yet")
            return
        # the coordinator refuses it (and logs why) until it serves
        self._coordinator.reload_on_signal()

    def request_stop(self) -> None:
        if not self.stop_requested.is_set():
            # a stop that has not ended within STOP_DUMP_S prints every thread's stack to
            # stderr (the log): what it waits on (the process's last step, ``layer.cli``,
            # replaces the timer)
            faulthandler.dump_traceback_later(STOP_DUMP_S)
            # and the loop's own waits, which a thread dump shows only as the loop's select
            asyncio.get_running_loop().call_later(STOP_DUMP_S, self._log_stop_waits)
        self.health.stopping()
        self.stop_requested.set()

    def _log_stop_waits(self) -> None:
        """A stop still under way after ``STOP_DUMP_S``: which step, and where every task of
        the loop waits (the threads' stacks go to stderr at the same time)."""
        lines = [f"stop not ended after {STOP_DUMP_S:.0f}s, at: {self._stop_step}"]
        for task in asyncio.all_tasks():
            lines.append(f"  task {task.get_name()}: {_awaiting(task.get_coro())}")
        log.warning("%s", "\n".join(lines))

    async def run(self) -> int:
        """Run until a stop signal. Returns the process exit code (0 clean stop, 1 failure)."""
        loop = asyncio.get_running_loop()
        handled = self.signals()
        for sig, handler in handled.items():  # 1.
            loop.add_signal_handler(sig, handler)
        try:
            await self._start_http()  # 2.
            # the restore allocates per message too (a bulk backlog read, ~1,000,000): the
            # same collector settings, the modules imported so far frozen
            tune_gc(collect=False)
            coordinator = await self._unless_stopped(self._start_coordinator())  # 3. and 4.
            if coordinator is None:
                return 0  # stopped while it waited for Kafka (or restored): a clean stop
            tune_gc()
            await self._start_api(coordinator)  # 5.
            return await self._serve(coordinator)
        finally:
            self.health.stopping()
            await self._close()
            for sig in handled:
                with contextlib.suppress(Exception):
                    loop.remove_signal_handler(sig)

    async def _start_http(self) -> None:
        address = self.config.coordinator.http
        if address is None:
            return
        c = self.config.coordinator
        access = HttpAccess(self.access)
        router = Router(authorize=access.authorize)
        health_routes(router, self.health)
        if self.metrics is not None:  # made when an address is configured: always here
            from layer.coordinator.metrics import metrics_routes

            metrics_routes(router, self.metrics, c.metrics_right)
        console_routes(router, lambda: self._serving, visible=access.visible)
        self._http = HttpListener(address, router)
        port = await self._http.start()
        if self._http_ready is not None:
            self._http_ready(self._http.host, port)

    async def _unless_stopped(self, start: Awaitable[Coordinator]) -> Coordinator | None:
        """``start``, or None as soon as a stop is requested (``start`` is cancelled): a
        coordinator waiting for Kafka, however long, stops at once."""
        task = asyncio.ensure_future(start)
        stopped = asyncio.ensure_future(self.stop_requested.wait())
        try:
            await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        log.info("stopped before serving")
        return None

    async def _start_coordinator(self) -> Coordinator:
        config = self.config
        self.health.restoring("connecting to Kafka")
        bootstrap = config.broker.bootstrap_servers
        if bootstrap is None:
            from connectors.embedded import EmbeddedBroker  # psutil and the broker binary's finder

            self._broker = EmbeddedBroker()
            self._broker.start()
            bootstrap = self._broker.bootstrap_servers
            log.warning(
                "no bootstrap_servers configured: started an embedded in-memory broker at %s "
                "(everything is lost when this process stops; use it for development only)",
                bootstrap,
            )
        # waits (saying so once) while the broker does not answer: a coordinator started before
        # Kafka, or during an outage, serves once Kafka is there
        profile = await wait_for_profile(
            bootstrap,
            dict(config.broker.kafka),
            config.broker.profile,
            self._progress,
            health=self.health,
        )
        state_dir = Path(config.coordinator.state_dir)
        if self._reset_state:
            discard_state_dir(state_dir)  # rebuilt from the changelog below
        state_dir.mkdir(parents=True, exist_ok=True)
        self._store = RocksDBStore(state_dir)
        # A state directory that does not belong to this cluster raises StateMismatch here,
        # before anything is restored or served.
        settings = with_client_logging(client_settings(bootstrap, dict(config.broker.kafka)))
        while True:
            try:
                await asyncio.to_thread(
                    check_state,
                    self._store,
                    state_dir,
                    settings,
                    [config.coordinator.changelog_topic(q.name) for q in config.queues],
                    config_file=config.source,
                )
                break
            except BrokerError:
                # Kafka went away again since it answered above: wait for it once more
                await wait_for_profile(
                    bootstrap, dict(config.broker.kafka), config.broker.profile,
                    self._progress, health=self.health,
                )  # fmt: skip
        self._coordinator = Coordinator(
            config,
            self._store,
            bootstrap,
            profile,
            progress=self._progress,
            health=self.health,
            timings=self.metrics,
        )
        await self._coordinator.start()  # Health says restored at its end
        return self._coordinator

    async def _start_api(self, coordinator: Coordinator) -> None:
        c = self.config.coordinator
        tls = None
        if c.tls_cert is not None and c.tls_key is not None:
            tls = (c.tls_cert.read_bytes(), c.tls_key.read_bytes())
        client_ca = c.tls_client_ca.read_bytes() if c.tls_client_ca is not None else None
        self._grpc_health = GrpcHealth(self.health)
        self._server = ApiServer(
            coordinator,
            c.listen,
            c.auth_token,
            tls,
            health=self._grpc_health.servicer,
            access=self.access,
            tls_client_ca=client_ca,
            delivery_gate=coordinator.deliverable,
            delivery_check=coordinator.current_since,
            stale_after=coordinator.stale_after_s,
        )
        port = await self._server.start()
        # in a cluster: advertise this API and take a share of the queues
        host = c.listen.rpartition(":")[0].strip("[]")
        await coordinator.join(f"{advertised_host(host)}:{port}")
        self.health.serving()
        self._serving = coordinator

        async def figures() -> tuple[list[QueueStats], int]:
            return await coordinator.stats(), coordinator.rounds

        if self.metrics is not None:
            self.metrics.attach(figures)
        # after serving(): the first status a Check or Watch sees is the real one
        await self._grpc_health.start()
        if self._ready is not None:
            self._ready(c.listen.rpartition(":")[0], port)

    async def _serve(self, coordinator: Coordinator) -> int:
        run = asyncio.create_task(coordinator.run())
        stopped = asyncio.create_task(self.stop_requested.wait())
        done, _ = await asyncio.wait({run, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if run in done and run.exception() is not None:
            return 1
        return 0

    async def _close(self) -> None:
        started = time.monotonic()
        if self._coordinator is not None:
            self._stop_step = "leaving the cluster"
            try:  # a member of a cluster: not taken for dead while its API stops
                await self._coordinator.leaving()
            except Exception:
                log.exception("announcing the stop to the cluster failed")
        left = time.monotonic()
        self._stop_step = "stopping the API"
        if self._grpc_health is not None:
            await self._grpc_health.stop()  # watchers see NOT_SERVING before the server goes
        if self._server is not None:
            await self._server.stop(1.0)
        api = time.monotonic()
        if self._coordinator is not None:
            self._stop_step = "stopping the coordinator"
            await self._coordinator.stop()
        self._stop_step = "closing the state store, the broker and the HTTP listener"
        if self._store is not None:
            self._store.close()
        if self._broker is not None:
            self._broker.stop()
        if self._http is not None:
            await self._http.stop()
        self._stop_step = "stopped"
        # where a slow stop went (what is left after this line is the interpreter's exit)
        log.info(
            "stopped in %.2fs: left the cluster in %.2fs, API in %.2fs, the rest in %.2fs",
            time.monotonic() - started,
            left - started,
            api - left,
            time.monotonic() - api,
        )


def _awaiting(coro: object) -> str:
    """Where a suspended coroutine waits: its chain of awaits, outermost first (a task's own
    ``get_stack`` gives only the outermost frame of a suspended one)."""
    steps: list[str] = []
    while coro is not None and len(steps) < 20:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            steps.append(
                f"{frame.f_code.co_name} ({Path(frame.f_code.co_filename).name}:{frame.f_lineno})"
            )
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return " -> ".join(steps) or "no frame"


# The cyclic garbage collector's first threshold: container objects allocated (less those freed)
# between two young collections. Python's default (700) runs one every few hundred messages,
# since each message makes several (entry, changes, frames); the objects are freed by reference
# counting anyway, cycles are rare. Measured: the collector was 8% of the coordinator's CPU.
GC_THRESHOLD = 50_000


def tune_gc(collect: bool = True) -> None:
    """Before restoring, and again before serving: what was built so far (the modules, then
    what the restore built) lives long, so no collection scans it again (``gc.freeze``), and
    young collections run far less often (``GC_THRESHOLD``; measured on the bulk backlog read
    of a restore: 12% less CPU per message)."""
    if collect:
        gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD, older, oldest)


def run_loop(main: Coroutine[Any, Any, int]) -> int:
    """``asyncio.run(main)``, except that at the end the loop's default executor is shut down
    without waiting for its threads: once the coordinator has stopped, a thread still inside a
    Kafka call (a removal, a fence, a flush with Kafka away: each can wait 30-60 s for the
    broker) holds nothing the stop needs, and ``asyncio.run`` would join it before returning."""
    loop = asyncio.new_event_loop()
    executor = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="asyncio")
    loop.set_default_executor(executor)
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            left = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            executor.shutdown(wait=False, cancel_futures=True)
            asyncio.set_event_loop(None)
            loop.close()


def exit_now_if_stuck(code: int, grace: float) -> None:
    """After the stop: the threads still running get ``grace`` seconds in all; any left then
    (inside a Kafka call that waits for an absent broker) are named in the log and the process
    exits with ``code`` at once (the interpreter's own exit would join them). Everything that
    matters is closed by then (the state store, the API, the changelog writer)."""
    deadline = time.monotonic() + grace
    me = threading.current_thread()
    others = [t for t in threading.enumerate() if t is not me and not t.daemon]
    for thread in others:
        thread.join(max(deadline - time.monotonic(), 0.0))
    stuck = [t.name for t in others if t.is_alive()]
    if not stuck:
        return
    log.warning(
        "exiting with %d thread(s) still waiting (on Kafka, most likely): %s",
        len(stuck),
        ", ".join(sorted(stuck)),
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


async def serve(
    config: Config,
    ready: Ready | None = None,
    progress: Callable[[str], None] | None = None,
    http_ready: Ready | None = None,
    reset_state: bool = False,
) -> int:
    """Run until SIGINT/SIGTERM. Returns the process exit code (0 clean stop, 1 failure).

    ``reset_state`` discards the local state first (it is rebuilt from the changelog). A state
    directory that does not belong to the cluster raises ``StateMismatch`` before anything starts.
    """
    return await CoordinatorApp(config, ready, progress, http_ready, reset_state).run()


def advertised_host(host: str) -> str:
    """The host other members and clients reach a listener bound to ``host`` at."""
    if host in ("", "0.0.0.0", "::"):
        return socket.getfqdn()
    return host


def print_ready(host: str, port: int) -> None:
    # The line tests and scripts wait for: flushed at once.
    print(f"qlayer coordinator serving on {host}:{port}", flush=True)
    sys.stdout.flush()


def print_http_ready(host: str, port: int) -> None:
    # Printed before the restore starts: scripts can probe /readyz from here on.
    print(f"qlayer http on {host}:{port}", flush=True)
