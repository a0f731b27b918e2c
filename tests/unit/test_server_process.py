"""A process whose port another took between the choice and its bind is launched again on a
fresh port where its ports are its own to choose, and fails with its log where they are fixed.
The process is Python's own ``http.server``, which fails as a router does: its bind raises
"Address already in use". Run beside a child process of its own, it fails as SGLang's launcher
does: it says so, then waits for the child instead of exiting."""

from __future__ import annotations

import os
import socket
import sys
import time

import pytest
import requests

from feather_bench.tools.server import (
    PORT_RANGE,
    PORT_TAKEN,
    ServerError,
    SGLangRouter,
    SGLangServer,
    _ServerProcess,
    free_port,
)


class HttpServer(_ServerProcess):
    ready_path = "/"

    def __init__(self, log_path, ports: list[int], ports_fixed: bool) -> None:
        self.ports = iter(ports)
        self.ports_fixed = ports_fixed
        self.log_path = log_path
        self.ready_timeout_s = 30.0
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def launch(self, append: bool = False) -> None:
        self.port = next(self.ports)
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [sys.executable, *self.program, str(self.port), "--bind", "127.0.0.1"]
        super().launch(append)

    program = ["-m", "http.server"]


class HangingHttpServer(HttpServer):
    """``http.server`` started after a child process that outlives it: when its bind fails it
    prints the error and then waits for the child, as SGLang's launcher waits for its
    scheduler when uvicorn cannot bind."""

    program = [
        "-c",
        "import multiprocessing, runpy, time\n"
        "if __name__ == '__main__':\n"
        "    multiprocessing.Process(target=time.sleep, args=(600,)).start()\n"
        "    runpy.run_module('http.server', run_name='__main__')\n",
    ]


@pytest.fixture
def taken_port():
    """A port bound by this process (not listening: a request to it is refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_a_port_taken_meanwhile_is_chosen_again(tmp_path, taken_port):
    server = HttpServer(tmp_path / "http.log", [taken_port, free_port()], ports_fixed=False)
    with server:
        assert server.port != taken_port
        assert requests.get(server.url, timeout=10).status_code == 200
    # the failed launch's log is kept ahead of the one that served
    assert PORT_TAKEN in server.log_path.read_text().lower()


def test_a_launcher_that_waits_after_losing_its_port_is_stopped_and_launched_again(
    tmp_path, taken_port
):
    server = HangingHttpServer(tmp_path / "http.log", [taken_port, free_port()], ports_fixed=False)
    started = time.monotonic()
    with server:
        # well before the 30 s ready timeout: the lost port was read in the log, not waited out
        assert time.monotonic() - started < 25
        assert server.port != taken_port
        assert requests.get(server.url, timeout=10).status_code == 200
    assert PORT_TAKEN in server.log_path.read_text().lower()
    assert not server.group_alive()


def test_a_fixed_port_that_is_taken_fails_with_the_log(tmp_path, taken_port):
    server = HttpServer(tmp_path / "http.log", [taken_port, free_port()], ports_fixed=True)
    with pytest.raises(ServerError, match="(?i)" + PORT_TAKEN):
        server.start()
    assert server.port == taken_port


def test_a_fixed_port_lost_by_a_waiting_launcher_fails_at_once_and_leaves_nothing(
    tmp_path, taken_port
):
    server = HangingHttpServer(tmp_path / "http.log", [taken_port], ports_fixed=True)
    started = time.monotonic()
    with pytest.raises(ServerError, match="lost its port"):
        server.start()
    assert time.monotonic() - started < 25
    assert not server.group_alive()


def test_a_router_chooses_its_ports_at_launch_unless_given_one():
    urls = ["http://127.0.0.1:1"]
    assert not SGLangRouter(urls).ports_fixed
    fixed = SGLangRouter(urls, port=8123)
    assert fixed.ports_fixed and fixed.url.endswith(":8123")


def test_a_server_chooses_its_port_again_only_when_not_given_one(tmp_path):
    free = SGLangServer("m", log_path=tmp_path / "a.log")
    assert not free.ports_fixed
    first = free.port
    free._set_ports()
    assert free.url.endswith(f":{free.port}") and str(free.port) in free.args
    assert first in range(PORT_RANGE[0], PORT_RANGE[1] + 1)
    fixed = SGLangServer("m", port=8123, log_path=tmp_path / "b.log")
    assert fixed.ports_fixed and fixed.url.endswith(":8123")


def test_ports_are_chosen_below_the_ephemeral_range():
    """Outgoing connections and bind(0) take their ports from the ephemeral range, so a port
    chosen there may be taken before the server binds it."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(PORT_RANGE[0] <= p <= PORT_RANGE[1] < ephemeral_low for p in ports)
