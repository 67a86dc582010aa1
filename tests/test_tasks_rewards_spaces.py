"""Spaces, rewards and tasks; every bundled task end to end against a real sandbox server."""

from __future__ import annotations

import copy
import json
import math
import os
import pickle
import shutil
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import yaml
from gymnasium.utils.env_checker import check_env

from idegym_env.grading import grade_request
from idegym_env.rewards import (
    CheckResults,
    RewardFunction,
    RewardSpec,
    all_tests_pass,
    build_reward,
    clip,
    compiles,
    register_reward,
    reward_components,
    setup_succeeds,
    step_penalty,
    submitted,
    test_pass_fraction,
    weighted_sum,
)
from idegym_env.spaces import TOOL_NAMES, InvalidAction, ToolCall, ToolCallSpace, UnicodeText
from idegym_env.tasks import BUNDLED_DIR, GradingFiles, Task, TaskError, TaskSet, bundled_tasks, load_task
from idegym_env.tools import BashCall, EditFileCall, SubmitCall
from sandbox_server.grading.models import ExportResponse, GradeResponse
from sandbox_server.routes import endpoint_for
from tests.helpers import SandboxProcess

# -- UnicodeText ------------------------------------------------------------------------------------

REAL_OUTPUT = [
    "",
    "hello\n",
    "\x1b[31mred\x1b[0m",
    "nul\x00byte",
    "中文 日本語 한국어",
    "emoji 😀 outside the BMP 𝔘",
    "\ufffd replacement char",
    "tabs\tand\r\nCRLF",
]


@pytest.mark.parametrize("text", REAL_OUTPUT)
def test_unicode_text_accepts_any_string_that_gymnasium_text_rejects_some_of(text: str) -> None:
    assert text in UnicodeText()
    assert text in UnicodeText(max_length=100)
    assert np.str_(text) in UnicodeText()


def test_gymnasium_text_is_the_trap_we_avoid() -> None:
    # The reason UnicodeText exists: the stock space rejects empty and non-alphanumeric output.
    assert "" not in gym.spaces.Text(100)
    assert "中文" not in gym.spaces.Text(100)
    assert "" in UnicodeText() and "中文" in UnicodeText()


@pytest.mark.parametrize("value", [None, b"bytes", 1, 1.5, ["a"], np.array(["a"]), {"a": 1}])
def test_unicode_text_rejects_non_strings(value: Any) -> None:
    assert value not in UnicodeText()


def test_unicode_text_length_bounds() -> None:
    space = UnicodeText(5, min_length=2)
    assert "ab" in space and "abcde" in space and "中文😀" in space
    assert "a" not in space and "abcdef" not in space
    assert "x" * 10**6 in UnicodeText()
    for bad in ({"max_length": -1}, {"max_length": 1, "min_length": 2}, {"min_length": -1},
                {"sample_charset": ""}, {"max_length": True}):
        with pytest.raises(ValueError):
            UnicodeText(**bad)


def test_unicode_text_sample_is_seeded_valid_and_honours_mask() -> None:
    a, b, c = UnicodeText(20, seed=7), UnicodeText(20, seed=7), UnicodeText(20, seed=8)
    sa, sb, sc = ([space.sample() for _ in range(50)] for space in (a, b, c))
    assert sa == sb and sa != sc
    assert all(s in a for s in sa)
    assert any(any(ord(ch) > 127 for ch in s) for s in sa)  # samples exercise non-ASCII text
    assert len(a.sample(mask=7)) == 7 and a.sample(mask=0) == ""
    with pytest.raises(ValueError):
        a.sample(mask=21)
    with pytest.raises(ValueError):
        a.sample(probability=np.ones(3))
    bounded = UnicodeText(3, min_length=3, seed=1)
    assert all(len(bounded.sample()) == 3 for _ in range(20))


def test_unicode_text_repr_eq_hash_json_pickle() -> None:
    space = UnicodeText(10, min_length=1, seed=3)
    assert repr(space) == "UnicodeText(max_length=10, min_length=1)"
    assert repr(UnicodeText()) == "UnicodeText()"
    assert space == UnicodeText(10, min_length=1, sample_charset="ab")
    assert hash(space) == hash(UnicodeText(10, min_length=1))
    assert space != UnicodeText(11, min_length=1) and space != gym.spaces.Text(10)
    samples = ["a", "中文", "\x00"]
    assert space.from_jsonable(json.loads(json.dumps(space.to_jsonable(samples)))) == samples
    with pytest.raises(ValueError):
        space.from_jsonable([""])
    clone = pickle.loads(pickle.dumps(space))
    assert clone == space and clone.sample() == space.sample()
    assert space.is_np_flattenable is False


@pytest.mark.parametrize("length", [0, 5, 30, 31, 100, 10_000])
def test_unicode_text_fit_returns_a_member_keeping_head_and_tail(length: int) -> None:
    space = UnicodeText(40)
    text = "".join(chr(0x4E00 + i % 500) for i in range(length))
    fitted = space.fit(text)
    assert fitted in space
    if length <= 40:
        assert fitted == text
    else:
        assert len(fitted) == 40 and fitted[:3] == text[:3] and fitted[-3:] == text[-3:]
        removed = int(fitted.split("[")[1].split(" ")[0])
        assert removed == length - (len(fitted) - len(f"\n…[{removed} characters cut]…\n"))
    assert UnicodeText(3).fit("abcdefgh") == "abc"  # no room for the marker
    assert UnicodeText(min_length=2).fit("") == "  "


