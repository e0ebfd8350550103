"""Token, TLS and the bind rule, on real sockets."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import trustme

from agent.sim.fake_nvml import FakeNvml
from tests.conftest import make_agent, receive, serve
from tuimon_core.protocol import Hello
from tuimon_core.serving.security import (
    ConfigError,
    check_bind_rule,
    load_token,
    parse_listen,
    token_matches,
)

TOKEN = "s3cr3t-token-0123456789abcdef"


async def test_wrong_or_missing_token_gets_401_and_right_one_streams(
        proc_root: Path, fake_nvml: FakeNvml) -> None:
    agent = make_agent(proc_root, fake_nvml, interval=0.2)
    async with serve(agent, token=TOKEN) as server, aiohttp.ClientSession() as s:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            for path in ("/v1/stream", "/metrics"):
                async with s.get(server.make_url(path), headers=headers) as resp:
                    assert resp.status == 401, (path, headers)
                    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        with pytest.raises(aiohttp.WSServerHandshakeError) as err:
            await s.ws_connect(server.make_url("/v1/stream"))
        assert err.value.status == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with s.ws_connect(server.make_url("/v1/stream"), headers=auth) as ws:
            assert isinstance(await receive(ws), Hello)
        async with s.get(server.make_url("/metrics"), headers=auth) as resp:
            assert resp.status == 200
        async with s.get(server.make_url("/healthz")) as resp:
            assert resp.status == 200  # liveness stays open; it carries no metrics


def test_token_comparison() -> None:
    assert token_matches(f"Bearer {TOKEN}", TOKEN)
    assert not token_matches(f"Bearer {TOKEN}x", TOKEN)
    assert not token_matches(None, TOKEN)
    assert not token_matches(TOKEN, TOKEN)


async def test_tls_serves_wss_with_a_self_signed_certificate(
        tmp_path: Path, proc_root: Path, fake_nvml: FakeNvml) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    agent = make_agent(proc_root, fake_nvml, interval=0.2)
    from aiohttp.test_utils import TestServer

    from agent.server import build_app

    server = TestServer(build_app(agent), host="127.0.0.1")
    await server.start_server(ssl=server_ctx)
    try:
        url = server.make_url("/v1/stream")
        assert url.scheme == "https"
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(url, ssl=client_ctx) as ws:
                assert isinstance(await receive(ws), Hello)
            # A client that does not trust the certificate is refused.
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await s.get(server.make_url("/healthz"), ssl=ssl.create_default_context())
    finally:
        await server.close()


def test_server_ssl_context_loads_cert_and_key_files(tmp_path: Path) -> None:
    from tuimon_core.serving.security import server_ssl_context

    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(cert_file)
    cert.private_key_pem.write_to_path(key_file)
    assert server_ssl_context(str(cert_file), str(key_file)) is not None
    with pytest.raises(ConfigError, match="both"):
        server_ssl_context(str(cert_file), None)
    with pytest.raises(ConfigError, match="cannot load"):
        server_ssl_context(str(key_file), str(key_file))


@pytest.mark.parametrize(("listen", "ok"), [
    ("127.0.0.1:9477", True), ("[::1]:9477", True), ("localhost:1", True),
    ("0.0.0.0:9477", False), ("10.1.2.3:9477", False), ("[::]:9477", False),
    ("gpu001:9477", False),
])
def test_bind_rule_needs_a_token_off_loopback(listen: str, ok: bool) -> None:
    address = parse_listen(listen, 9477)
    if ok:
        check_bind_rule(address, None, insecure=False)
    else:
        with pytest.raises(ConfigError, match="--token-file"):
            check_bind_rule(address, None, insecure=False)
        check_bind_rule(address, TOKEN, insecure=False)
        check_bind_rule(address, None, insecure=True)


def test_parse_listen_errors_are_clear() -> None:
    assert parse_listen(":9000", 1).host == "127.0.0.1"
    assert parse_listen("[::1]:9000", 1).port == 9000
    for bad, words in (("host:port", "not a number"), ("::1:9000", "[ADDR]:PORT"),
                       ("h:70000", "out of range"), ("[::1", "unclosed")):
        with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
            parse_listen(bad, 1)


def test_token_file_must_be_private_and_sane(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        load_token(f)
    f.chmod(0o600)
    assert load_token(f) == TOKEN
    f.write_text("short")
    with pytest.raises(ConfigError, match="at least 16"):
        load_token(f)
    with pytest.raises(ConfigError, match="No such file"):
        load_token(tmp_path / "absent")


def _agent_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(
                              Path(__file__).resolve().parent.parent)})


def test_agent_refuses_to_start_on_a_public_address_without_a_token() -> None:
    out = _agent_cli("run", "--listen", "0.0.0.0:0")
    assert out.returncode == 2
    assert "refusing to listen on 0.0.0.0:0 without a token" in out.stderr


def test_agent_refuses_a_token_file_others_can_read(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text(TOKEN)
    f.chmod(0o640)
    out = _agent_cli("run", "--listen", "0.0.0.0:0", "--token-file", str(f))
    assert out.returncode == 2
    assert "readable by group or others" in out.stderr
