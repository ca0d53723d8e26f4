"""``agent: external``: a test trainer drives a real harness run turn by turn through the
reference backend (long-polling what the harness awaits, posting assistant messages)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from karotte import EvaluationRunConfig
from karotte.backend.protocol import AgentMessage, AgentState, EventPage
from karotte.events import ErrorOccurred, Transcript
from karotte.sandbox.backend_client import BackendConnection, BackendError
from karotte.sandbox.entry import run_harness
from karotte.schemas import assistant, tool_call

from .conftest import Backend

BASIC = Path(__file__).parents[1] / "fixtures" / "envs" / "basic"


class Trainer:
    """What a training system does: wait until the harness awaits turn k, read what happened,
    post the assistant message of turn k."""

    def __init__(self, backend: Backend, token: Path, run_id: str) -> None:
        self.conn = BackendConnection(backend.url, token)
        self.run_id = run_id
        self.seen: list[Any] = []
        self.asked: list[AgentState] = []

    def await_turn(self, turn: int, limit_s: float = 30) -> AgentState:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            answer = self.conn.request(
                "GET", f"/v1/runs/{self.run_id}/agent", params={"wait_turn": turn, "wait_s": 5}
            )
            state = AgentState.model_validate_json(answer.content)
            if state.awaiting_turn is not None and state.awaiting_turn >= turn:
                self.asked.append(state)
                return state
        raise AssertionError(f"the harness never asked for turn {turn}")

    def events(self) -> list[Any]:
        page = self.conn.request("GET", f"/v1/runs/{self.run_id}/events")
        return EventPage.model_validate_json(page.content).events

    def post(self, turn: int, message: Any) -> None:
        body = AgentMessage(turn=turn, message=message)
        self.conn.request(
            "POST", f"/v1/runs/{self.run_id}/agent/messages", json=body.model_dump(mode="json")
        )


def external_config(
    tmp_path: Path, backend: Backend, token: Path, **extra: Any
) -> EvaluationRunConfig:
    fields: dict[str, Any] = {
        "run_id": "ext",
        "task_id": "two-steps",
        "agent": "external",
        "transcript_file": tmp_path / "out" / "transcript.json",
        "extra_config": {"answer_path": str(tmp_path / "answer.txt")},
        "backend_uri": backend.url,
        "backend_token_file": token,
        "external_agent_timeout_s": 30.0,
    }
    fields.update(extra)
    return EvaluationRunConfig(**fields)


def test_a_trainer_drives_the_run_turn_by_turn(
    tmp_path: Path, use_environment: Any, backend: Backend, client_token: Path
) -> None:
    use_environment(BASIC)
    config = external_config(tmp_path, backend, client_token)
    trainer = Trainer(backend, client_token, "ext")
    observed: dict[str, Any] = {}

    def drive() -> None:
        state = trainer.await_turn(0)
        observed["tools"] = [t["function"]["name"] for t in state.tools or []]
        observed["step0"] = state.awaiting_step
        trainer.post(0, assistant("6 * 7 = 42"))
        state = trainer.await_turn(1)
        observed["step1"] = state.awaiting_step
        call = tool_call("c1", "bash", command=f"echo hello > {tmp_path / 'answer.txt'}")
        trainer.post(1, assistant(None, [call]))
        trainer.await_turn(2)
        # the tool's result reached the backend before the harness asked for the next turn
        observed["results"] = [
            e.output for e in trainer.events() if e.type == "tool_call_completed"
        ]
        trainer.post(2, assistant("I wrote the file."))

    driver = threading.Thread(target=drive)
    driver.start()
    completed = run_harness(config, events="none")
    driver.join(30)
    assert completed.status == "passed", completed
    assert completed.scores == [1.0, 1.0]
    assert observed["tools"] == ["bash"]
    assert (observed["step0"], observed["step1"]) == (0, 1)
    assert len(observed["results"]) == 1
    local = Transcript.model_validate_json(config.transcript_file.read_text())
    texts = [e.message.text() for e in local.events if e.type == "message_added"]
    assert "6 * 7 = 42" in texts and "I wrote the file." in texts
    remote = trainer.conn.request("GET", "/v1/runs/ext/transcript")
    assert Transcript.model_validate_json(remote.content).model_dump(
        mode="json"
    ) == local.model_dump(mode="json")
    # a turn the harness took cannot be replaced afterwards
    with pytest.raises(BackendError) as caught:
        trainer.post(0, assistant("too late"))
    assert caught.value.status == 409


def test_a_trainer_that_stops_answering_ends_the_run_bounded_with_the_transcript_kept(
    tmp_path: Path, use_environment: Any, backend: Backend, client_token: Path
) -> None:
    use_environment(BASIC)
    config = external_config(tmp_path, backend, client_token, external_agent_timeout_s=2.0)
    trainer = Trainer(backend, client_token, "ext")

    def drive() -> None:
        trainer.await_turn(0)
        trainer.post(0, assistant("42"))  # then silence

    driver = threading.Thread(target=drive)
    driver.start()
    started = time.monotonic()
    completed = run_harness(config, events="none")
    elapsed = time.monotonic() - started
    driver.join(30)
    assert completed.status == "error" and completed.error_kind == "infra"
    assert elapsed < 15
    local = Transcript.model_validate_json(config.transcript_file.read_text())
    errors = [e for e in local.events if isinstance(e, ErrorOccurred)]
    assert any("no assistant message for turn 1 within 2s" in e.message for e in errors), errors
    assert local.status == "error" and local.score == 0.5  # step 0 was scored before
    remote = Transcript.model_validate_json(
        trainer.conn.request("GET", "/v1/runs/ext/transcript").content
    )
    assert remote.status == "error" and len(remote.events) == len(local.events)


def test_a_trainer_message_must_be_an_assistant_message(
    backend: Backend, client_token: Path
) -> None:
    conn = BackendConnection(backend.url, client_token)
    body = {"turn": 0, "message": {"role": "user", "content": "hi"}}
    with pytest.raises(BackendError) as caught:
        conn.request("POST", "/v1/runs/x/agent/messages", json=body)
    assert caught.value.status == 422 and "assistant" in str(caught.value)


def test_external_agent_without_a_backend_is_a_clear_error(
    tmp_path: Path, use_environment: Any
) -> None:
    use_environment(BASIC)
    config = EvaluationRunConfig(
        task_id="two-steps", agent="external", transcript_file=tmp_path / "t.json"
    )
    completed = run_harness(config, events="none")
    assert completed.status == "error" and completed.error_kind == "infra"
    local = Transcript.model_validate_json(config.transcript_file.read_text())
    assert any("needs backend_uri" in getattr(e, "message", "") for e in local.events)


def test_an_unreachable_backend_ends_an_external_run_within_its_timeout(
    tmp_path: Path, use_environment: Any
) -> None:
    use_environment(BASIC)
    from .conftest import free_port

    config = EvaluationRunConfig(
        task_id="two-steps",
        agent="external",
        transcript_file=tmp_path / "t.json",
        backend_uri=f"http://127.0.0.1:{free_port()}",
        external_agent_timeout_s=1.5,
        backend_retry_budget_s=1.0,
        backend_flush_timeout_s=1.0,
    )
    started = time.monotonic()
    completed = run_harness(config, events="none")
    assert time.monotonic() - started < 10
    assert completed.status == "error" and completed.error_kind == "infra"
    local = Transcript.model_validate_json(config.transcript_file.read_text())
    messages = [e.message for e in local.events if isinstance(e, ErrorOccurred)]
    assert any("no assistant message for turn 0" in m and "unreachable" in m for m in messages)
