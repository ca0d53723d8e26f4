"""The key forwarder against a local upstream: the swap, refusals, scrubbing, streaming."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from karotte.sandbox.cli_agents.forwarder import KeyForwarder

REAL = "sk-real-0123456789abcdef0123456789"


class Upstream:
    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                upstream.seen.append({"path": self.path, "headers": headers, "body": body})
                if self.path.startswith("/v1/fail"):
                    payload = json.dumps(
                        {"error": f"Incorrect API key provided: {self.headers.get('x-api-key')}"}
                    ).encode()
                    self.send_response(401)
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for i in range(3):
                    chunk = f"data: {i}\n\n".encode()
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    yield up
    up.server.shutdown()
    up.server.server_close()


def run_with(upstream: Upstream, fn: Any, real: str | None = REAL) -> Any:
    async def main() -> Any:
        forwarder = await KeyForwarder(upstream.url, real).start()
        try:
            async with httpx.AsyncClient(base_url=forwarder.url, timeout=10) as client:
                return await fn(client, forwarder)
        finally:
            await forwarder.stop()

    return asyncio.run(main())


def test_swaps_the_placeholder_for_the_real_key(upstream: Upstream) -> None:
    async def go(client: httpx.AsyncClient, fw: KeyForwarder) -> Any:
        a = await client.post("/v1/messages", headers={"x-api-key": fw.placeholder}, content=b"{}")
        b = await client.post(
            "/responses?x=1",
            headers={"Authorization": f"Bearer {fw.placeholder}"},
            content=b'{"a": 1}',
        )
        return a, b

    a, b = run_with(upstream, go)
    assert a.status_code == 200 and a.text == "data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert b.status_code == 200
    first, second = upstream.seen
    assert first["path"] == "/v1/messages" and first["headers"]["x-api-key"] == REAL
    assert second["path"] == "/responses?x=1"
    assert second["headers"]["authorization"] == f"Bearer {REAL}"
    assert second["body"] == b'{"a": 1}'
    assert "karotte-placeholder-" not in json.dumps([s["headers"] for s in upstream.seen])


def test_refuses_requests_without_the_placeholder(upstream: Upstream) -> None:
    async def go(client: httpx.AsyncClient, fw: KeyForwarder) -> Any:
        none = await client.post("/v1/messages", content=b"{}")
        other = await client.post("/v1/messages", headers={"x-api-key": "sk-guess"})
        stale = await client.post(
            "/v1/messages", headers={"x-api-key": "karotte-placeholder-" + "0" * 32}
        )
        return none, other, stale

    for response in run_with(upstream, go):
        assert response.status_code == 401
    assert upstream.seen == []


def test_other_credentials_are_dropped_and_the_host_is_fixed(upstream: Upstream) -> None:
    async def go(client: httpx.AsyncClient, fw: KeyForwarder) -> Any:
        return await client.post(
            "/v1/messages",
            headers={
                "x-api-key": fw.placeholder,
                "authorization": "Bearer sk-student-own",
                "host": "evil.example:80",
                "x-forwarded-host": "evil.example",
            },
        )

    assert run_with(upstream, go).status_code == 200
    headers = upstream.seen[0]["headers"]
    assert "authorization" not in headers and "x-forwarded-host" not in headers
    assert headers["host"] == upstream.url.removeprefix("http://")


def test_error_bodies_never_carry_the_real_key(upstream: Upstream) -> None:
    async def go(client: httpx.AsyncClient, fw: KeyForwarder) -> Any:
        return await client.post("/v1/fail", headers={"x-api-key": fw.placeholder})

    response = run_with(upstream, go)
    assert response.status_code == 401
    assert REAL not in response.text and REAL[:8] not in response.text
    assert "karotte-placeholder-" in response.text


def test_a_proxy_upstream_gets_no_key_at_all(upstream: Upstream) -> None:
    async def go(client: httpx.AsyncClient, fw: KeyForwarder) -> Any:
        return await client.post("/v1/messages", headers={"x-api-key": fw.placeholder})

    assert run_with(upstream, go, real=None).status_code == 200
    assert "x-api-key" not in upstream.seen[0]["headers"]


def test_unreachable_upstream_is_a_502() -> None:
    async def main() -> int:
        forwarder = await KeyForwarder("http://127.0.0.1:9", REAL).start()
        try:
            async with httpx.AsyncClient(base_url=forwarder.url) as client:
                r = await client.post("/v1/messages", headers={"x-api-key": forwarder.placeholder})
                assert REAL not in r.text
                return r.status_code
        finally:
            await forwarder.stop()

    assert asyncio.run(main()) == 502


def test_only_http_upstreams() -> None:
    with pytest.raises(ValueError, match="http"):
        KeyForwarder("file:///etc/passwd", REAL)


def test_upstream_is_the_config_then_the_launcher_proxy_then_the_provider(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from karotte import EvaluationRunConfig
    from karotte.sandbox.cli_agents.runner import provider_model, upstream_for

    for var in ("ANTHROPIC_BASE_URL", "OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    plain = EvaluationRunConfig(task_id="t", model="openai/gpt-x")
    assert upstream_for(plain, "openai") == ("https://api.openai.com/v1", None)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9999/v1")  # the proxy relay
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    assert upstream_for(plain, "openai") == ("http://127.0.0.1:9999/v1", "sk-from-env")
    monkeypatch.setenv("MY_KEY", "sk-referenced")
    explicit = EvaluationRunConfig(
        task_id="t", model="openai/gpt-x", model_api_base="http://h/v1", model_api_key="$MY_KEY"
    )
    assert upstream_for(explicit, "openai") == ("http://h/v1", "sk-referenced")
    assert provider_model("anthropic/claude-x") == "claude-x" and provider_model("gpt") == "gpt"