# -- ToolCallSpace: membership ----------------------------------------------------------------------

VALID = {
    "bash": [{"command": "ls"}, {"command": "sleep 1", "timeout": 5}, {"command": "x", "timeout": 2.5}],
    "write_file": [{"path": "a.txt", "content": ""}, {"path": "d/e/中.txt", "content": "😀\x00"}],
    "edit_file": [{"path": "a", "start_line": 1, "end_line": 1, "new_content": "x"},
                  {"path": "a", "start_line": 3, "end_line": 2, "new_content": ""}],
    "patch_file": [{"path": "a", "patch": "@@ -1,3 +1,3 @@\n-a\n+b\n"}],
    "read_file": [{"path": "a"}, {"path": "a", "offset": 0, "length": 1}, {"path": "a", "offset": None}],
    "list_files": [{}, {"path": "src"}, {"path": ".", "depth": 1}, {"depth": 10}],
    "submit": [{}],
}

INVALID_ARGUMENTS = [
    ("bash", {}),
    ("bash", {"command": ""}),
    ("bash", {"command": "   \n"}),
    ("bash", {"command": 5}),
    ("bash", {"command": "ls", "timeout": 0}),
    ("bash", {"command": "ls", "timeout": -1}),
    ("bash", {"command": "ls", "timeout": float("inf")}),
    ("bash", {"command": "ls", "timeout": float("nan")}),
    ("bash", {"command": "ls", "timeout": 10_000}),
    ("bash", {"command": "ls", "timeout": "5"}),
    ("bash", {"command": "ls", "timeout": True}),
    ("bash", {"command": "ls", "cwd": "/"}),
    ("write_file", {"path": "a"}),
    ("write_file", {"path": "", "content": "x"}),
    ("write_file", {"path": "a\x00b", "content": "x"}),
    ("write_file", {"path": "a", "content": b"bytes"}),
    ("write_file", {"path": ["a"], "content": "x"}),
    ("edit_file", {"path": "a", "start_line": 0, "end_line": 0, "new_content": ""}),
    ("edit_file", {"path": "a", "start_line": 5, "end_line": 3, "new_content": ""}),
    ("edit_file", {"path": "a", "start_line": "1", "end_line": 1, "new_content": ""}),
    ("edit_file", {"path": "a", "start_line": True, "end_line": 1, "new_content": ""}),
    ("edit_file", {"path": "a", "start_line": 1.0, "end_line": 1, "new_content": ""}),
    ("edit_file", {"path": "a", "start_line": 1, "end_line": -1, "new_content": ""}),
    ("edit_file", {"path": "a", "start_line": 1, "end_line": 1}),
    ("patch_file", {"path": "a", "patch": ""}),
    ("patch_file", {"path": "a", "patch": " \n"}),
    ("read_file", {"path": "a", "offset": -1}),
    ("read_file", {"path": "a", "length": 0}),
    ("read_file", {"path": "a", "length": 1 << 30}),
    ("read_file", {}),
    ("list_files", {"path": ""}),
    ("list_files", {"depth": 0}),
    ("list_files", {"depth": 11}),
    ("list_files", {"depth": "2"}),
    ("list_files", {"pattern": "*.py"}),
    ("submit", {"now": True}),
]


@pytest.mark.parametrize("tool,arguments", [(t, a) for t, items in VALID.items() for a in items])
def test_tool_call_space_contains_valid_calls(tool: str, arguments: dict) -> None:
    assert {"tool": tool, "arguments": arguments} in ToolCallSpace()


@pytest.mark.parametrize("tool,arguments", INVALID_ARGUMENTS)
def test_tool_call_space_rejects_invalid_arguments(tool: str, arguments: dict) -> None:
    space = ToolCallSpace()
    assert {"tool": tool, "arguments": arguments} not in space
    with pytest.raises(InvalidAction) as info:
        space.parse({"tool": tool, "arguments": arguments})
    assert info.value.tool == tool and f"invalid {tool} call" in str(info.value)
    assert "for example" in str(info.value)


def test_an_invalid_action_is_answered_without_remaking_every_tools_schema() -> None:
    """Can fail: its message lists every tool's signature, made from a fresh JSON Schema of each
    tool every time: ~2 ms of CPU an invalid action (a policy early in training makes many, and an
    MCP or OpenEnv server makes them on its event loop). The signatures never change."""
    space = ToolCallSpace()

    def refused() -> str:
        with pytest.raises(InvalidAction) as info:
            space.parse({"tool": "no-such-tool"})
        return str(info.value)

    first = refused()
    assert "bash(command: string" in first and "read_file(path: string" in first
    started = time.thread_time()
    for _ in range(50):
        assert refused() == first
    per_action = (time.thread_time() - started) / 50
    assert per_action < 0.2e-3, f"{per_action * 1e3:.2f} ms of CPU an invalid action"


@pytest.mark.parametrize("action", [
    None, "ls", 3, ["bash"], {"tool": "bash"}, {"arguments": {}},
    {"tool": "bash", "arguments": {"command": "ls"}, "extra": 1},
    {"tool": "rm", "arguments": {}}, {"tool": 1, "arguments": {}},
    {"tool": "bash", "arguments": '{"command": "ls"}'},  # canonical members hold a dict, not JSON text
    {"name": "bash", "arguments": {"command": "ls"}},  # an LLM shape: parse() accepts it, contains() does not
])
def test_tool_call_space_contains_only_canonical_dicts(action: Any) -> None:
    assert action not in ToolCallSpace()


