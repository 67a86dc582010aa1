"""verl: :class:`IdeGymAgentLoop`, an agent loop whose trajectories are IdeGym episodes
(``pip install 'idegym[verl]'``).

verl finds it through the YAML named by ``actor_rollout_ref.rollout.agent.agent_loop_config_path``::

    - name: idegym
      _target_: idegym_env.integrations.verl.IdeGymAgentLoop
      control_plane_url: http://127.0.0.1:8000   # optional: default $IDEGYM_URL, else an embedded control plane
      max_steps: 30                               # optional: the task's own budget otherwise

and each dataset row picks it with ``agent_name: idegym`` and names its task in
``extra_info.task`` (a bundled id, a task directory, ``humaneval/...``, ``swe/...``,
``harbor:...``). :func:`dataset_rows` makes such rows.

verl's ``AgentLoopWorker`` (``verl/experimental/agent_loop/agent_loop.py``) instantiates the
class per trajectory with hydra and awaits ``run(sampling_params, **row)``. The loop is verl's own
``ToolAgentLoop`` (its prompts, chat template, tool parser, token bookkeeping and turn limits);
what this class changes:

* the trajectory is an IdeGym episode of the row's task (:class:`~._episode.ToolCallEpisode`): it
  starts before the first generation and the task's instruction is appended to the last user
  message;
* the tools are the episode's (every tool of :data:`idegym_env.tools.TOOLS`, with its schema:
  ``bash``, ``read_file``, ``write_file``, ``edit_file``, ``patch_file``, ``list_files``,
  ``run_checks``, ``submit``), each one ``IdeGymEnv`` step, plus any tools of verl's own
  ``tool_config_path``; a malformed call is an observation with our message;
* the trajectory ends at ``submit`` (or verl's turn and length limits); it is graded by the
  task's checks (an episode that did not submit is graded at its end) and the reward is the
  output's ``reward_score``, so verl's reward loop is not asked;
* an infrastructure failure (the sandbox died, the control plane is unreachable, grading could
  not run) raises :class:`~._episode.InfrastructureError` out of ``run``: verl's own convention
  for a trajectory that cannot be produced (the batch's ``generate_sequences`` fails) rather
  than a reward of 0 that would train the policy on a lie;
* the sandbox is handed back when the trajectory ends, whatever ends it, and at exit.

Why an agent loop rather than Uni-Agent's ``@register_sandbox``: verl's agent-loop path runs on
CPU up to the inference engine (``AgentLoopWorker`` takes any ``LLMServerClient``; verl ships
only vLLM, SGLang and TensorRT-LLM servers behind it, GPU engines), so the loop is tested on CPU
through verl's own worker with an OpenAI-compatible HTTP stand-in for the engine; and Uni-Agent
is not on PyPI (the ``uni-agent`` name there is another project), so no install could test a
``Sandbox`` through its registry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, ToolListWrap
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from sandbox_server.models import TestScores

from ..rewards import CheckResults
from ..tools.schemas import tool_schemas
from ._episode import TOOL_NAMES, InfrastructureError, ToolCallEpisode, ToolCallError, tool_guide

log = logging.getLogger(__name__)

AGENT_NAME = "idegym"


def _schema(tool: str) -> OpenAIFunctionToolSchema:
    (schema,) = tool_schemas((tool,))
    return OpenAIFunctionToolSchema.model_validate(schema)


class _EpisodeTool(BaseTool):
    """One of the episode's tools as a verl tool; every call is one ``IdeGymEnv`` step."""

    def __init__(self, name: str, episode: ToolCallEpisode) -> None:
        # Not BaseTool's __init__: it prints the schema, and these are made for every trajectory.
        self.config: dict[str, Any] = {}
        self.tool_schema = _schema(name)
        self.name = name
        self.episode = episode

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                      ) -> tuple[ToolResponse, float, dict]:
        try:
            outcome = await self.episode.call_async(self.name, parameters)  # on verl's loop: no thread hop
        except ToolCallError as exc:
            return ToolResponse(text=f"error: {exc}"), 0.0, {}
        return ToolResponse(text=outcome.text), 0.0, {}


