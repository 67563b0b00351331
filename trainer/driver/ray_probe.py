"""Is a Ray cluster answering at an address? Asked with a deadline, before ``ray.init`` is.

``ray.init(address=...)`` retries an unreachable GCS for many minutes (13 min 47 s measured with
127.0.0.1:1) and prints only C++ warnings meanwhile. The GCS is a gRPC server, and every gRPC
server answers the HTTP/2 connection preface with a SETTINGS frame (RFC 9113, section 3.4), so
"a TCP connection opens and a SETTINGS frame comes back" tells within seconds whether anything
that could be Ray listens there. It is retried until the deadline, for a head node that is still
starting.

A head that answers may still refuse this process: under Ray's token authentication
(RAY_AUTH_MODE=token) a driver without the cluster's token is turned away, and ``ray.init`` retries
that for about 30 s before saying only "Failed to connect to Ray cluster". ``check_token`` asks once
and raises RayTokenRefusedError with Ray's own words, which name the token and where Ray looks for it.
"""

from __future__ import annotations

import socket
import time

DEFAULT_CONNECT_TIMEOUT_S = 30.0
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # length 0, type SETTINGS, no flags, stream 0
SETTINGS_TYPE = 0x04
RETRY_PAUSE_S = 0.5


class RayUnreachableError(ConnectionError):
    """Nothing that answers like a Ray head node listens at the address within the deadline."""


class RayTokenRefusedError(RayUnreachableError):
    """A Ray head node answers at the address but refuses this process's authentication token."""


def host_port(address: str) -> tuple[str, int]:
    """("10.0.0.1", 6379) of "10.0.0.1:6379", "ray://10.0.0.1:10001" or "[::1]:6379"."""
    rest = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected host:port, got {address!r}")
    return host.strip("[]"), int(port)


def _answers_http2(host: str, port: int, timeout_s: float) -> str | None:
    """None if a gRPC (HTTP/2) server answers at host:port, else why not."""
    try:
        conn = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    with conn:
        try:
            conn.settimeout(timeout_s)
            conn.sendall(HTTP2_PREFACE + EMPTY_SETTINGS)
            header = conn.recv(9)
        except OSError:
            header = b""
    if len(header) < 4 or header[3] != SETTINGS_TYPE:
        return "a connection opens but nothing there answers as a gRPC server does (not a Ray head node?)"
    return None


def wait_for_ray(address: str, timeout_s: float, option: str) -> None:
    """Return once a Ray head node answers at ``address``; raise RayUnreachableError after ``timeout_s``,
    and RayTokenRefusedError at once where the head refuses this process's token (check_token).

    ``option`` names what sets the deadline, for the message (``--rl-ray-timeout``)."""
    host, port = host_port(address)
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        problem = _answers_http2(host, port, max(min(left, 5.0), 0.1))
        if problem is None:
            check_token(address)
            return
        if time.monotonic() + RETRY_PAUSE_S >= deadline:
            raise RayUnreachableError(
                f"no Ray cluster answered at {address} within {timeout_s:g} s ({problem}); check that the "
                f"head node is up and the address is its GCS host:port, or allow longer with {option}"
            )
        time.sleep(RETRY_PAUSE_S)


def check_token(address: str) -> None:
    """Raise RayTokenRefusedError if the head at ``address`` refuses this process's token (or its
    lack of one); else return. Anything else that goes wrong is left to ``ray.init`` to report,
    as on a Ray too old for token authentication."""
    try:
        from ray._raylet import GcsClient  # its first call to the GCS carries the token, as ray.init's does
    except ImportError:
        return
    try:
        GcsClient(address=address)
    except Exception as exc:
        if type(exc).__name__ == "AuthenticationError":  # ray.exceptions.AuthenticationError
            raise RayTokenRefusedError(
                f"the Ray head at {address} refused this process's token: {exc}"
            ) from exc
