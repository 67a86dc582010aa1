"""The tools are defined once (``idegym_env/tools/``): every front end exposes exactly the registry's
tools, by their names, with their arguments; each tool's definition is whole; ``list_files``
through the env."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import idegym_env.tools
from idegym_env.env import IdeGymEnv
from idegym_env.spaces import ToolCallSpace
from idegym_env.tasks import load_task
from idegym_env.tools import ALIASES, TOOL_NAMES, TOOLS, Sampler, ToolCall
from idegym_env.tools.schemas import arguments_schema, short_signature, tool_schemas
from sandbox_server.routes import endpoint_for
from tests.helpers import SandboxProcess

TASK = "python-roman-numerals"
EPISODE_TOOLS = list(TOOLS)  # what the trainers' adapters expose
SPACE_TOOLS = [name for name, tool in TOOLS.items() if tool.in_space]
TRL_TOOLS = [name for name, tool in TOOLS.items() if not tool.ends_episode]  # get_reward grades


def shape(schema: dict[str, Any]) -> dict[str, tuple[str, bool, str | None]]:
    """An arguments schema as each argument's JSON type, whether it is required, its description;
    the same whatever the front end's dialect says of a missing value (``anyOf`` null, ``nullable``)."""
    required = set(schema.get("required", []))
    out = {}
    for name, prop in schema["properties"].items():
        kinds = [prop["type"]] if "type" in prop else [a["type"] for a in prop["anyOf"] if a.get("type") != "null"]
        out[name] = (kinds[0], name in required, prop.get("description"))
    return out


REGISTRY_SHAPES = {name: shape(arguments_schema(name)) for name in TOOLS}


# -- the registry ------------------------------------------------------------------------------------


def test_every_module_of_the_package_is_a_registered_tool() -> None:
    """A tool written but left out of the registry (or registered under another name) fails here."""
    modules = [m.name for m in pkgutil.iter_modules(idegym_env.tools.__path__) if m.name not in ("base", "schemas")]
    found = {}
    for name in modules:
        module = importlib.import_module(f"idegym_env.tools.{name}")
        calls = [v for v in vars(module).values()
                 if inspect.isclass(v) and issubclass(v, ToolCall) and v.__module__ == module.__name__]
        assert len(calls) == 1, (name, calls)
        found[calls[0].name] = calls[0]
        assert calls[0].name == name  # one module per tool, named after it
    assert found == TOOLS


@pytest.mark.parametrize("name", list(TOOLS))
def test_each_tool_is_whole(name: str) -> None:
    tool = TOOLS[name]
    assert tool.description and tool.description[0].isupper()
    example = tool.model_validate({"tool": name, "arguments": tool.example})
    sampler = Sampler(np.random.default_rng(0), "scratch", ("README.md", "missing.txt"))
    for _ in range(50):
        tool.model_validate({"tool": name, "arguments": tool.sample(sampler)})
    assert all(prop.get("description") for prop in arguments_schema(name)["properties"].values()), name
    if tool.request is not None:  # carried out by a route of the sandbox server
        request = example.to_request(30.0)
        assert endpoint_for(request).request is tool.request
    else:  # carried out by the env: it grades, or stands for another call
        assert tool.ends_episode or not tool.in_space
    assert example.label() and example.describe()


def test_one_name_per_tool_and_the_old_name_only_on_input() -> None:
    assert ALIASES == {"create_file": "write_file"}
    space = ToolCallSpace()
    call = space.parse({"tool": "create_file", "arguments": {"path": "a.txt", "content": "x"}})
    assert call.tool == "write_file" and call.to_action()["tool"] == "write_file"
    assert {"tool": "create_file", "arguments": {"path": "a.txt", "content": "x"}} not in space  # not canonical
    assert ToolCallSpace(["create_file", "bash"]).tools == ("write_file", "bash")
    assert "create_file" not in json.dumps(space.tool_schemas())
    assert load_task(TASK).model_copy(update={"tools": None}).action_space().tools == TOOL_NAMES


# -- every front end ---------------------------------------------------------------------------------


def test_the_action_space_and_the_llm_schemas() -> None:
    space = ToolCallSpace()
    assert list(space.tools) == SPACE_TOOLS == list(TOOL_NAMES)
    assert list(load_task(TASK).action_space().tools) == SPACE_TOOLS  # a task that names no tools
    for style, key in (("openai", None), ("responses", "parameters"), ("anthropic", "input_schema")):
        schemas = space.tool_schemas(style)  # type: ignore[arg-type]
        if key is None:
            pairs = [(s["function"]["name"], s["function"]["parameters"]) for s in schemas]
        else:
            pairs = [(s["name"], s[key]) for s in schemas]
        assert [n for n, _ in pairs] == SPACE_TOOLS
        assert all(shape(params) == REGISTRY_SHAPES[n] for n, params in pairs)


def test_the_eval_harness_agent_offers_the_tasks_tools() -> None:
    from idegym_env.eval.openai_agent import OpenAIAgent

    agent = OpenAIAgent("stand-in", base_url="http://127.0.0.1:9")
    agent.reset(load_task(TASK))
    assert [t["function"]["name"] for t in agent.tools] == SPACE_TOOLS
    assert agent.tools == tool_schemas(tuple(SPACE_TOOLS))


def test_openenv_names_the_registrys_tools() -> None:
    pytest.importorskip("openenv")
    from idegym_env.openenv.models import IdeAction
    from idegym_env.openenv.server import DESCRIPTION

    said = IdeAction.model_fields["tool"].description or ""
    for name in SPACE_TOOLS:
        assert name in said and name in DESCRIPTION
    assert "create_file" not in said + DESCRIPTION


def test_mcp_lists_reset_and_every_tool_with_its_arguments() -> None:
    pytest.importorskip("mcp")
    import anyio
    from mcp.client import Client

    from idegym_env.integrations.mcp import EpisodeServer

    async def main() -> dict[str, Any]:
        async with Client(EpisodeServer(task=TASK).mcp) as client:
            return {tool.name: tool for tool in (await client.list_tools()).tools}

    listed = anyio.run(main)
    assert list(listed) == ["reset", *EPISODE_TOOLS]
    for name in EPISODE_TOOLS:
        mine = shape(listed[name].input_schema)
        assert mine.pop("episode_id")[:2] == ("string", False)
        assert mine == REGISTRY_SHAPES[name], name
        assert listed[name].description.startswith(TOOLS[name].description)


def test_trl_has_a_method_per_tool_with_its_arguments() -> None:
    pytest.importorskip("trl")
    from transformers.utils import get_json_schema

    from idegym_env.integrations.trl import IdeGymTRLEnv

    members = [name for name, _ in inspect.getmembers(IdeGymTRLEnv, predicate=inspect.isfunction)
               if not name.startswith("_") and name not in ("reset", "get_reward")]
    assert sorted(members) == sorted(TRL_TOOLS)
    env = IdeGymTRLEnv.__new__(IdeGymTRLEnv)
    for name in TRL_TOOLS:
        function = get_json_schema(getattr(env, name))["function"]
        assert function["name"] == name and function["description"] == TOOLS[name].description
        assert shape(function["parameters"]) == REGISTRY_SHAPES[name], name


def test_skyrl_reads_every_tool_and_its_prompt_lists_them() -> None:
    pytest.importorskip("skyrl_gym")
    from idegym_env.integrations._episode import ToolCallError, tool_guide
    from idegym_env.integrations.skyrl import parse_tool_call

    guide = tool_guide()
    for name in EPISODE_TOOLS:
        assert parse_tool_call(f'<tool_call>{{"name": "{name}", "arguments": {{}}}}</tool_call>')[0] == name
        assert f"- {short_signature(name)}: {TOOLS[name].description}" in guide
    assert guide.count("\n- ") == len(EPISODE_TOOLS)
    with pytest.raises(ToolCallError, match="unknown tool 'create_file'"):  # no alias where none was published
        parse_tool_call('{"name": "create_file", "arguments": {}}')


# -- list_files, the tool added last -------------------------------------------------------------------


def test_list_files_and_the_old_name_through_the_env(tmp_path: Path) -> None:
    from idegym_env.client import Sandbox

    task = load_task(TASK)
    server = SandboxProcess(task.copy_project(tmp_path / "project"), "unix", tmp_path)
    sandbox = Sandbox.connect(unix_socket=str(server.socket_path))
    try:
        env = IdeGymEnv(task, sandbox=sandbox, render_mode="ansi")
        env.reset()
        old_name = {"tool": "create_file", "arguments": {"path": "notes/a.txt", "content": "12345"}}
        text, _, _, _, info = env.step(old_name)
        assert info["tool"] == "write_file" and text == "ok: write_file notes/a.txt"
        text, _, _, _, info = env.step({"tool": "list_files"})
        lines = text.splitlines()
        assert "notes/" in lines and "notes/a.txt (5 bytes)" in lines and "roman.py" in text, text
        assert info == {"step": 2, "tool": "list_files", "entries": len(lines), "truncated": False}
        shallow, *_ = env.step({"tool": "list_files", "arguments": {"depth": 1}})
        assert "notes/" in shallow.splitlines() and "notes/a.txt" not in shallow
        text, _, _, _, info = env.step({"tool": "list_files", "arguments": {"path": "roman.py"}})
        assert text.startswith("error: roman.py: not a directory") and info["error"]
        text, *_ = env.step({"name": "list_files", "arguments": '{"path": "notes", "depth": 0}'})
        assert "invalid list_files call: arguments.depth" in text and "for example" in text
        assert '\n$ list_files {"path": "."}\nREADME.md (' in env.render()  # the transcript: the tool's own line
        env.close()
    finally:
        sandbox.close()
        server.stop()