def test_tool_call_space_subset_and_numpy_scalars() -> None:
    space = ToolCallSpace(["bash", "submit"])
    assert {"tool": "submit", "arguments": {}} in space
    assert {"tool": "read_file", "arguments": {"path": "a"}} not in space
    with pytest.raises(InvalidAction, match="not available here; the available tools are bash, submit"):
        space.parse({"tool": "read_file", "arguments": {"path": "a"}})
    full = ToolCallSpace()
    call = {"tool": "edit_file", "arguments": {
        "path": "a", "start_line": np.int64(2), "end_line": np.int32(2), "new_content": np.str_("x")}}
    assert call in full and full.parse(call).arguments.start_line == 2
    for bad in ([], ["bash", "bash"], ["nope"]):
        with pytest.raises(ValueError):
            ToolCallSpace(bad)


# -- ToolCallSpace: parsing -------------------------------------------------------------------------

EXPECTED_LS = BashCall.model_validate({"tool": "bash", "arguments": {"command": "ls -la"}})
LS_JSON = '{"command": "ls -la"}'

ACCEPTED_SHAPES = [
    {"tool": "bash", "arguments": {"command": "ls -la"}},
    {"tool": "bash", "arguments": LS_JSON},
    '{"tool": "bash", "arguments": {"command": "ls -la"}}',
    '  {"tool": "bash", "arguments": {"command": "ls -la"}}\n',
    '```json\n{"tool": "bash", "arguments": {"command": "ls -la"}}\n```',
    b'{"tool": "bash", "arguments": {"command": "ls -la"}}',
    {"name": "bash", "arguments": LS_JSON},
    {"name": "bash", "arguments": {"command": "ls -la"}},
    {"type": "function_call", "call_id": "call_1", "name": "bash", "arguments": LS_JSON, "id": "fc_1",
     "status": "completed"},
    {"function": {"name": "bash", "arguments": LS_JSON}},
    {"type": "function", "id": "call_abc", "index": 0, "function": {"name": "bash", "arguments": LS_JSON}},
    json.dumps({"type": "function", "id": "call_abc", "function": {"name": "bash", "arguments": LS_JSON}}),
    {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls -la"}},
    {"name": "bash", "parameters": {"command": "ls -la"}},
    EXPECTED_LS,
]


@pytest.mark.parametrize("action", ACCEPTED_SHAPES)
def test_parse_accepts_every_tool_call_shape(action: Any) -> None:
    call = ToolCallSpace().parse(action)
    assert call == EXPECTED_LS and isinstance(call, BashCall)
    assert call.to_action() == {"tool": "bash", "arguments": {"command": "ls -la"}}
    assert call.to_action() in ToolCallSpace()


@pytest.mark.parametrize("action", [
    {"tool": "submit"}, {"tool": "submit", "arguments": None}, {"name": "submit", "arguments": ""},
    {"name": "submit", "arguments": "{}"}, '{"function": {"name": "submit"}}',
])
def test_parse_submit_without_arguments(action: Any) -> None:
    assert ToolCallSpace().parse(action) == SubmitCall()


MALFORMED = [
    ("", "the action is empty"),
    ("   ", "the action is empty"),
    ('{"tool": "bash", ', "not valid JSON"),
    ("ls -la", "not valid JSON"),
    (b"\xff\xfe", "not UTF-8"),
    ("[]", "exactly one tool call per step"),
    ('[{"tool": "submit"}, {"tool": "submit"}]', "exactly one tool call per step, got a list of 2"),
    (42, "a tool call is a JSON object, got int"),
    (None, "a tool call is a JSON object, got NoneType"),
    ({}, "names no tool"),
    ({"command": "ls"}, "names no tool"),
    ({"tool": "rm -rf /", "arguments": {}}, "unknown tool 'rm -rf /'"),
    ({"tool": "", "arguments": {}}, "non-empty string"),
    ({"tool": None, "arguments": {}}, "must be a non-empty string, got None"),
    ({"tool": "bash", "arguments": {"command": "ls"}, "id": "x"}, "unexpected keys ['id']"),
    ({"tool": "bash", "arguments": "{not json"}, "the arguments of bash is not valid JSON"),
    ({"tool": "bash", "arguments": "[1]"}, "must be a JSON object, got list"),
    ({"tool": "bash", "arguments": 5}, "must be a JSON object, got int"),
    ({"name": "bash", "arguments": LS_JSON, "input": {}}, "given twice"),
    ({"name": "bash", "arguments": LS_JSON, "extra": 1}, "unexpected keys ['extra']"),
    ({"type": "message", "name": "bash", "arguments": LS_JSON}, "'type' is 'message'"),
    ({"function": "bash"}, "'function' must be an object"),
    ({"function": {"name": "bash", "arguments": LS_JSON, "strict": True}}, "unexpected keys ['strict']"),
    ({"type": "function", "function": {"name": "bash", "arguments": "{}"}}, "arguments.command: missing"),
    ({"tool": "edit_file", "arguments": {"path": "a", "start_line": 0, "end_line": 0, "new_content": ""}},
     "arguments.start_line: Input should be greater than or equal to 1 (got 0)"),
    ({"tool": "edit_file", "arguments": {"path": "a", "start_line": 4, "end_line": 1, "new_content": ""}},
     "end_line (1) is before start_line (4)"),
    ({"tool": "read_file", "arguments": {"path": "a", "lines": 3}}, "arguments.lines: unexpected argument"),
    ({"tool": "bash", "arguments": {"command": "ls", "timeout": "10"}}, "arguments.timeout"),
]


@pytest.mark.parametrize("action,message", MALFORMED)
def test_parse_explains_what_is_wrong(action: Any, message: str) -> None:
    with pytest.raises(InvalidAction) as info:
        ToolCallSpace().parse(action)
    text = str(info.value)
    assert message in text
    assert "{" in info.value.hint  # every error shows what a valid call looks like


def test_invalid_action_survives_pickling() -> None:
    with pytest.raises(InvalidAction) as info:
        ToolCallSpace().parse({"tool": "bash", "arguments": {}})
    clone = pickle.loads(pickle.dumps(info.value))
    assert (str(clone), clone.reason, clone.tool, clone.hint) == (
        str(info.value), info.value.reason, "bash", info.value.hint)


@pytest.mark.parametrize("tool", TOOL_NAMES)
def test_the_example_in_an_error_message_is_itself_valid(tool: str) -> None:
    space = ToolCallSpace()
    with pytest.raises(InvalidAction) as info:
        space.parse({"tool": tool, "arguments": {"bogus": 1}})
    example = json.loads(info.value.hint.split("for example: ", 1)[1])
    assert example in space and space.parse(example).tool == tool


# -- ToolCallSpace: schemas and sampling ------------------------------------------------------------


def _walk(node: Any) -> Iterator[Any]:
    yield node
    if isinstance(node, dict):
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


@pytest.mark.parametrize("style", ["openai", "responses", "anthropic"])
def test_tool_schemas_describe_exactly_the_enabled_tools(style: str) -> None:
    space = ToolCallSpace(["bash", "edit_file", "read_file", "submit"])
    schemas = space.tool_schemas(style)  # type: ignore[arg-type]
    json.dumps(schemas)  # serializable as is
    if style == "openai":
        pairs = [(s["function"]["name"], s["function"]["parameters"]) for s in schemas]
        assert all(s["type"] == "function" and s["function"]["description"] for s in schemas)
    elif style == "responses":
        pairs = [(s["name"], s["parameters"]) for s in schemas]
    else:
        pairs = [(s["name"], s["input_schema"]) for s in schemas]
    assert [name for name, _ in pairs] == list(space.tools)
    by_name = dict(pairs)
    for name, params in pairs:
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert not any(isinstance(n, dict) and ("title" in n and isinstance(n["title"], str) or "anyOf" in n)
                       for n in _walk(params)), params
        for example in VALID[name]:
            assert set(params.get("required", [])) <= set(example) <= set(params["properties"])
    assert by_name["edit_file"]["properties"]["start_line"] == {
        "type": "integer", "minimum": 1, "description": "First line to replace, counting from 1."}
    assert by_name["read_file"]["required"] == ["path"]
    assert by_name["bash"]["properties"]["timeout"]["exclusiveMinimum"] == 0
    with pytest.raises(ValueError):
        space.tool_schemas("xml")  # type: ignore[arg-type]


def test_an_llm_round_trip_through_the_schemas() -> None:
    # What an OpenAI chat model returns for a tool defined by tool_schemas() is accepted by parse().
    space = ToolCallSpace()
    tool = next(s for s in space.tool_schemas() if s["function"]["name"] == "edit_file")
    args = {name: 1 if spec["type"] == "integer" else "x" for name, spec in tool["function"]["parameters"]
            ["properties"].items()}
    message_tool_call = {"id": "call_1", "type": "function",
                         "function": {"name": "edit_file", "arguments": json.dumps(args)}}
    assert isinstance(space.parse(message_tool_call), EditFileCall)


SAFE_BASH = ("echo ", "pwd", "ls", "printf ", "cat ", "wc -l ", "true")


def test_sample_is_valid_harmless_seeded_and_covers_every_tool() -> None:
    space = ToolCallSpace(seed=123)
    samples = [space.sample() for _ in range(600)]
    assert all(s in space for s in samples)
    assert {s["tool"] for s in samples} == set(TOOL_NAMES)
    for s in samples:
        args = s["arguments"]
        if s["tool"] == "bash":
            assert args["command"].startswith(SAFE_BASH) and ";" not in args["command"], args
        if s["tool"] in ("write_file", "edit_file", "patch_file"):
            assert args["path"].startswith("scratch/") and ".." not in args["path"]
    again = ToolCallSpace(seed=123)
    assert [again.sample() for _ in range(600)] == samples
    space.seed(5)
    first = [space.sample() for _ in range(20)]
    space.seed(5)
    assert [space.sample() for _ in range(20)] == first


def test_sample_mask_and_probability_select_tools() -> None:
    space = ToolCallSpace(seed=0)
    n = len(space.tools)
    only_bash = np.eye(n, dtype=np.int8)[space.tools.index("bash")]
    assert {space.sample(mask=only_bash)["tool"] for _ in range(30)} == {"bash"}
    probability = (np.eye(n)[space.tools.index("read_file")] + np.eye(n)[space.tools.index("submit")]) / 2
    assert {space.sample(probability=probability)["tool"] for _ in range(60)} == {"read_file", "submit"}
    for bad in (dict(mask=np.zeros(n)), dict(mask=np.ones(3)), dict(probability=np.ones(n)),
                dict(mask=only_bash, probability=probability)):
        with pytest.raises(ValueError):
            space.sample(**bad)


def test_tool_call_space_repr_eq_json_pickle() -> None:
    space = ToolCallSpace(["bash", "submit"], seed=1)
    assert repr(space) == "ToolCallSpace(tools=['bash', 'submit'])"
    assert space == ToolCallSpace(["bash", "submit"]) and space != ToolCallSpace(["submit", "bash"])
    assert hash(space) == hash(ToolCallSpace(["bash", "submit"]))
    samples = [space.sample() for _ in range(5)] + [SubmitCall()]
    jsonable = json.loads(json.dumps(space.to_jsonable(samples)))
    assert space.from_jsonable(jsonable) == [s if isinstance(s, dict) else s.to_action() for s in samples]
    with pytest.raises(InvalidAction):
        space.from_jsonable([{"tool": "read_file", "arguments": {"path": "x"}}])
    clone = pickle.loads(pickle.dumps(space))
    assert clone == space and clone.sample() == space.sample()
    assert copy.deepcopy(space).tools == space.tools


# -- the spaces under gymnasium's checkers ----------------------------------------------------------


class _EchoEnv(gym.Env):
    """A toy env with the spaces IdeGym uses; steps are answered locally."""

    metadata = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space = UnicodeText(1000)
        self.action_space = ToolCallSpace()

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        return "", {}

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        call = self.action_space.parse(action)
        obs = self.observation_space.fit(f"ran {call.to_json()} → 中文 \x00 \x1b[0m")
        return obs, 0.0, call.tool == "submit", False, {"tool": call.tool}


def test_check_env_and_passive_checker_accept_the_spaces() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(_EchoEnv(), skip_render_check=True)
        gym.register("IdeGymEchoTest-v0", entry_point=_EchoEnv)
        try:
            env = gym.make("IdeGymEchoTest-v0")
            env.reset(seed=1)
            env.step(env.action_space.sample())
            env.close()
        finally:
            gym.registry.pop("IdeGymEchoTest-v0")
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "space" in m.lower()], messages


