"""TRL: ``IdeGymTRLEnv`` through ``GRPOTrainer(environment_factory=...)`` — TRL's own environment
probe, tool-schema extraction, tool-calling loop and reward plumbing — for one GRPO step on CPU.

No download: the tokenizer is byte-level, built here, with TRL's own Qwen3 chat template (so TRL
recognises it and parses tool calls), and the model is a one-layer Qwen3 built from a config. Its
weights are set to a two-rule policy (after the generation prompt's newline: emit one token that
is a whole tool call; after that token: end the turn), so which tool call TRL executes is known.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
from typing import TYPE_CHECKING, Any

import pytest

from idegym_env.integrations._episode import close_shared_clients
from idegym_env.integrations.trl import IdeGymTRLEnv, task_dataset
from tests.integration_helpers import TASK, alive, control_plane, fix_arguments  # noqa: F401

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

# torch, TRL and the transformers model are imported where they are used: ~5 s of CPU, which every
# worker paid at collection (importorskip) though one runs these tests.
pytestmark = [pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("torch", "trl")),
                                 reason="needs the [trl] extra (torch, TRL)"), pytest.mark.timeout(600)]
TOOLS = ["bash", "edit_file", "list_files", "patch_file", "read_file", "run_checks", "write_file"]


@pytest.fixture(autouse=True, scope="module")
def _clients():  # type: ignore[no-untyped-def]
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    yield
    close_shared_clients()


def tiny_policy(completion: str) -> tuple[PreTrainedTokenizerFast, Qwen3ForCausalLM]:
    """A byte-level tokenizer plus one token for ``completion``, and a model that always answers
    the generation prompt with that token and then ends its turn."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
    from trl.chat_template_utils import qwen3_chat_template

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tokenizer.add_tokens([completion])
    tokenizer.chat_template = qwen3_chat_template
    tokenizer.padding_side = "left"
    act, newline, eos = tokenizer.convert_tokens_to_ids(completion), tokenizer.encode("\n")[0], tokenizer.eos_token_id

    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=16384,
                         tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id, eos_token_id=eos)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():  # the residual stream carries the last token's embedding straight to the head
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[newline, 0] = 1.0
        model.model.embed_tokens.weight[act, 1] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[act, 0] = 50.0
        model.lm_head.weight[eos, 1] = 50.0
    return tokenizer, model


def grpo_step(tmp_path, completion: str, factory: Any) -> tuple[Any, dict[str, float]]:  # type: ignore[no-untyped-def]
    import trl

    tokenizer, model = tiny_policy(completion)
    args = trl.GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                          max_completion_length=64, max_steps=1, max_tool_calling_iterations=1, report_to="none",
                          use_cpu=True, logging_steps=1, save_strategy="no", learning_rate=1e-4, bf16=False)
    trainer = trl.GRPOTrainer(model=model, args=args, processing_class=tokenizer,
                              train_dataset=task_dataset([TASK], repeat=2), environment_factory=factory)
    trainer.train()
    return trainer, trainer.state.log_history[0]


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@pytest.mark.heavy
def test_one_grpo_step_solves_the_task_through_trls_tool_loop(tmp_path, control_plane) -> None:  # noqa: F811
    trainer, logs = grpo_step(tmp_path, tool_call("edit_file", fix_arguments()),
                              IdeGymTRLEnv.factory(control_plane_url=control_plane.url))
    # TRL's probe found reset/get_reward and turned every other public method into a tool
    assert sorted(t.__name__ for t in trainer.tools) == TOOLS
    assert trainer.reward_func_names == ["IdeGymTRLEnv"]
    # the two rollouts each called the tool once, without failure, and were graded 1.0
    assert logs["tools/call_frequency"] == 1.0 and logs["tools/failure_frequency"] == 0.0
    assert logs["rewards/IdeGymTRLEnv/mean"] == 1.0
    assert len(trainer._environment_pool[None]) == 2
    assert alive(control_plane) == 0  # get_reward handed both sandboxes back


@pytest.mark.heavy
def test_a_malformed_call_is_a_tool_failure_with_our_message(tmp_path, control_plane) -> None:  # noqa: F811
    bad = {"path": "roman.py", "start_line": 9, "end_line": 3, "new_content": "pass"}
    envs: list[IdeGymTRLEnv] = []

    def factory() -> IdeGymTRLEnv:
        env = IdeGymTRLEnv(control_plane_url=control_plane.url)
        envs.append(env)
        return env

    trainer, logs = grpo_step(tmp_path, tool_call("edit_file", bad), factory)
    assert logs["tools/failure_frequency"] == 1.0  # TRL caught our ValueError: {"error": ...} for the model
    assert logs["rewards/IdeGymTRLEnv/mean"] < 1.0  # untouched project, graded
    envs[0].reset(task=TASK)
    with pytest.raises(ValueError, match=r"end_line \(3\) is before start_line \(9\)"):
        envs[0].edit_file(**bad)
    envs[0].get_reward()


