"""Before ``ray.init``: a Ray head that does not answer, or asks for a token this
process would not send, is named in one line within seconds (``ray.init`` retries for
minutes, then raises a traceback)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import sys
from collections.abc import Iterator

from autosearch.errors import ConfigError, PlatformError

_HEAD_TIMEOUT = 5.0  # seconds to wait for a Ray head to answer before saying it does not


def check_head(address: str | None) -> None:
    """A Ray head at ``host:port`` that does not answer is refused within seconds, in one
    line (``ray.init`` would retry for minutes). Other forms (``auto``, ``ray://``,
    none: a local cluster) are left to Ray."""
    if not address or "://" in address or address in ("auto", "local"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"Ray address {address!r} is not HOST:PORT (e.g. 127.0.0.1:6379)")
    try:
        socket.create_connection((host, int(port)), timeout=_HEAD_TIMEOUT).close()
    except OSError as exc:
        raise PlatformError(
            f"no Ray head answers at {address} ({exc.strerror or exc}); start one with "
            "`ray start --head`, or check --ray-address / RAY_ADDRESS"
        ) from None


def check_token(address: str | None) -> None:
    """A head at ``host:port`` that asks for a token this process would not send is
    named at once (``ray.init`` retries for 20 s before it says so, in a traceback).
    A head on this machine gets the token this machine holds (``~/.ray/auth_token``,
    ``RAY_AUTH_TOKEN``), as Ray gives it to a local cluster it finds itself; it is never
    sent to another machine unasked. Asked with Ray's own GCS client; where that cannot
    be asked, ``ray.init`` tells."""
    if not address or "://" in address or address in ("auto", "local"):
        return
    refused = _refuses(address)
    if refused and _loopback(address) and "RAY_AUTH_MODE" not in os.environ:
        from autosearch._compat import ray_token_setup

        auth = ray_token_setup()

        if auth.maybe_enable_token_auth_if_token_available(warn_if_disabled=False):
            refused = _refuses(address)
    if refused:
        raise PlatformError(token_advice(address))


def _refuses(address: str) -> bool:
    try:
        from autosearch._compat import ray_gcs_client

        with _quiet_stderr():  # Ray's C++ client logs the refusal there too
            ray_gcs_client(address)
    except Exception as exc:
        return token_refused(exc)
    return False


def _loopback(address: str) -> bool:
    host = address.rpartition(":")[0].strip("[]")
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null for the block (what native code writes there)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def token_refused(exc: BaseException | None) -> bool:
    """Whether connecting failed because the cluster asks for a token this process
    did not send (Ray's AuthenticationError, somewhere in the chain of causes)."""
    for _ in range(10):
        if exc is None:
            return False
        if type(exc).__name__ == "AuthenticationError" or "InvalidAuthToken" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def token_advice(address: str) -> str:
    mode = os.environ.get("RAY_AUTH_MODE", "unset")
    return (
        f"the Ray cluster at {address} refused this process: it asks for a token "
        f"(RAY_AUTH_MODE is {mode} here; a head started where a ~/.ray/auth_token exists "
        "asks for one). Set RAY_AUTH_MODE=token here with the cluster's token in "
        "~/.ray/auth_token or RAY_AUTH_TOKEN, or start the head with RAY_AUTH_MODE=disabled"
    )
