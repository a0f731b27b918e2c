"""Start a real ``python -m sglang.launch_server`` (or ``sglang_router.launch_router``) under
a timeout, and stop it cleanly.

Used by ``make demo``, the benchmarks and the end-to-end tests. Each server runs in its own
process group so that stopping it also stops its scheduler and detokenizer subprocesses;
a server that does not become healthy in time is killed and its log tail is raised with the
error, so nothing ever hangs a test suite.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

READY_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 30.0


# SGLang's prefill line: ``[date time DPn] Prefill batch, ...`` from a --dp-size server,
# ``[date time] Prefill batch, ...`` from a server with one worker
PREFILL = re.compile(
    r"(?:DP(\d+)|\d\d:\d\d:\d\d)\] Prefill batch, #new-seq: (\d+), #new-token: (\d+), "
    r"#cached-token: (\d+)"
)


def per_worker(log_text: str, workers: int, skip: int = 0) -> list[dict]:
    """Each worker's requests admitted, prompt tokens computed and cached tokens, from the
    server log's prefill lines (the first ``skip`` lines of each worker left out: warm-up).
    Lines tagged ``DPn`` count for worker n, untagged ones (a one-worker server's) for worker 0."""
    rows = [
        {"worker": w, "requests": 0, "new_tokens": 0, "cached_tokens": 0} for w in range(workers)
    ]
    seen = [0] * workers
    for rank, seqs, new, cached in PREFILL.findall(log_text):
        w = int(rank or 0)
        seen[w] += 1
        if seen[w] <= skip:
            continue
        rows[w]["requests"] += int(seqs)
        rows[w]["new_tokens"] += int(new)
        rows[w]["cached_tokens"] += int(cached)
    return rows


def _log_file(log_path: str | os.PathLike | None, prefix: str) -> Path:
    """``log_path``, or a new temporary ``.log`` file named with ``prefix``."""
    return Path(log_path) if log_path else Path(tempfile.mkstemp(prefix=prefix, suffix=".log")[1])


def _exit_on_sigterm() -> None:
    """A SIGTERM to the program that started servers raises SystemExit in its main thread, so
    that the ``with`` blocks and ``finally`` clauses holding the servers stop them (Python's
    default action would leave them running). A handler already installed is kept."""
    import threading

    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


class ServerError(RuntimeError):
    """The server failed to start, died, or did not stop."""


def error_line(text: str) -> str | None:
    """The last line of a log (or an error's message) that names an error: what a failed start
    reports in one line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return next((line for line in reversed(lines) if "error" in line.lower()), None)


# A process that lost its port to another between the choice and its bind says so (Python's
# "Address already in use", uvicorn's "... address already in use"); the choice is retried
# this many times.
PORT_TAKEN = "address already in use"
PORT_RETRIES = 3


# Ports are chosen below the kernel's ephemeral range (where bind(0) and connect() take theirs,
# as a server's own gloo and TCPStore connections do while it starts) and below the range
# SGLang draws its internal ports from (22000-29999): a port chosen here and bound by the
# server only after its model loads is then not taken meanwhile by the server itself. (SGLang's
# own helper draws from 22000-29999 itself, and importing it costs seconds.)
PORT_RANGE = (10000, 21999)


def free_port() -> int:
    """A port nothing listens on now, from PORT_RANGE (bind(0)'s choice if none of a sample is
    free)."""
    for port in random.sample(range(PORT_RANGE[0], PORT_RANGE[1] + 1), 64):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _ServerProcess:
    """An HTTP server run as its own process group: ``start`` waits until ``ready_path``
    answers 200, ``stop`` ends the whole group. Subclasses set ``args``, ``env``, ``url``,
    ``log_path`` and ``ready_timeout_s`` in their ``__init__``."""

    ready_path = "/health"
    args: list[str]
    env: dict[str, str]
    url: str
    log_path: Path
    ready_timeout_s: float
    proc: subprocess.Popen | None = None
    returncode: int | None = None
    killed = False
    # False where ``launch`` chooses the ports afresh each time; True where they are fixed
    # (given by the caller, or handed to others before the launch, as a server's URL is)
    ports_fixed = True

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self) -> "_ServerProcess":
        self.launch()
        return self.wait_ready()

    def launch(self, append: bool = False) -> None:
        """Start the process and return at once (``wait_ready`` then waits for it): several
        servers launched one after another load their models at the same time. ``append``
        keeps the log of an earlier launch."""
        _exit_on_sigterm()
        self._log = open(self.log_path, "ab" if append else "wb")
        self._log_start = self._log.tell()
        self.returncode = None
        self.proc = subprocess.Popen(
            self.args,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )
        self._launched = time.monotonic()

    def wait_ready(self) -> "_ServerProcess":
        """Until ``ready_path`` answers 200, ``ready_timeout_s`` from the launch; a server that
        exits or is not ready by then is stopped and ServerError raised with its log tail.
        One whose port another process took meanwhile (it says so in its log, and exits or,
        as SGLang's launcher does, waits on its subprocesses) is stopped and launched again on
        fresh ports, up to PORT_RETRIES times, where its ports are its own to choose; where
        they are fixed it fails at once."""
        retries = PORT_RETRIES
        while time.monotonic() < self._launched + self.ready_timeout_s:
            exited, taken = self.proc.poll() is not None, self.port_taken()
            if exited or taken:
                if taken and retries and not self.ports_fixed:
                    retries -= 1
                    self.stop()
                    self.launch(append=True)
                    continue
                self.stop()
                what = f"exited with code {self.returncode}" if exited else "lost its port"
                raise ServerError(f"server {what} during start-up:\n{self.log_tail()}")
            try:
                if requests.get(self.url + self.ready_path, timeout=30).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(1.0)
        self.stop()
        raise ServerError(
            f"server not healthy after {self.ready_timeout_s:.0f} s:\n{self.log_tail()}"
        )

    def stop(self) -> int:
        """SIGTERM to the launcher (SGLang then stops its own subprocesses); if anything of the
        server's process group is still there after STOP_TIMEOUT_S, SIGKILL the group.
        Returns the launcher's exit code; ``self.killed`` says whether SIGKILL was needed."""
        if self.proc is None or self.returncode is not None:
            return self.returncode or 0
        self.killed = False
        try:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        if not self._wait_group_gone(STOP_TIMEOUT_S if self.proc.poll() is None else 10):
            self.killed = True
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._wait_group_gone(10)
        self.returncode = self.proc.wait(timeout=10)
        self._log.close()
        return self.returncode

    def _wait_group_gone(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.proc.poll()  # reap the launcher itself
            if not self.group_alive():
                return True
            time.sleep(0.2)
        return not self.group_alive()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def group_alive(self) -> bool:
        """True if any process of the server's process group is still running."""
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except ProcessLookupError:
            return False

    def port_taken(self) -> bool:
        """Whether this launch's log says its port was taken."""
        with open(self.log_path, "rb") as f:
            f.seek(self._log_start)
            return PORT_TAKEN in f.read().decode(errors="replace").lower()

    def log_text(self) -> str:
        self._log.flush() if not self._log.closed else None
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def __enter__(self) -> "_ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class SGLangServer(_ServerProcess):
    """``with SGLangServer(model, schedule_policy="feather") as server: server.url``.

    ``launcher`` is ``launch_server`` (``python -m sglang.launch_server``) or ``serve``
    (``sglang serve``). ``extra_args`` are passed through; on a host without a GPU the
    feather's CPU runtime fills in the CPU settings (see ``feather_cpu.server_defaults``).
    """

    ready_path = "/health_generate"

    def __init__(
        self,
        model_path: str | os.PathLike,
        schedule_policy: str = "fcfs",
        extra_args: list[str] | tuple[str, ...] = (),
        port: int | None = None,
        log_path: str | os.PathLike | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S,
        env: dict[str, str] | None = None,
        launcher: str = "launch_server",
    ) -> None:
        self.model_path = str(model_path)
        self.schedule_policy = schedule_policy
        self.extra_args = list(extra_args)
        self.ready_timeout_s = ready_timeout_s
        self.log_path = _log_file(log_path, "sglang-")
        if launcher == "launch_server":
            self.command = [sys.executable, "-m", "sglang.launch_server"]
        elif launcher == "serve":  # the `sglang` console script next to this interpreter
            self.command = [str(Path(sys.executable).with_name("sglang")), "serve"]
        else:
            raise ValueError(f"launcher must be 'launch_server' or 'serve', got {launcher!r}")
        self.ports_fixed = port is not None
        self._set_ports(port)
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.returncode: int | None = None
        self.killed = False

    def _set_ports(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [
            *self.command,
            "--model-path",
            self.model_path,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--schedule-policy",
            self.schedule_policy,
            *self.extra_args,
        ]

    def launch(self, append: bool = False) -> None:
        """A port not given is chosen afresh for a launch after the first (one whose port was
        taken): read ``url`` once the server is ready."""
        if append and not self.ports_fixed:
            self._set_ports()
        super().launch(append)


# The routers' packages and the module that launches each one.
ROUTER_MODULES = {"sglang-router": "sglang_router.launch_router", "smg": "smg.launch_router"}


class SGLangRouter(_ServerProcess):
    """``with SGLangRouter([w.url for w in workers], policy="cache_aware") as router: router.url``.

    ``python -m sglang_router.launch_router`` (the ``sglang-router`` package), or with
    ``router="smg"`` its successor ``python -m smg.launch_router`` (the ``smg`` package), in front
    of already running workers; ready once its ``/readiness`` answers 200 (every worker healthy).
    Its Prometheus exporter gets a free port too, so that routers started one after another,
    or beside other benchmarks, do not collide on the default one. ``extra_args`` are passed
    through (``--cache-threshold``, ``--balance-abs-threshold``, ...).
    """

    ready_path = "/readiness"

    def __init__(
        self,
        worker_urls: list[str],
        policy: str = "cache_aware",
        extra_args: list[str] | tuple[str, ...] = (),
        port: int | None = None,
        log_path: str | os.PathLike | None = None,
        ready_timeout_s: float = 120.0,
        env: dict[str, str] | None = None,
        router: str = "sglang-router",
    ) -> None:
        if router not in ROUTER_MODULES:
            raise ValueError(f"router {router!r}: allowed are {', '.join(ROUTER_MODULES)}")
        self.worker_urls = list(worker_urls)
        self.policy = policy
        self.extra_args = list(extra_args)
        self.module = ROUTER_MODULES[router]
        self.ports_fixed = port is not None
        self.ready_timeout_s = ready_timeout_s
        self.log_path = _log_file(log_path, "sglang-router-")
        self._set_ports(port)
        self.env = {**os.environ, **(env or {})}

    def _set_ports(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [
            sys.executable,
            "-m",
            self.module,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--worker-urls",
            *self.worker_urls,
            "--policy",
            self.policy,
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(free_port()),
            *self.extra_args,
        ]

    def launch(self, append: bool = False) -> None:
        """Ports not given are chosen now, not when the router was made: workers started in
        between open ports of their own."""
        if not self.ports_fixed:
            self._set_ports()
        super().launch(append)