def test_sync_vector_env_batches_unicode_text() -> None:
    envs = gym.vector.SyncVectorEnv([_EchoEnv, _EchoEnv])
    obs, _ = envs.reset(seed=0)
    assert obs == ("", "")
    obs, *_ = envs.step(envs.action_space.sample())
    assert all(isinstance(o, str) and o.startswith("ran ") for o in obs)
    envs.close()


def test_async_vector_env_refuses_shared_memory_instead_of_corrupting_text() -> None:
    # gymnasium's Text silently returns garbage through shared memory; a custom space has no
    # shared-memory layout, so the mistake is an error at construction (before any worker starts).
    with pytest.raises(ValueError, match="shared_memory=False"):
        gym.vector.AsyncVectorEnv([_EchoEnv, _EchoEnv])


# -- rewards ----------------------------------------------------------------------------------------


def _check(status: str) -> dict:
    return {"status": status, "output": "" if status == "success" else "boom"}


def _tests(passed: int, failed: int = 0, skipped: int = 0, status: str | None = None) -> dict:
    total = passed + failed + skipped
    return {"status": status or ("success" if failed == 0 else "failure"),
            "scores": {"total": total, "passed": passed, "failed": failed, "skipped": skipped}}


def results(**fields: Any) -> CheckResults:
    return CheckResults.from_responses(**fields)


