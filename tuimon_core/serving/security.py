"""Listen-address rules, bearer tokens and TLS for the agent (and later the relay)."""

from __future__ import annotations

import hmac
import ipaddress
import os
import ssl
import stat
from dataclasses import dataclass
from pathlib import Path

from tuimon_core.errors import UsageError

MAX_TOKEN_FILE = 4096


class ConfigError(UsageError):
    """A start-up setting that cannot be used; the message says which and why."""


@dataclass(frozen=True, slots=True)
class ListenAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(text: str, default_port: int) -> ListenAddress:
    """`HOST:PORT`, `HOST`, `:PORT` or `[v6]:PORT`."""
    host, port = text, str(default_port)
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ConfigError(f"--listen {text!r}: unclosed '[' in IPv6 address")
        host, rest = text[1:end], text[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise ConfigError(f"--listen {text!r}: expected ':PORT' after ']'")
            port = rest[1:]
    elif text.count(":") == 1:
        host, port = text.split(":")
    elif text.count(":") > 1:
        raise ConfigError(f"--listen {text!r}: write IPv6 addresses as [ADDR]:PORT")
    host = host or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"--listen {text!r}: port {port!r} is not a number") from None
    if not 0 <= number <= 65535:
        raise ConfigError(f"--listen {text!r}: port {number} out of range")
    return ListenAddress(host, number)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def load_token(path: str | os.PathLike[str]) -> str:
    """Read a bearer token from a file that only its owner can read."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise ConfigError(f"token file {p}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"token file {p}: not a regular file")
    if st.st_mode & 0o077:
        raise ConfigError(
            f"token file {p} is readable by group or others (mode {stat.S_IMODE(st.st_mode):o});"
            f" run: chmod 600 {p}")
    if st.st_size > MAX_TOKEN_FILE:
        # A token is compared on every request: a huge one costs every request its length.
        raise ConfigError(f"token file {p} is {st.st_size} bytes; a token is one line of at "
                          f"most {MAX_TOKEN_FILE} bytes")
    try:
        with p.open("rb") as fh:
            token = fh.read(MAX_TOKEN_FILE + 1).decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"token file {p}: cannot read: {exc}") from None
    if len(token) > MAX_TOKEN_FILE:
        raise ConfigError(f"token file {p}: longer than {MAX_TOKEN_FILE} bytes")
    if len(token) < 16:
        raise ConfigError(f"token file {p}: token must be at least 16 characters")
    if any(c.isspace() for c in token):
        raise ConfigError(f"token file {p}: token must be one line without spaces")
    if not all(33 <= ord(c) <= 126 for c in token):
        raise ConfigError(f"token file {p}: token must be printable ASCII (it travels in an "
                          "HTTP header)")
    return token


def check_bind_rule(listen: ListenAddress, token: str | None, insecure: bool) -> None:
    """Refuse a non-loopback listener without a token unless --insecure was given."""
    if is_loopback(listen.host) or token is not None or insecure:
        return
    raise ConfigError(
        f"refusing to listen on {listen} without a token: anyone who can reach this "
        "address could read this node's metrics. Give --token-file FILE (a file only its "
        "owner can read), or --insecure if the network is trusted, or listen on 127.0.0.1.")


def check_token_transport(targets: list[str], token: str | None, tls: bool, insecure: bool,
                          tls_flag: str = "--tls", insecure_flag: str = "--insecure") -> None:
    """Refuse to send a bearer token in clear text to anything but loopback: whoever
    listens on a target's port (or on the path to it) would read it."""
    if token is None or tls or insecure:
        return
    remote = [t for t in targets if not is_loopback(_host_of(t))]
    if remote:
        more = f" and {len(remote) - 1} more" if len(remote) > 1 else ""
        raise ConfigError(
            f"refusing to send the token over plain HTTP to {remote[0]}{more}: anyone on the "
            f"path could read it. Use {tls_flag} (the agents serve --tls-cert/--tls-key), or "
            f"{insecure_flag} if the network is trusted.")


def _host_of(target: str) -> str:
    host = target.rsplit(":", 1)[0] if not target.endswith("]") else target
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def token_matches(header: str | None, token: str) -> bool:
    """Constant-time check of an `Authorization: Bearer ...` header."""
    if not header or not header.startswith("Bearer "):
        # Compare anyway so a missing header costs the same time as a wrong one.
        hmac.compare_digest(b"x" * len(token), token.encode())
        return False
    return hmac.compare_digest(header[7:].strip().encode(), token.encode())


def server_ssl_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if not cert and not key:
        return None
    if not cert or not key:
        raise ConfigError("TLS needs both --tls-cert and --tls-key")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS certificate {cert} / key {key}: {exc}") from None
    return ctx


def client_ssl_context(ca_file: str | None = None, insecure: bool = False) -> ssl.SSLContext:
    try:
        ctx = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"--tls-ca {ca_file}: cannot load the CA certificates: "
                          f"{exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}"
                          ) from None
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx
