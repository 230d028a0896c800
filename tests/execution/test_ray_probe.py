"""--ray-address names something that accepts a connection but is not Ray (a web server, a socket
that never speaks): the probe tells it from a Ray head within its limit, without Ray, and the
CLI refuses it in one line, where ray.init would wait a minute or more."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
import time

import pytest
from clihelp import assert_one_line_error, run_cli
from procs import RAY_ENV, free_port, ray_head

from sglfix.execution.ray_probe import ANSWER_S, probe_ray

FAST = "triton-decode@cg=eager,gpu_only=off"
ENV = RAY_ENV


@pytest.fixture
def silent():
    """A listening socket that never reads or writes: the kernel accepts for it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


@pytest.fixture
def web():
    """A plain HTTP/1 server (``python -m http.server``)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    thread.join(5)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def closing():
    """A server that accepts each connection and closes it at once."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    stop = threading.Event()

    def serve() -> None:
        s.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = s.accept()
            except OSError:
                continue
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield s.getsockname()[1]
    stop.set()
    thread.join(5)
    s.close()


def _timed(port: int) -> tuple[str | None, float]:
    t0 = time.monotonic()
    why = probe_ray("127.0.0.1", port)
    return why, time.monotonic() - t0


def test_a_socket_that_never_speaks_is_not_ray_within_the_limit(silent):
    why, took = _timed(silent)
    assert why is not None and "says nothing" in why, why
    assert ANSWER_S <= took < ANSWER_S + 1.0, took


def test_an_http1_server_is_not_ray(web):
    why, took = _timed(web)
    assert why is not None and "HTTP/1" in why, why
    assert took < ANSWER_S, took


def test_a_server_that_closes_at_once_is_not_ray(closing):
    why, _ = _timed(closing)
    assert why is not None and "accepts a connection" in why, why


def test_nothing_listening_is_an_oserror_for_the_caller_to_word():
    with pytest.raises(OSError):
        probe_ray("127.0.0.1", free_port())


def test_the_probe_never_imports_ray(web):
    code = (
        "import sys; from sglfix.execution.ray_probe import probe_ray; "
        f"print(probe_ray('127.0.0.1', {web})); assert 'ray' not in sys.modules"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "HTTP/1" in r.stdout, r.stderr


@pytest.fixture(scope="module")
def head():
    """A Ray head of its own, torn down with its process group."""
    pytest.importorskip("ray", reason="the test extra installs ray")
    with ray_head(num_cpus=1) as port:
        yield port


def test_a_real_ray_head_is_accepted(head):
    for _ in range(3):  # every connection is answered the same
        why, took = _timed(head)
        assert why is None and took < ANSWER_S, (why, took)


def test_the_cli_joins_a_real_ray_head(head):
    r = run_cli("ray-workers", "--ray-address", f"127.0.0.1:{head}", env=ENV, timeout=120, subprocess=True)
    assert r.code == 0 and "no kept sglfix workers" in r.out, r.out + r.err


@pytest.mark.parametrize("server,needle", [("silent", "says nothing"), ("web", "HTTP/1")])
def test_the_cli_refuses_an_address_that_is_not_ray_in_one_line(request, server, needle):
    address = f"127.0.0.1:{request.getfixturevalue(server)}"
    for argv in (
        ["ray-workers", "--ray-address", address],
        ["run", "--executor", "ray", "--ray-address", address, "-s", FAST, "--device", "cpu"],
    ):
        t0 = time.monotonic()
        r = run_cli(*argv, env=ENV, timeout=20, subprocess=True)
        took = time.monotonic() - t0
        assert_one_line_error(r, f"--ray-address {address} is not a Ray head", needle)
        assert took < 5, (argv, took)
