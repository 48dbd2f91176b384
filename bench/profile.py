"""Sampling the coordinator with py-spy while a throughput run goes through it.

``Sampler`` runs ``py-spy record --pid`` on the coordinator process (non-blocking: the target is
never paused) in raw "collapsed stack" format, sampling only the thread that holds the GIL: the
coordinator's Python work all runs under the one GIL, so that is what bounds it. ``summarize``
turns the stacks into the functions with the most self time (where the interpreter was) and
total time (on the stack), as shares of all samples, and the share of each thread. ``python -m bench.profile FILE.txt`` prints the summary of a file again.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from bench import harness
from bench.harness import ServiceUnavailable
from bench.kafka_systems import QLayer

RATE_HZ = 100
# "function (path/to/file.py:123)": one frame of py-spy's raw output
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def py_spy() -> str:
    """The py-spy executable beside this Python, or on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    found = str(here) if here.exists() else shutil.which("py-spy")
    if not found:
        raise ServiceUnavailable(
            "py-spy is not installed; install the bench extra: "
            ".venv/bin/pip install -e '.[bench]' (or leave profile out of --measures)"
        )
    return found


class Sampler:
    """``py-spy record`` on ``pid`` from ``start`` until ``stop`` (SIGINT makes it write out)."""

    def __init__(self, pid: int, out: Path, rate: int = RATE_HZ) -> None:
        self.pid = pid
        self.out = out
        self.rate = rate
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = out.with_suffix(".log")

    def start(self) -> None:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    py_spy(), "record", "--pid", str(self.pid), "--rate", str(self.rate),
                    "--format", "raw", "--nonblocking", "--threads", "--gil", "--output", str(self.out),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        # py-spy says "Sampling process ..." once attached; a failed attach exits at once
        deadline = time.monotonic() + 15
        while b"Sampling process" not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"py-spy did not attach: {self.log.read_text()[-500:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def _short_path(path: str) -> str:
    # the tree's own files by their path in the repo, libraries by their path in the library
    m = re.search(r"(?:^|/)((?:layer|connectors|bench)/[^/].*)$", path)
    if m and "site-packages/" not in path:
        return m.group(1)
    for marker in ("site-packages/", "lib/python3.", "lib/python3/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            return path.split("/", 1)[1] if marker == "lib/python3." else path
    return path


def _short(frame: str, line: bool = False) -> str:
    """``func (file:line)`` with a short file path; without the line unless ``line``."""
    m = _FRAME.match(frame)
    if not m:
        return frame
    where = _short_path(m.group("file"))
    if line and m.group("line"):
        where += f":{m.group('line')}"
    return f"{m.group('func')} ({where})"


def compact(raw: Path) -> Path:
    """Rewrite py-spy's raw output with short paths (no machine paths), line numbers on the leaf
    frame only, and equal stacks merged: still a collapsed-stack file for flame graph tools."""
    merged: Counter[str] = Counter()
    for text in _read(raw).splitlines():
        stack, _, count = text.rpartition(" ")
        if stack and count.isdigit():
            parts = stack.split(";")
            # the line only where the time was spent (the leaf): what a drill-down needs
            frames = [
                f if f.startswith("thread (") else _short(f, line=i == len(parts) - 1)
                for i, f in enumerate(parts)
            ]
            merged[";".join(frames)] += int(count)
    out = raw.with_name(raw.name + ".gz")
    with gzip.open(out, "wt") as f:
        f.writelines(f"{k} {v}\n" for k, v in sorted(merged.items()))
    raw.unlink()
    return out


def _read(path: Path) -> str:
    if path.suffix == ".gz":
        with gzip.open(path, "rt") as f:
            return f.read()
    return path.read_text()


# frames every sample of a thread passes through: they would top every "total" list
_PLUMBING = re.compile(
    r"\((<frozen runpy>|asyncio/(runners|base_events|events)\.py|threading\.py|"
    r"concurrent/futures/thread\.py|layer/cli\.py)\)$"
)


def summarize(raw: Path, top: int = 15) -> dict[str, Any]:
    """Top functions by self and by total samples from py-spy's raw (collapsed) output."""
    self_t: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total_t: Counter[str] = Counter()
    samples = 0
    for line in _read(raw).splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        parts = [f for f in stack.split(";") if f]
        if parts and parts[0].startswith("thread ("):
            # "thread (TID): NAME" with --threads; pool threads differ only by their number
            thread = re.sub(r"[_-]?\d+$", "", parts.pop(0).split(": ", 1)[-1])
            threads[thread] += n
        frames = [_short(f) for f in parts]
        if not frames:
            continue
        samples += n
        self_t[frames[-1]] += n
        for f in set(frames):  # a recursive function counts once per sample
            if not _PLUMBING.search(f):
                total_t[f] += n

    def table(c: Counter[str]) -> list[dict[str, Any]]:
        return [
            {"function": f, "samples": n, "share": round(n / max(1, samples), 4)}
            for f, n in c.most_common(top)
        ]

    return {
        "samples": samples,
        "rate_hz": RATE_HZ,
        "threads": table(threads),
        "top_self": table(self_t),
        "top_total": table(total_t),
    }


def render(summary: dict[str, Any]) -> str:
    lines = [f"{summary['samples']} samples at {summary['rate_hz']} Hz"]
    for key, title in (("threads", "thread"), ("top_self", "self"), ("top_total", "total")):
        lines.append(f"top by {title} time:")
        lines += [f"  {e['share'] * 100:5.1f}%  {e['function']}" for e in summary[key]]
    return "\n".join(lines)


class _SampledQLayer(QLayer):
    """qlayer whose coordinator is sampled from its start (consumers subscribed) to its stop."""

    def __init__(self, *a: Any, raw: Path) -> None:
        super().__init__(*a)
        self.raw = raw
        self.sampler: Sampler | None = None

    def create(self) -> dict[str, Any]:
        target = super().create()
        pid = self.coordinator(target).pid
        self.sampler = Sampler(pid, self.raw)
        self.sampler.start()
        self.proc = psutil.Process(pid)
        self.cpu0, self.wall0 = self._cpu(), time.monotonic()
        return target

    def _cpu(self) -> float:
        t = self.proc.cpu_times()
        return float(t.user + t.system)

    def delete(self, target: dict[str, Any]) -> None:
        if self.sampler is not None:
            self.cpu_cores = (self._cpu() - self.cpu0) / (time.monotonic() - self.wall0)
            self.sampler.stop()  # before the coordinator stops: its shutdown is not the run
        super().delete(target)


def profiled_throughput(
    bootstrap: str, workdir: Path, embedded: bool, window: int, n: int, raw: Path
) -> dict[str, Any]:
    """One more qlayer throughput run of ``n`` x 200 B with py-spy on the coordinator."""
    system = _SampledQLayer(bootstrap, workdir, embedded, window, raw=raw)
    result = harness.throughput(system, n, 200)
    raw = compact(raw)
    summary = summarize(raw)
    if system.sampler is not None:
        system.sampler.log.unlink(missing_ok=True)  # py-spy's own output: only needed on failure
    return {
        "tool": f"py-spy record --rate {RATE_HZ} --nonblocking --gil --threads --format raw",
        "what": "samples of the thread holding the GIL: where the coordinator's Python CPU goes "
        "(waits in native code that release the GIL, such as poll or select, are not in them)",
        "raw_file": raw.name,
        "throughput_while_sampled": result,
        # user + system CPU seconds of the coordinator per second of the run (both cores: 2.0)
        "coordinator_cpu_cores": round(system.cpu_cores, 2),
        **summary,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    p.add_argument(
        "raw", type=Path, help="a py-spy --format raw output file (or .gz), or a run's .json"
    )
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = p.parse_args(argv)
    raw: Path = args.raw
    if raw.suffix == ".json":  # a run's results: its profile sits beside it
        sibling = raw.with_name(raw.stem + "-pyspy.txt.gz")
        if not sibling.exists():
            p.error(f"{raw} is a run's results, and it has no profile beside it ({sibling.name})")
        raw = sibling
    if not raw.exists():
        p.error(f"{raw}: no such file")
    s = summarize(raw, args.top)
    print(json.dumps(s, indent=2) if args.json else render(s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
