"""Whether ``--ray-address host:port`` is a Ray cluster, asked in about a second without importing Ray.

Ray's GCS server, and the Ray client server behind ``ray://``, speak gRPC over cleartext HTTP/2.
An HTTP/2 server answers a client's connection preface (the ``PRI * HTTP/2.0`` line and a SETTINGS
frame) with a SETTINGS frame of its own at once. Anything else that accepts the connection (a web
server, a database, a socket that never speaks) answers otherwise, closes, or says nothing; and
``ray.init`` given such an address waits a minute or more before it gives up. So the address is
asked this one question first, and refused in a line when the answer is not HTTP/2.
"""

from __future__ import annotations

import os
import socket
import time

from sglfix.common.errors import ConfigError

__all__ = ["ANSWER_S", "check_ray_address", "probe_ray", "quiet_ray_logs"]

# A GCS sends its SETTINGS as soon as it reads the preface: one round trip, milliseconds on a
# network, seconds nowhere. The wait stays short so that a refusal, with the command's own
# start-up, takes less than the 3 s any refusal may.
ANSWER_S = 1.5

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# A SETTINGS frame with no settings: length 0, type 0x4, no flags, stream 0.
_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_FRAME_HEADER = 9
_SETTINGS_TYPE = 0x4


def _tls() -> bool:
    # A cluster with Ray's TLS on speaks gRPC inside TLS, and its handshake needs the cluster's
    # certificates: only the connection is checked there.
    return os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")


def probe_ray(host: str, port: int, *, connect_s: float = 3.0, answer_s: float = ANSWER_S) -> str | None:
    """None when ``host:port`` answers as a gRPC server does (a Ray GCS, or a Ray client server);
    otherwise why it is not one, in words that follow ``--ray-address ADDR is not a Ray head:``.

    OSError when nothing accepts a connection within ``connect_s`` (the caller words that);
    ``answer_s`` bounds the wait for the answer once connected."""
    with socket.create_connection((host, port), timeout=connect_s) as conn:
        if _tls():
            return None
        got, ended = _exchange(conn, answer_s)
    if len(got) >= _FRAME_HEADER and got[3] == _SETTINGS_TYPE and got[5:9] == b"\x00\x00\x00\x00":
        return None
    if got.startswith((b"HTTP/", b"<")):  # a status line, or an HTTP/0.9 page (no status line)
        return "it answers HTTP/1 (a web server?)"
    if got[:2] == b"\x15\x03":  # a TLS alert: it wanted a TLS handshake
        return "it answers TLS (for a Ray cluster with TLS on, set RAY_USE_TLS=1 and its certificates)"
    if got:
        shown = got.decode("ascii", "backslashreplace")
        return f"it answers {shown!r}, not HTTP/2 (the gRPC a Ray head speaks)"
    return ended


def _exchange(conn: socket.socket, answer_s: float) -> tuple[bytes, str]:
    """The preface sent; the answer's first bytes (up to a frame header) and how the wait ended
    when they are fewer, in words."""
    deadline = time.monotonic() + answer_s
    got = b""
    try:
        conn.settimeout(answer_s)
        conn.sendall(_PREFACE + _SETTINGS)
        while len(got) < _FRAME_HEADER:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            conn.settimeout(left)
            chunk = conn.recv(_FRAME_HEADER - len(got))
            if not chunk:
                return got, "it accepts a connection and closes it without a word"
            got += chunk
    except TimeoutError:
        return got, f"it accepts a connection but says nothing in {answer_s:g} s"
    except ConnectionError as exc:
        return got, f"it accepts a connection, then drops it ({exc.strerror or type(exc).__name__})"
    return got, ""


def check_ray_address(address: str | None) -> None:
    """``--ray-address``: ``auto``, or ``[ray://]host:port`` that answers as a Ray head (gRPC)
    within a few seconds (one line otherwise, before Ray is imported)."""
    if address is None or address == "auto":
        return
    text = address.removeprefix("ray://")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--ray-address {address!r}: give auto or host:port (e.g. 10.0.0.5:6379)")
    try:
        why = probe_ray(host.strip("[]"), int(port), connect_s=3.0)
    except OSError as exc:
        raise ConfigError(
            f"--ray-address {address}: nothing answers there ({exc.strerror or exc}); start the Ray "
            f"head (ray start --head) or give its address"
        ) from None
    # Ray's own join would wait a minute or more on a server that is not Ray before it gives up.
    if why is not None:
        raise ConfigError(
            f"--ray-address {address} is not a Ray head: {why}; give the address ray start --head "
            f"prints (e.g. 10.0.0.5:6379) or ray://head:10001"
        )


def quiet_ray_logs() -> None:
    """Ray's own warnings (token authentication on or off, and the like) are not this command's
    output: the CLI keeps Ray's loggers at ERROR. A library user of RayPool keeps theirs."""
    import logging

    logging.getLogger("ray").setLevel(logging.ERROR)
