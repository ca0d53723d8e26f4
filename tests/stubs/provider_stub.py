"""A local HTTP server speaking the Anthropic Messages API and the OpenAI chat completions API.

Tests script its answers with provider-neutral :class:`StubReply` / :class:`StubError` entries;
the server renders each one in the wire format of the endpoint that was called
(``/v1/messages`` → Anthropic, ``/v1/chat/completions`` → OpenAI), so one script drives both
providers through the real litellm client. Every request is recorded with its arrival time.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class StubToolCall:
    id: str
    name: str
    arguments: str  # sent verbatim, so tests can send malformed JSON


@dataclass
class StubReply:
    """A successful model answer."""

    text: str = ""
    tool_calls: list[StubToolCall] = field(default_factory=list)
    thinking: str = ""  # Anthropic: a signed thinking block; OpenAI: reasoning_content
    input_tokens: int = 11
    output_tokens: int = 7
    cached_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass
class StubError:
    """An HTTP error answer (status, extra headers, provider error message)."""

    status: int
    message: str = "stub error"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class StubHang:
    """Do not answer for ``seconds`` (to provoke client timeouts), then close the connection."""

    seconds: float


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float  # time.monotonic()


ScriptEntry = StubReply | StubError | StubHang


class ProviderStub:
    """Run with ``with ProviderStub() as stub:``; ``stub.url`` is ``http://127.0.0.1:<port>``.

    ``stub.script`` is consumed front to back, one entry per request; when it is empty the
    server answers ``default`` (a plain text reply unless changed).
    """

    def __init__(self, script: list[ScriptEntry] | None = None) -> None:
        self.script: list[ScriptEntry] = list(script or [])
        self.default: ScriptEntry = StubReply(text="(stub: script done)")
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def next_entry(self, request: RecordedRequest) -> ScriptEntry:
        with self._lock:
            self.requests.append(request)
            return self.script.pop(0) if self.script else self.default

    def __enter__(self) -> ProviderStub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _handler_for(stub: ProviderStub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b"{}"
            request = RecordedRequest(
                path=self.path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=json.loads(raw or b"{}"),
                at=time.monotonic(),
            )
            anthropic = self.path.rstrip("/").endswith("/messages")
            if not anthropic and not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, {"error": {"message": f"no such endpoint {self.path}"}})
                return
            entry = stub.next_entry(request)
            if isinstance(entry, StubHang):
                time.sleep(entry.seconds)
                self.close_connection = True
                return
            if isinstance(entry, StubError):
                self._send(entry.status, _error_body(entry, anthropic), entry.headers)
                return
            model = str(request.body.get("model", "stub-model"))
            body = _anthropic_reply(entry, model) if anthropic else _openai_reply(entry, model)
            self._send(200, body)

        def _send(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

    return Handler


def _error_body(error: StubError, anthropic: bool) -> dict[str, Any]:
    kinds = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        429: "rate_limit_error",
        529: "overloaded_error",
    }
    kind = kinds.get(error.status, "api_error")
    if anthropic:
        return {"type": "error", "error": {"type": kind, "message": error.message}}
    return {"error": {"message": error.message, "type": kind, "param": None, "code": None}}


def _anthropic_reply(reply: StubReply, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if reply.thinking:
        signature = f"sig-{abs(hash(reply.thinking)) % 10**8}"
        content.append({"type": "thinking", "thinking": reply.thinking, "signature": signature})
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    for call in reply.tool_calls:
        # Anthropic sends tool input as a JSON object; a malformed argument string cannot be
        # expressed in that format, so it is sent as a string value (which litellm passes on).
        try:
            value: Any = json.loads(call.arguments)
        except json.JSONDecodeError:
            value = call.arguments
        content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": value})
    return {
        "id": "msg_stub",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": reply.input_tokens,
            "output_tokens": reply.output_tokens,
            "cache_read_input_tokens": reply.cached_tokens,
            "cache_creation_input_tokens": 0,
        },
    }


def _openai_reply(reply: StubReply, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.thinking:
        message["reasoning_content"] = reply.thinking
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.tool_calls
        ]
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if reply.tool_calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": reply.input_tokens,
            "completion_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
            "prompt_tokens_details": {"cached_tokens": reply.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": reply.reasoning_tokens},
        },
    }