def test_tool_schemas_come_from_signatures_and_docstrings() -> None:
    from transformers.utils import get_json_schema

    members = [name for name, _ in inspect.getmembers(IdeGymTRLEnv, predicate=inspect.isfunction)
               if not name.startswith("_") and name not in ("reset", "get_reward")]
    assert sorted(members) == TOOLS  # what TRL exposes (no stray public helper becomes a tool)
    env = IdeGymTRLEnv.__new__(IdeGymTRLEnv)
    schemas = {name: get_json_schema(getattr(env, name))["function"] for name in members}
    assert schemas["edit_file"]["parameters"]["required"] == ["path", "start_line", "end_line", "new_content"]
    assert schemas["bash"]["parameters"]["properties"]["timeout"]["type"] == "number"
    assert schemas["run_checks"]["parameters"]["properties"] == {}
    assert all(s["description"] for s in schemas.values())


def test_run_checks_runs_the_tasks_judge_and_says_when_tests_are_hidden(control_plane) -> None:  # noqa: F811
    env = IdeGymTRLEnv(control_plane_url=control_plane.url)
    env.reset(task=TASK)
    before = env.run_checks()  # the task's `$IDEGYM_JUDGE tests/`, run as the agent's bash
    assert "FAIL" in before and "exit code 1" in before, before
    env.edit_file(**fix_arguments())
    after = env.run_checks()
    assert "OK" in after and "exit code 0" in after, after
    assert env.get_reward() == 1.0
    env.reset(task="humaneval/HumanEval/0")  # its tests exist only at grading
    assert "hidden" in env.run_checks() and env.episode.env._steps == 0
    assert env.get_reward() == 0.0
    assert alive(control_plane) == 0


def test_only_infrastructure_failures_are_unscored() -> None:
    from idegym_env.integrations._episode import _infra_failure

    assert _infra_failure({"grading_errors": ["unexpected test tests.x.y"]}) is None  # the agent's: scored
    assert "grading could not run" in _infra_failure({"grading_errors": ["x"], "infrastructure_error": "gone"})
    assert _infra_failure({"sandbox_lost": True, "error": "the sandbox is gone"}) == "the sandbox is gone"


def test_reward_is_none_when_the_sandbox_dies(control_plane) -> None:  # noqa: F811
    """The seam TRL calls: reset(**row), a tool, get_reward(). TRL scores a rollout whose reward
    functions all return None as unscorable (grpo_trainer: `unscorable_mask`), not as 0."""
    env = IdeGymTRLEnv(control_plane_url=control_plane.url)
    assert "Roman" in env.reset(prompt=[], task=TASK)
    assert "roman.py" in env.bash("ls")
    env.episode.env.sandbox.stop()
    with pytest.raises(RuntimeError, match="infrastructure failure"):
        env.bash("ls")
    assert env.get_reward() is None
    assert "gone" in env.infra_error
    # the pooled instance starts the next rollout normally
    env.reset(task=TASK)
    reward = env.get_reward()
    assert reward is not None and reward < 1.0  # untouched project: graded, not solved
    assert alive(control_plane) == 0


def test_reset_needs_a_task() -> None:
    env = IdeGymTRLEnv()
    with pytest.raises(ValueError, match="names no task"):
        env.reset(prompt=[{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="no bundled task of that name"):
        env.reset(task="no-such-task")


def test_sandbox_is_handed_back_when_the_trainer_process_exits(control_plane) -> None:  # noqa: F811
    import subprocess
    import sys

    script = ("import sys\n"
              "from idegym_env.integrations.trl import IdeGymTRLEnv\n"
              f"env = IdeGymTRLEnv(control_plane_url={control_plane.url!r})\n"
              f"env.reset(task={TASK!r})\n"
              "env.bash('echo busy')\n"
              "print('holding', flush=True)\n"
              "sys.exit(0)  # no get_reward, no cleanup of its own\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "holding" in proc.stdout, proc.stderr[-2000:]
    assert alive(control_plane) == 0