# (results, setup_succeeds, compiles, test_pass_fraction, all_tests_pass)
PIPELINE = [
    ("nothing ran", results(), 1.0, 1.0, 0.0, 0.0),
    ("tests only, all pass", results(tests=_tests(4)), 1.0, 1.0, 1.0, 1.0),
    ("tests only, some fail", results(tests=_tests(3, 1)), 1.0, 1.0, 0.75, 0.0),
    ("skipped count as not passed", results(tests=_tests(3, 0, 1)), 1.0, 1.0, 0.75, 0.0),
    ("setup failed", results(setup=_check("failure"), compilation=_check("success"), tests=_tests(4)),
     0.0, 0.0, 0.0, 0.0),
    ("compile failed, stale tests pass", results(compilation=_check("failure"), tests=_tests(4)),
     1.0, 0.0, 0.0, 0.0),
    ("all stages pass", results(setup=_check("success"), compilation=_check("success"), tests=_tests(2)),
     1.0, 1.0, 1.0, 1.0),
    ("no report written", results(tests=_tests(0, status="failure")), 1.0, 1.0, 0.0, 0.0),
    ("script failed after all passed", results(tests=_tests(2, status="failure")), 1.0, 1.0, 1.0, 0.0),
    ("tests were deleted", results(tests=_tests(2), expected_tests=8), 1.0, 1.0, 0.25, 0.0),
    ("more tests than expected", results(tests=_tests(10), expected_tests=8), 1.0, 1.0, 1.0, 1.0),
    ("infrastructure error", results(tests=_tests(4), errors=["sandbox lost"]), 0.0, 0.0, 0.0, 0.0),
]


@pytest.mark.parametrize("label,res,setup,comp,frac,allpass", PIPELINE, ids=[p[0] for p in PIPELINE])
def test_leaf_rewards_follow_the_pipeline_rules(label: str, res: CheckResults, setup: float, comp: float,
                                                frac: float, allpass: float) -> None:
    assert (setup_succeeds(res), compiles(res), test_pass_fraction(res), all_tests_pass(res)) == (
        setup, comp, frac, allpass)
    components = reward_components(res)
    assert components["test_pass_fraction"] == frac and components["all_tests_pass"] == allpass
    assert all(isinstance(v, float) for v in components.values())


