"""Real coordinator processes for integration and fault tests: start, SIGKILL, restart, wipe."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from connectors.embedded import bound_to_parent

ROOT = Path(__file__).resolve().parent.parent


def stop_report(log: str) -> str:
    """``CoordinatorProcess.stop_report`` of a log's text."""
    out: list[str] = []
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if "stop not ended after" in line:
            out.append(line)
            out.extend(x for x in lines[i + 1 : i + 200] if x.startswith("  task "))
    thread = None
    for line in lines:
        stripped = line.strip()
        if stripped.startswith(("Thread 0x", "Current thread 0x")):
            thread = stripped
        elif (
            thread is not None
            and stripped.startswith("File ")
            and ("/layer/" in stripped or "/connectors/" in stripped)
        ):
            out.append(f"{thread} {stripped}")
            thread = None
        elif not stripped:
            thread = None
    return "\n".join(out) or "(no stop report in the log)"


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, dict):  # an inline table
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} as TOML")


def write_config(
    path: Path,
    bootstrap: str,
    queues: Sequence[Mapping[str, Any]],
    coordinator: Mapping[str, Any] | None = None,
    broker: Mapping[str, Any] | None = None,
) -> Path:
    lines = ["[broker]", f"bootstrap_servers = {toml_value(bootstrap)}"]
    for k, v in (broker or {}).items():
        lines.append(f"{k} = {toml_value(v)}")
    lines.append("")
    lines.append("[coordinator]")
    for k, v in (coordinator or {}).items():
        lines.append(f"{k} = {toml_value(v)}")
    for q in queues:
        lines.append("")
        lines.append("[[queue]]")
        for k, v in q.items():
            lines.append(f"{k} = {toml_value(v)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def qlayer(
    *args: str, stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The CLI run as a user runs it (``python -m layer.cli``), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "layer.cli", *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class CoordinatorProcess:
    """``qlayer coordinator`` as a child process; ``address`` once it serves, ``http_address``
    once its HTTP listener listens (configured with ``http = "127.0.0.1:0"``)."""

    def __init__(self, config_path: Path, state_dir: Path, log_path: Path) -> None:
        self.config_path = config_path
        self.state_dir = state_dir
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.address: str | None = None
        self.http_address: str | None = None
        self.starts = 0
        self.listen = "127.0.0.1:0"  # set a fixed address to restart it where clients expect it
        self._reader: threading.Thread | None = None
        self._serving: tuple[threading.Event, list[str]] = (threading.Event(), [])

    def start(
        self, timeout: float = 60.0, until: str = "serving", extra_args: Sequence[str] = ()
    ) -> str:
        """Start and wait for the API (``until="serving"``: returns its address) or only for
        the HTTP listener, which comes up before the restore (``"http"``: returns its address)."""
        assert until in ("serving", "http")
        assert self.proc is None or self.proc.poll() is not None, "already running"
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        log.write(f"--- start {self.starts + 1} ---\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            bound_to_parent(
                [
                    sys.executable,
                    "-m",
                    "layer.cli",
                    "coordinator",
                    "--config",
                    str(self.config_path),
                    "--state-dir",
                    str(self.state_dir),
                    "--listen",
                    self.listen,
                    *extra_args,
                ]
            ),
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
        )
        log.close()
        self.starts += 1
        found: list[str] = []
        done = threading.Event()
        self._serving = (done, found)
        http_found: list[str] = []
        http_done = threading.Event()

        def read() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            with self.proc.stdout:
                for raw in self.proc.stdout:
                    line = raw.decode(errors="replace").strip()
                    if line.startswith("qlayer http on "):
                        http_found.append(line.rsplit(" ", 1)[1])
                        http_done.set()
                    if line.startswith("qlayer coordinator serving on "):
                        found.append(line.rsplit(" ", 1)[1])
                        done.set()
            done.set()
            http_done.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        if until == "http":
            if not http_done.wait(timeout) or not http_found:
                self.kill()
                raise AssertionError(
                    f"no HTTP listener within {timeout}s; log tail:\n{self.log_tail()}"
                )
            self.http_address = http_found[0]
            return self.http_address
        address = self.wait_serving(timeout)
        # the reader saw the HTTP line, if any, before the serving line
        self.http_address = http_found[0] if http_found else None
        return address

    def wait_serving(self, timeout: float = 60.0) -> str:
        """Wait for the API of the process ``start`` started; returns its address."""
        done, found = self._serving
        if not done.wait(timeout) or not found:
            self.kill()
            raise AssertionError(
                f"coordinator did not start within {timeout}s; log tail:\n{self.log_tail()}"
            )
        self.address = found[0]
        return self.address

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop_report(self) -> str:
        """Where a stop that did not end waited, from the log since the last start: the
        coordinator's own "stop not ended" lines (its step, each task's awaits) and, of the
        thread dump that comes with them, each thread's innermost frame in qlayer's code."""
        try:
            text = self.log_since_start()
        except OSError:
            return "(no log)"
        return stop_report(text)

    def log_since_start(self) -> str:
        """The log's text since the last start (``start`` marks each one in it)."""
        return self.log_path.read_text(errors="replace").rsplit("--- start ", 1)[-1]

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self._join_reader()

    def _join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(10)
            self._reader = None

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._join_reader()
        return self.proc.returncode

    def wipe_state(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "wipe a stopped coordinator"
        shutil.rmtree(self.state_dir, ignore_errors=True)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


#: what a member logs when it stops on its own after losing its session: its revocation found
#: that another member claimed its partitions (``layer.coordinator.seat.Seat.revoked``), or its
#: changelog writer is gone (``layer.state.changelog.DurableChangelog._dead``, every cause
#: alike): fenced by the member that took its queues over (woken from a stop before the group
#: told it), or failed where a cluster member does not replace it, or replaced and found its
#: queues taken
SELF_STOPS = ("lost (session timed out)", "nothing more is committed here")


def stopped_on_its_own(coord: CoordinatorProcess) -> bool:
    """Whether ``coord`` exited after saying, since its last start, one of ``SELF_STOPS``: a
    member that did not run for seconds (a stall of the host) must stop so, and a supervisor
    starts it again."""
    if coord.proc is None or coord.running:
        return False
    since_start = coord.log_since_start()
    return any(said in since_start for said in SELF_STOPS)


def start_worker(
    addr_file: Path, queue: str, log: Path, stop_file: Path, name: str, backlog: int = 10
) -> subprocess.Popen[bytes]:
    """A consumer process (tests/fault/worker.py) that follows the coordinator address in
    ``addr_file``, acks what it gets, records it in ``log`` and exits once ``stop_file`` exists."""
    return subprocess.Popen(
        bound_to_parent([
            sys.executable, str(ROOT / "tests" / "fault" / "worker.py"),
            "--addr-file", str(addr_file), "--queue", queue, "--log", str(log),
            "--stop-file", str(stop_file), "--backlog", str(backlog), "--name", name,
        ]),
        cwd=ROOT,
    )  # fmt: skip


def worker_events(log_dir: Path) -> list[dict[str, Any]]:
    """Every event the workers of ``start_worker`` logged as ``worker-*.jsonl`` in ``log_dir``,
    in time order."""
    events = []
    for f in sorted(log_dir.glob("worker-*.jsonl")):
        text = f.read_text()
        # a worker may be writing its last line right now: only complete lines count
        for line in text[: text.rfind("\n") + 1].splitlines():
            if line.strip():
                events.append(json.loads(line))
    events.sort(key=lambda e: e["t"])
    return events


def serving(client: Any, queues: Iterable[str]) -> bool:
    """Whether every queue answers stats through ``client``'s cluster member (forwarded to its
    owner, which has restored it); False while some member owns none of them yet."""
    from layer.exceptions import NotOwner

    try:
        for q in queues:
            client.stats(q)
    except NotOwner:
        return False
    return True


def start_cluster_members(
    tmp_path: Path, bootstrap: str, cluster: str, tables: list[dict[str, str]]
) -> list[CoordinatorProcess]:
    """Two members of ``cluster`` started one after the other, the first with the queues'
    ``tables`` in its configuration (the cluster shares them), the second with none."""
    members = []
    for n in range(2):
        home = tmp_path / f"member-{n}"
        home.mkdir()
        cfg = write_config(
            home / "qlayer.toml",
            bootstrap,
            tables if n == 0 else [],
            coordinator={"id": f"m{n}-{cluster}", "cluster": cluster},
        )
        proc = CoordinatorProcess(cfg, home / "state", home / "coordinator.log")
        proc.start()
        members.append(proc)
    return members