class IdeGymAgentLoop(ToolAgentLoop):
    """verl's tool agent loop on an IdeGym episode (see the module docstring).

    ``control_plane_url``: where sandboxes come from (default: ``$IDEGYM_URL``, else the embedded control plane);
    ``env_kwargs`` go to ``IdeGymEnv`` (``max_steps``, ``bash_timeout``...)."""

    tools: dict[str, Any]  # verl's, by name (its base class is untyped)

    def __init__(self, *args: Any, tools: ToolListWrap | None = None, control_plane_url: str | None = None,
                 **kwargs: Any) -> None:
        env_kwargs = {k: kwargs.pop(k) for k in ("max_steps", "bash_timeout", "max_observation_chars") if k in kwargs}
        super().__init__(*args, tools=tools, **kwargs)
        self.episode = ToolCallEpisode(control_plane_url=control_plane_url, **env_kwargs)
        own = {name: _EpisodeTool(name, self.episode) for name in TOOL_NAMES}
        clash = sorted(set(own) & set(self.tools))
        if clash:
            raise ValueError(f"verl tools {clash} have the names of IdeGym's tools; rename them in tool_config_path")
        self.tools = {**self.tools, **own}
        self.tool_schemas = [tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
                             for tool in self.tools.values()]

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        task = _task_of(kwargs)
        try:
            try:
                instruction = await asyncio.to_thread(self.episode.start, task)
            except ToolCallError as exc:
                raise ValueError(f"dataset row {kwargs.get('index')!r}: {exc}") from None
            messages = _with_instruction(list(kwargs["raw_prompt"]), f"{instruction}\n\n{tool_guide()}")
            output = await super().run(sampling_params, **{**kwargs, "raw_prompt": messages})
            self._raise_if_failed()
            submitted = self.episode.done  # the policy called submit (else it is graded now, at its end)
            reward = await asyncio.to_thread(self.episode.grade)  # the task's checks, unless submit graded already
            self._raise_if_failed()
            assert reward is not None
            info = self.episode.last_info
            scores = _test_scores(info)
            output.reward_score = float(reward)
            output.extra_fields["idegym"] = {"task_id": info.get("task_id", task), "submitted": submitted,
                                             "tests_passed": scores.passed, "tests_total": scores.total}
            return output
        finally:
            await asyncio.to_thread(self.episode.end)

    async def _call_tool(self, tool_call: FunctionCall, tools_kwargs: dict[str, Any], agent_data: AgentData
                         ) -> tuple[ToolResponse, float, dict]:
        answer = await super()._call_tool(tool_call, tools_kwargs, agent_data)
        self._raise_if_failed()  # verl's loop turns a tool's exception into an observation: not this one
        return answer

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        state = await super()._handle_processing_tools_state(agent_data)
        return AgentState.TERMINATED if self.episode.done else state  # submitted: nothing more to do

    def _raise_if_failed(self) -> None:
        if self.episode.infra_error is not None:
            raise InfrastructureError(self.episode.infra_error)


def _task_of(row: dict[str, Any]) -> str:
    extra = row.get("extra_info") or {}
    task = extra.get("task") if isinstance(extra, dict) else None
    if not task:
        raise ValueError(f"dataset row {row.get('index')!r} names no IdeGym task: put it in extra_info.task "
                         "(a bundled task id, a task directory, humaneval/..., swe/..., harbor:...)")
    return str(task)


def _with_instruction(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    if messages and messages[-1].get("role") == "user" and isinstance(messages[-1].get("content"), str):
        return [*messages[:-1], {**messages[-1], "content": f"{messages[-1]['content']}\n\n{text}"}]
    return [*messages, {"role": "user", "content": text}]


def _test_scores(info: dict[str, Any]) -> TestScores:
    """The tests stage's counts, from ``info["checks"]`` read back into the sandbox's models."""
    tests = CheckResults.from_responses(**(info.get("checks") or {})).tests
    return tests.scores if tests is not None else TestScores()


def dataset_rows(tasks: Iterable[str], *, prompt: str = "Solve the coding task below in the sandbox.",
                 repeat: int = 1, data_source: str = "idegym") -> list[dict[str, Any]]:
    """Rows for verl's ``RLHFDataset`` (write them to parquet): one per task and repeat, with
    ``agent_name: idegym`` and the task in ``extra_info``."""
    rows: list[dict[str, Any]] = []
    for task in tasks:
        for _ in range(repeat):
            rows.append({"data_source": data_source, "agent_name": AGENT_NAME,
                         "prompt": [{"role": "user", "content": prompt}],
                         "reward_model": {"style": "rule", "ground_truth": ""},
                         "extra_info": {"task": task, "index": len(rows)}})
    return rows


__all__ = ["IdeGymAgentLoop", "AGENT_NAME", "dataset_rows"]