def test_reward_components_keys_and_counts() -> None:
    res = results(tests=_tests(3, 2, 1), expected_tests=7, steps=4, submitted=True)
    assert reward_components(res) == {
        "setup_succeeds": 1.0, "compiles": 1.0, "test_pass_fraction": 3 / 7, "all_tests_pass": 0.0,
        "submitted": 1.0, "tests_passed": 3.0, "tests_failed": 2.0, "tests_skipped": 1.0, "tests_total": 7.0,
        "steps": 4.0,
    }
    assert submitted(results()) == 0.0


def test_combinators() -> None:
    solved = results(compilation=_check("success"), tests=_tests(8), steps=10)
    half = results(compilation=_check("success"), tests=_tests(4, 4), steps=10)
    mixed = weighted_sum({compiles: 0.2, test_pass_fraction: 0.8})
    assert mixed(solved) == 1.0  # exactly: the bundled C task relies on it
    assert mixed(half) == pytest.approx(0.6)
    assert weighted_sum([(compiles, 2.0), (test_pass_fraction, 2.0)], normalize=True)(half) == 0.75
    shaped = weighted_sum({test_pass_fraction: 1.0, step_penalty(0.01): 1.0})
    assert shaped(solved) == pytest.approx(0.9)
    assert clip(shaped, 0.0, 0.5)(solved) == 0.5 and clip(step_penalty(1.0))(solved) == 0.0
    assert repr(clip(shaped)) == "clip(weighted_sum(1*test_pass_fraction + 1*step_penalty(0.01)), 0, 1)"
    assert hash(mixed) == hash(weighted_sum({compiles: 0.2, test_pass_fraction: 0.8}))
    for fn in (compiles, test_pass_fraction, mixed, shaped, clip(mixed), step_penalty(0.1)):
        assert isinstance(fn, RewardFunction)
        assert fn(half) == fn(half.model_copy(deep=True))  # deterministic
    for bad in (lambda: weighted_sum({}), lambda: weighted_sum({compiles: math.nan}),
                lambda: weighted_sum({compiles: True}), lambda: step_penalty(-0.1),
                lambda: clip(compiles, 1, 0), lambda: weighted_sum({"compiles": 1.0})):
        with pytest.raises((ValueError, TypeError)):
            bad()


def test_reward_specs() -> None:
    half = results(compilation=_check("success"), tests=_tests(4, 4), steps=10)
    assert build_reward("test_pass_fraction") is test_pass_fraction
    assert RewardSpec.model_validate("all_tests_pass") == RewardSpec(name="all_tests_pass")
    nested = build_reward({"name": "clip", "params": {"reward": {"name": "weighted_sum", "params": {"terms": [
        {"reward": "test_pass_fraction", "weight": 1.0},
        {"reward": {"name": "step_penalty", "params": {"per_step": 0.01}}, "weight": 1.0}]}}}})
    assert nested(half) == pytest.approx(0.4)
    assert build_reward({"name": "weighted_sum", "params": {"terms": {"compiles": 0.5, "submitted": 0.5},
                                                             "normalize": True}})(half) == 0.5
    errors = [
        ("nope", "unknown reward 'nope'; known rewards: all_tests_pass, clip, compiles"),
        ({"name": "compiles", "params": {"x": 1}}, "unknown params ['x']"),
        ({"name": "clip", "params": {}}, "missing params ['reward']"),
        ({"name": "step_penalty", "params": {"per_step": -1}}, "must be >= 0"),
        ({"name": "weighted_sum", "params": {"terms": [{"reward": "compiles"}]}}, "each term is"),
        ({"name": "weighted_sum", "params": {"terms": 3}}, "terms is a mapping"),
        ({"name": "weighted_sum", "params": {"terms": {"compiles": 1}, "normalize": "yes"}}, "true or false"),
        ({"reward": "compiles"}, "a reward spec is a name or"),
    ]
    for spec, message in errors:
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
            build_reward(spec)
    with pytest.raises(ValueError, match="unknown reward"):
        RewardSpec(name="nope")


def test_register_reward() -> None:
    name = "test_only_constant"
    register_reward(name, lambda params: clip(step_penalty(0.0), params["value"], params["value"]))
    try:
        assert build_reward({"name": name, "params": {"value": 0.5}})(results()) == 0.5
        with pytest.raises(ValueError, match="exists already"):
            register_reward("compiles", lambda params: compiles)
    finally:
        from idegym_env.rewards.spec import FACTORIES

        FACTORIES.pop(name)


# -- tasks ------------------------------------------------------------------------------------------


def test_bundled_tasks_are_complete() -> None:
    tasks = bundled_tasks()
    assert len(tasks) >= 5 and len({t.language for t in tasks}) >= 3
    assert [t.id for t in tasks] == sorted(t.id for t in tasks) == list(TaskSet.bundled().ids)
    for task in tasks:
        assert task.project is not None and task.project.is_dir() and task.root == BUNDLED_DIR / task.id
        assert task.test is not None and task.expected_tests and task.instruction.strip()
        assert 3 <= len(task.actions) <= 8 and task.solution
        assert task.protected_paths and all((task.project / p).exists() for p in task.protected_paths)
        space = task.action_space()
        assert all(call.to_action() in space for call in [*task.actions, *task.solution])
        assert not any(call.tool == "submit" for call in task.actions)
        task.reward_function()
        # The project ships no build output or report that could stand in for a real run.
        names = {p.name for p in task.project.rglob("*")}
        assert not names & {"test-results.xml", "build", "__pycache__", "node_modules"}, task.id


