"""Running a coordinator process: broker, state store, coordinator and API server together."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from connectors.embedded import EmbeddedBroker
from connectors.kafka import detect_profile
from layer.api.server import ApiServer
from layer.config import Config
from layer.coordinator.service import Coordinator
from layer.state.rocksdb import RocksDBStore

log = logging.getLogger(__name__)


async def serve(
    config: Config,
    ready: Callable[[str, int], None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> int:
    """Run until SIGINT/SIGTERM. Returns the process exit code (0 clean stop, 1 failure)."""
    broker: EmbeddedBroker | None = None
    bootstrap = config.broker.bootstrap_servers
    if bootstrap is None:
        broker = EmbeddedBroker()
        broker.start()
        bootstrap = broker.bootstrap_servers
        log.warning(
            "no bootstrap_servers configured: started an embedded in-memory broker at %s "
            "(everything is lost when this process stops; use it for development only)",
            bootstrap,
        )
    profile = detect_profile(bootstrap, dict(config.broker.kafka), config.broker.profile)
    state_dir = Path(config.coordinator.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    store = RocksDBStore(state_dir)
    coordinator = Coordinator(config, store, bootstrap, profile, progress=progress)
    server: ApiServer | None = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    code = 0
    try:
        await coordinator.start()
        c = config.coordinator
        tls = None
        if c.tls_cert is not None and c.tls_key is not None:
            tls = (c.tls_cert.read_bytes(), c.tls_key.read_bytes())
        server = ApiServer(coordinator, c.listen, c.auth_token, tls)
        port = await server.start()
        host = config.coordinator.listen.rsplit(":", 1)[0]
        if ready is not None:
            ready(host, port)
        run = asyncio.create_task(coordinator.run())
        stopped = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({run, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if run in done and run.exception() is not None:
            code = 1
        stopped.cancel()
    finally:
        if server is not None:
            await server.stop(1.0)
        await coordinator.stop()
        store.close()
        if broker is not None:
            broker.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
    return code


def print_ready(host: str, port: int) -> None:
    # The line tests and scripts wait for: flushed at once.
    print(f"qlayer coordinator serving on {host}:{port}", flush=True)
    sys.stdout.flush()
