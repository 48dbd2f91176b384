"""Helpers for tests: waiting on a condition with a deadline instead of sleeping and hoping.

Import as ``from tests.helpers import wait_until`` (run pytest as ``python -m pytest`` from the
project root, so the root is on ``sys.path``).
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import psutil

if TYPE_CHECKING:
    from connectors import TopicAdmin

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str | Callable[[], str] = "condition not met",
) -> T:
    """Call ``predicate`` until it returns something truthy, and return that.

    Raises ``AssertionError`` with ``message`` (a string, or a callable for a message built at
    the deadline, e.g. with the last observed value) if ``timeout`` seconds pass first.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"{text} (waited {timeout:.1f}s)")
        time.sleep(interval)


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A throwaway certificate for 127.0.0.1/localhost and its key: (cert.pem, key.pem).

    Needs the ``openssl`` command (scripts/bootstrap.sh installs it); without it this fails."""
    openssl = shutil.which("openssl")
    assert openssl is not None, "the openssl command is missing (make test installs it)"
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert),
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def process_ended(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie its parent has not reaped yet has)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def topic_maker(topic_admin: TopicAdmin, made: list[str]) -> Callable[..., str]:
    """``make(partitions=1, config=None, *, prefix="test") -> name``: a new uuid-named topic,
    its name added to ``made`` (for the fixture that deletes them: ``topic_factory``)."""
    from connectors import TopicSpec

    def make(
        partitions: int = 1, config: Mapping[str, str] | None = None, *, prefix: str = "test"
    ) -> str:
        name = f"{prefix}-{uuid.uuid4().hex}"
        topic_admin.ensure_topics([TopicSpec(name, partitions=partitions, config=config or {})])
        made.append(name)
        return name

    return make