def test_load_task_by_id_directory_and_file(tmp_path: Path) -> None:
    by_id = load_task("python-lru-cache")
    assert load_task(BUNDLED_DIR / "python-lru-cache") == by_id
    assert load_task(str(BUNDLED_DIR / "python-lru-cache" / "task.yaml")) == by_id
    with pytest.raises(TaskError, match="bundled tasks: c-ring-buffer, "):
        load_task("no-such-task")
    with pytest.raises(TaskError, match="no task.yaml"):
        load_task(tmp_path)


def test_solution_directory_becomes_write_file_calls() -> None:
    task = load_task("c-ring-buffer")
    (call,) = task.solution
    assert call.tool == "write_file" and call.arguments.path == "src/ringbuf.c"
    assert call.arguments.content == (BUNDLED_DIR / "c-ring-buffer/solution/src/ringbuf.c").read_text()


def _write_task(root: Path, **overrides: Any) -> Path:
    task_dir = root / overrides.get("id", "demo")
    (task_dir / "project" / "tests").mkdir(parents=True, exist_ok=True)
    (task_dir / "project" / "tests" / "t.sh").write_text("echo ok\n")
    (task_dir / "project" / "app.txt").write_text("v1\n")
    data = {"id": "demo", "title": "Demo", "language": "Shell", "instruction": "Do it.",
            "test": {"script": "bash tests/t.sh"}, "protected_paths": ["tests"], **overrides}
    (task_dir / "task.yaml").write_text(yaml.safe_dump(data))
    return task_dir


@pytest.mark.parametrize("overrides,message", [
    ({"id": "Bad Id"}, "task id 'Bad Id' must be lower-case"),
    ({"id": "other"}, None),  # written to a directory named "other": fine
    ({"unknown_field": 1}, "unknown_field"),
    ({"test": None}, "has no check"),
    ({"protected_paths": ["../etc"]}, "must be relative to the project"),
    ({"protected_paths": ["/etc"]}, "must be relative to the project"),
    ({"tools": ["bash"], "solution": [{"tool": "write_file", "arguments": {"path": "a", "content": ""}}]},
     "uses tool 'write_file', which the task does not enable"),
    ({"tools": ["bash"], "solution": [{"tool": "create_file", "arguments": {"path": "a", "content": ""}}]},
     "uses tool 'write_file', which the task does not enable"),  # the old name is that tool's
    ({"tools": ["bash", "run_checks"]}, "non-empty subset"),  # not a tool of the action space
    ({"tools": ["teleport"]}, "non-empty subset"),
    ({"reward": "nope"}, "unknown reward 'nope'"),
    ({"actions": [{"tool": "bash", "arguments": {"command": ""}}]}, "command"),
    ({"max_steps": 0}, "max_steps"),
    ({"project": "missing-dir"}, "project directory"),
    ({"test": {"script": "bash tests/t.sh", "keep_processes": True}}, "keep_processes is for setup and compile"),
])
def test_invalid_tasks_are_rejected_with_the_reason(
    tmp_path: Path, overrides: dict, message: str | None
) -> None:
    task_dir = _write_task(tmp_path, **overrides)
    if message is None:
        assert load_task(task_dir).id == "other"
        return
    with pytest.raises(TaskError) as info:
        load_task(task_dir)
    assert message in str(info.value) and str(task_dir) in str(info.value)


def test_task_id_must_match_its_directory(tmp_path: Path) -> None:
    task_dir = _write_task(tmp_path)
    task_dir.rename(tmp_path / "renamed")
    with pytest.raises(TaskError, match="differs from the directory name 'renamed'"):
        load_task(tmp_path / "renamed")
    (tmp_path / "renamed" / "task.yaml").write_text("- just\n- a list\n")
    with pytest.raises(TaskError, match="expected a mapping"):
        load_task(tmp_path / "renamed")
    (tmp_path / "renamed" / "task.yaml").write_text("id: [unclosed\n")
    with pytest.raises(TaskError, match="not valid YAML"):
        load_task(tmp_path / "renamed")


def test_task_set_content_hash_tracks_content_not_metadata(tmp_path: Path) -> None:
    root = tmp_path / "set"
    shutil.copytree(BUNDLED_DIR, root)
    bundled = TaskSet.bundled()
    copied = TaskSet(root)
    assert copied.content_hash == bundled.content_hash and len(copied) == len(bundled)
    assert copied["python-lru-cache"].content_hash() == bundled["python-lru-cache"].content_hash()
    lru = root / "python-lru-cache" / "project" / "lru.py"
    os.utime(lru, (0, 0))
    (root / "python-lru-cache" / "project" / "__pycache__").mkdir()
    (root / "python-lru-cache" / "project" / "__pycache__" / "lru.cpython-311.pyc").write_bytes(b"x")
    assert TaskSet(root).content_hash == bundled.content_hash  # mtimes and caches do not count
    hashes = {bundled.content_hash}
    lru.write_text(lru.read_text() + "\n")
    hashes.add(TaskSet(root).content_hash)
    lru.chmod(0o755)
    hashes.add(TaskSet(root).content_hash)
    lru.rename(lru.with_name("lru2.py"))
    hashes.add(TaskSet(root).content_hash)
    assert len(hashes) == 4
    assert "python-lru-cache" in copied and len(list(copied)) == len(copied)
    with pytest.raises(KeyError, match="no task 'x'"):
        copied["x"]
    rng = np.random.default_rng(3)
    assert copied.sample(rng).id == TaskSet(root).sample(np.random.default_rng(3)).id
    shutil.copytree(root / "python-lru-cache", root / "dup")
    with pytest.raises(TaskError, match="differs from the directory name 'dup'"):
        TaskSet(root)


