"""A local stand-in for a model provider: speaks just enough of the Anthropic Messages API
(streaming SSE) and the OpenAI Responses / Chat Completions APIs for a coding-agent CLI to run
one scripted conversation: call Karotte's MCP ``bash`` tool once, then answer in text.

Every request is recorded (path, headers, JSON body) so tests can check which key arrived.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FINAL_TEXT = "All done: the command ran."


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    at: float = field(default_factory=time.time)


@dataclass
class Script:
    """What the stub model does: one call of the MCP bash tool, then a final answer."""

    command: str
    final_text: str = FINAL_TEXT
    tool_calls_made: int = 0
    # call this (native) tool instead when the CLI offers it and no Karotte bash tool
    native_tool: str | None = None


@dataclass
class StubModel:
    script: Script
    requests: list[Recorded] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    on_request: Callable[[], None] | None = None  # e.g. look at the student while the CLI waits

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> StubModel:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_GET(self) -> None:
                stub.record(self, None)
                self.send_json(200, {"object": "list", "data": [], "models": []})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"null")
                except ValueError:
                    body = raw.decode(errors="replace")
                stub.record(self, body)
                path = self.path.split("?")[0]
                if path.endswith("/count_tokens"):
                    self.send_json(200, {"input_tokens": 12})
                elif path.endswith("/messages"):
                    stub.anthropic(self, body)
                elif path.endswith("/responses"):
                    stub.responses(self, body)
                elif path.endswith("/chat/completions"):
                    stub.chat(self, body)
                else:
                    self.send_json(404, {"error": {"message": f"stub: no route {path}"}})

            def send_json(self, status: int, data: Any) -> None:
                payload = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def send_sse(
                self, events: list[tuple[str | None, dict[str, Any]]], done: bool = False
            ) -> None:
                chunks = []
                for name, data in events:
                    head = f"event: {name}\n" if name else ""
                    chunks.append(f"{head}data: {json.dumps(data)}\n\n")
                if done:  # OpenAI chat streams end with a [DONE] line
                    chunks.append("data: [DONE]\n\n")
                payload = "".join(chunks).encode()
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def record(self, handler: BaseHTTPRequestHandler, body: Any) -> None:
        if self.on_request is not None:
            self.on_request()
        with self.lock:
            self.requests.append(
                Recorded(
                    handler.command,
                    handler.path,
                    {k.lower(): v for k, v in handler.headers.items()},
                    body,
                )
            )

    # ---- the script ----------------------------------------------------------------------
    def decide(self, tool_names: list[str], has_tool_result: bool) -> tuple[str, str] | str:
        """``(tool_name, command)`` to call the MCP bash tool, else the text to answer."""
        bash = [n for n in tool_names if "karotte" in n and n.endswith("bash")]
        if not bash and self.script.native_tool in tool_names:
            bash = [self.script.native_tool]
        if bash and not has_tool_result:
            with self.lock:
                self.script.tool_calls_made += 1
            return bash[0], self.script.command
        if bash:
            return self.script.final_text
        return "ok"  # side requests (titles, summaries) get a short answer

    # ---- Anthropic Messages ------------------------------------------------------------------
    def anthropic(self, handler: Any, body: dict[str, Any]) -> None:
        tools = [t.get("name", "") for t in body.get("tools") or []]
        has_result = any(
            isinstance(block, dict) and block.get("type") == "tool_result"
            for message in body.get("messages") or []
            if isinstance(message.get("content"), list)
            for block in message["content"]
        )
        decision = self.decide(tools, has_result)
        n = len(self.requests)
        usage = {"input_tokens": 100, "output_tokens": 20}
        if isinstance(decision, tuple):
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": f"toolu_stub{n}",
                "name": decision[0],
                "input": {},
            }
            delta = {
                "type": "input_json_delta",
                "partial_json": json.dumps({"command": decision[1]}),
            }
            stop = "tool_use"
        else:
            block = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": decision}
            stop = "end_turn"
        message = {
            "id": f"msg_stub{n}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "stub"),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 1},
        }
        if not body.get("stream"):
            final = dict(block)
            if isinstance(decision, tuple):
                final["input"] = {"command": decision[1]}
            else:
                final["text"] = decision
            handler.send_json(
                200, {**message, "content": [final], "stop_reason": stop, "usage": usage}
            )
            return
        handler.send_sse(
            [
                ("message_start", {"type": "message_start", "message": message}),
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": 0, "content_block": block},
                ),
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": 0, "delta": delta},
                ),
                ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                (
                    "message_delta",
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": stop, "stop_sequence": None},
                        "usage": {"output_tokens": usage["output_tokens"]},
                    },
                ),
                ("message_stop", {"type": "message_stop"}),
            ]
        )

    # ---- OpenAI Responses ----------------------------------------------------------------------
    def responses(self, handler: Any, body: dict[str, Any]) -> None:
        tools: list[str] = []
        for t in body.get("tools") or []:
            if t.get("type") == "namespace":  # codex: an MCP server's tools under one namespace
                tools += [f"{t.get('name')}__{sub.get('name')}" for sub in t.get("tools") or []]
            else:
                tools.append(t.get("name") or (t.get("function") or {}).get("name", ""))
        items = body.get("input") or []
        has_result = any(
            isinstance(i, dict) and i.get("type") == "function_call_output" for i in items
        )
        decision = self.decide([t for t in tools if t], has_result)
        n = len(self.requests)
        if isinstance(decision, tuple):
            item: dict[str, Any] = {
                "type": "function_call",
                "id": f"fc_stub{n}",
                "call_id": f"call_stub{n}",
                "name": decision[0],
                "arguments": json.dumps({"command": decision[1]}),
                "status": "completed",
            }
            namespace, _, name = decision[0].rpartition("__")
            if namespace:
                item.update(name=name, namespace=namespace)
        else:
            item = {
                "type": "message",
                "id": f"msg_stub{n}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": decision, "annotations": []}],
            }
        response = {
            "id": f"resp_stub{n}",
            "object": "response",
            "status": "in_progress",
            "output": [],
        }
        usage = {
            "input_tokens": 100,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 20,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 120,
        }
        done = {**response, "status": "completed", "output": [item], "usage": usage}
        events: list[tuple[str | None, dict[str, Any]]] = [
            ("response.created", {"type": "response.created", "response": response}),
            (
                "response.output_item.added",
                {"type": "response.output_item.added", "output_index": 0, "item": item},
            ),
        ]
        if not isinstance(decision, tuple):
            events.append(
                (
                    "response.output_text.delta",
                    {
                        "type": "response.output_text.delta",
                        "item_id": item["id"],
                        "output_index": 0,
                        "content_index": 0,
                        "delta": decision,
                    },
                )
            )
        events += [
            (
                "response.output_item.done",
                {"type": "response.output_item.done", "output_index": 0, "item": item},
            ),
            ("response.completed", {"type": "response.completed", "response": done}),
        ]
        handler.send_sse(events)

    # ---- OpenAI Chat Completions -----------------------------------------------------------
    def chat(self, handler: Any, body: dict[str, Any]) -> None:
        tools = [(t.get("function") or {}).get("name", "") for t in body.get("tools") or []]
        has_result = any(m.get("role") == "tool" for m in body.get("messages") or [])
        decision = self.decide(tools, has_result)
        n = len(self.requests)
        if isinstance(decision, tuple):
            message: dict[str, Any] = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_stub{n}",
                        "type": "function",
                        "function": {
                            "name": decision[0],
                            "arguments": json.dumps({"command": decision[1]}),
                        },
                    }
                ],
            }
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": decision}
            finish = "stop"
        usage = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
        if not body.get("stream"):
            handler.send_json(
                200,
                {
                    "id": f"chatcmpl-{n}",
                    "object": "chat.completion",
                    "model": body.get("model", "stub"),
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": usage,
                },
            )
            return
        delta = dict(message)
        if "tool_calls" in delta:
            delta["tool_calls"] = [{**c, "index": 0} for c in delta["tool_calls"]]
        base = {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion.chunk",
            "model": body.get("model", "stub"),
        }
        handler.send_sse(
            [
                (None, {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
                (
                    None,
                    {
                        **base,
                        "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
                        "usage": usage,
                    },
                ),
            ],
            done=True,
        )
