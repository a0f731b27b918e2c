"""A process whose port another took between the choice and its bind is launched again on a
fresh port where its ports are its own to choose, and fails with its log where they are fixed.
The process is Python's own ``http.server``, which fails as a router does: its bind raises
"Address already in use"."""

from __future__ import annotations

import os
import socket
import sys

import pytest
import requests

from feather_bench.tools.server import (
    PORT_TAKEN,
    ServerError,
    SGLangRouter,
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
        self.args = [sys.executable, "-m", "http.server", str(self.port), "--bind", "127.0.0.1"]
        super().launch(append)


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
    assert PORT_TAKEN in server.log_path.read_text()


def test_a_fixed_port_that_is_taken_fails_with_the_log(tmp_path, taken_port):
    server = HttpServer(tmp_path / "http.log", [taken_port, free_port()], ports_fixed=True)
    with pytest.raises(ServerError, match=PORT_TAKEN):
        server.start()
    assert server.port == taken_port


def test_a_router_chooses_its_ports_at_launch_unless_given_one():
    urls = ["http://127.0.0.1:1"]
    assert not SGLangRouter(urls).ports_fixed
    fixed = SGLangRouter(urls, port=8123)
    assert fixed.ports_fixed and fixed.url.endswith(":8123")