def test_task_built_in_code(tmp_path: Path) -> None:
    project = tmp_path / "p"
    (project / "tests").mkdir(parents=True)
    (project / "tests" / "run.sh").write_text("#!/bin/sh\n")
    (project / "tests" / "run.sh").chmod(0o755)
    task = Task(id="inline", title="t", language="shell", instruction="i", project=project,
                test={"script": "sh tests/run.sh"}, protected_paths=["tests", "tests/run.sh"])
    assert task.root is None and len(task.content_hash()) == 64
    assert task.report_glob == "test-*.xml" and task.reward_function() is test_pass_fraction
    assert [name for name, _ in task.stages()] == ["tests"] and not task.grading
    before = task.content_hash()
    task.with_grading(GradingFiles(hidden={"t.py": b"assert True\n"}))
    assert task.grading.hidden == {"t.py": b"assert True\n"} and task.content_hash() != before
    assert task.copy_project(tmp_path / "copy").joinpath("tests/run.sh").read_text() == "#!/bin/sh\n"
    with pytest.raises(ValueError, match="neither a project directory nor an image"):
        Task(id="x", title="t", language="c", instruction="i", test={"script": "true"})
    image_only = Task(id="x", title="t", language="c", instruction="i", test={"script": "true"}, image="img")
    assert image_only.image == "img"


# -- every bundled task against a real sandbox server -----------------------------------------------


def run_checks(server: SandboxProcess, task: Task) -> CheckResults:
    """What the env does at the end of an episode on a directly connected sandbox: export the
    editable files, reset the project, grade the pristine tree plus those files."""
    resp = server.post("/api/project/export", {"editable": list(task.editable) if task.editable else None,
                                               "protected": list(task.protected_paths)})
    assert resp.status_code == 200, resp.text
    exported = ExportResponse.model_validate(resp.json())
    assert server.post("/api/project/reset", {}).json()["status"] == "success"
    resp = server.post("/api/grade", grade_request(task, exported).model_dump(mode="json"))
    assert resp.status_code == 200, resp.text
    answer = GradeResponse.model_validate(resp.json())
    return task.check_results({"setup": answer.setup, "compilation": answer.compilation, "tests": answer.tests},
                              submitted=True, errors=answer.errors)


def apply(server: SandboxProcess, call: ToolCall) -> dict:
    request = call.to_request()
    assert request is not None, call
    resp = server.post(endpoint_for(request).path, request.model_dump(mode="json"))
    assert resp.status_code == 200, f"{call.to_json()} -> {resp.status_code} {resp.text}"
    return resp.json()


@pytest.fixture(scope="module")
def task_servers(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, tuple[Task, SandboxProcess]]]:
    servers: dict[str, tuple[Task, SandboxProcess]] = {}
    try:
        for task in bundled_tasks():
            tmp = tmp_path_factory.mktemp(task.id)
            servers[task.id] = (task, SandboxProcess(task.copy_project(tmp / "project"), "unix", tmp))
        yield servers
    finally:
        for _, server in servers.values():
            server.stop()


# The compiled-language tasks take a minute here: `slow` (their episodes run in test_env and test_eval).
@pytest.mark.parametrize("task_id", [t.id if t.language not in ("java", "cpp") else
                                     pytest.param(t.id, marks=pytest.mark.slow) for t in bundled_tasks()])
def test_bundled_task_end_to_end(task_id: str, task_servers: dict[str, tuple[Task, SandboxProcess]]) -> None:
    task, server = task_servers[task_id]
    reward = task.reward_function()

    untouched = run_checks(server, task)
    assert untouched.tests is not None and untouched.tests.scores.total == task.expected_tests, untouched
    assert 0 < untouched.tests.scores.passed < task.expected_tests, untouched.tests
    untouched_reward = reward(untouched)
    assert 0.0 < untouched_reward < 1.0

    for call in task.solution:
        assert apply(server, call).get("status") == "success"
    solved = run_checks(server, task)
    assert reward(solved) == 1.0, solved
    assert all_tests_pass(solved) == 1.0

    # Tampering with the tests changes nothing: they are not among the files graded.
    assert server.post("/api/project/reset", {}).json()["status"] == "success"
    paths = " ".join(task.protected_paths)
    server.bash(f"find {paths} -type f -exec sh -c 'echo broken > \"$1\"' _ {{}} \\; "
                f"&& for p in {paths}; do touch $p/zz_planted.txt; done && chmod -R a-w {paths}")
    assert reward(run_checks(server, task)) == untouched_reward
    assert "zz_planted" not in server.bash(f"find {paths}")["stdout"]

    # The discrete actions: all valid, at least one solves, at least one does not.
    action_rewards = []
    for call in task.actions:
        assert server.post("/api/project/reset", {}).json()["status"] == "success"
        apply(server, call)
        # A read changes nothing: skip its (slow, for compiled languages) checks.
        skip = call.tool == "read_file"
        action_rewards.append(untouched_reward if skip else reward(run_checks(server, task)))
    assert max(action_rewards) == 1.0 and min(action_rewards) < 1.0, action_rewards
