"""Run by tests/test_integrations_verl.py in .venv-verl (verl installed): ``IdeGymAgentLoop`` through
verl's own rollout path on CPU — rows of a parquet file read by verl's ``RLHFDataset`` and
``collate_fn``, the agent loop found through ``agent_loop_config_path`` YAML, instantiated and run
by verl's ``AgentLoopWorker.generate_sequences`` (its chat templating, hermes tool parser, token
bookkeeping and padding) — against the control plane at argv[1].

verl's inference engines (vLLM, SGLang, TensorRT-LLM) need GPUs; the engine here is a real HTTP
server speaking OpenAI's completions API with scripted completions, reached through an
``LLMServerClient`` (the class verl's agent loops call). Its tokenizer is byte-level and built
here, with a Qwen-style chat template; no model weights are needed. Prints one JSON line per
check; exits non-zero on the first failure."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import verl
from omegaconf import OmegaConf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.protocol import DataProto
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from idegym_env.client._plans import server_action
from idegym_env.integrations import InfrastructureError
from idegym_env.integrations._episode import shared_client
from idegym_env.integrations.verl import dataset_rows
from idegym_env.tasks import load_task
from idegym_env.tools import TOOLS
from idegym_env.tools.schemas import arguments_schema

TASK = "python-roman-numerals"
CONFIG = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
CHAT_TEMPLATE = """{%- if tools %}<|im_start|>system
You may call these tools, one per turn, as <tool_call>{"name": ..., "arguments": {...}}</tool_call>:
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|im_end|>
{% endif %}{%- for message in messages %}{%- if message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.role == "assistant" %}<|im_start|>assistant
{{ message.content }}{% for call in message.tool_calls or [] %}<tool_call>
{{- {"name": call.function.name, "arguments": call.function.arguments} | tojson -}}
</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def report(check: str, **fields: object) -> None:
    print(json.dumps({"check": check, **fields}), flush=True)


def model_dir(root: Path) -> Path:
    """A model directory verl can load a tokenizer and a config from (no weights: nothing runs them)."""
    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))},
                                   merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tokenizer.chat_template = CHAT_TEMPLATE
    path = root / "model"
    tokenizer.save_pretrained(path)
    Qwen3Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=8, architectures=["Qwen3ForCausalLM"],
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id).save_pretrained(path)
    return path


def offered_tools(prompt: str) -> list[dict[str, Any]]:
    """The tool definitions the chat template put in a prompt (one JSON object a line)."""
    head = prompt.split("<|im_end|>", 1)[0].split("\n")[1:]
    return [json.loads(line)["function"] for line in head if line.startswith("{")]


def call(name: str, **arguments: Any) -> str:
    return f"Next step.<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def scripts(url: str) -> dict[str, list[Any]]:
    """What the policy answers at each assistant turn, by the word in the row's prompt."""
    fix = load_task(TASK).solution[0].arguments.model_dump()
    return {
        "SOLVE": [call("bash", command="cat -n roman.py"), call("edit_file", **fix), call("run_checks"),
                  call("submit"), "never reached: the episode ended at submit"],
        "GIVE-UP": [call("submit")],
        "IDLE": ["I will not call any tool."],  # ends without submit: graded at the end
        "CRASH": [call("bash", command="true"), lambda: stop_sandboxes(url), call("bash", command="ls")],
    }


def stop_sandboxes(url: str) -> str:
    """The sandboxes go away under the running trajectory (what a crash or a reaper looks like)."""
    client = shared_client(url)
    for server in client.sandboxes():
        client._run(server_action("DELETE", "/api/idegym-servers", client.client_id, server.server_id,
                                  client.namespace))
    return call("bash", command="ls")


class Policy(BaseHTTPRequestHandler):
    """``POST /v1/completions``: the scripted completion for the prompt's policy word and turn."""

    script: dict[str, list[Any]] = {}
    prompts: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["prompt"]
        self.prompts.append(prompt)
        (word,) = [w for w in self.script if f"policy {w}." in prompt]
        turn = prompt.count("<|im_start|>assistant") - 1  # the generation prompt opens one
        answer = self.script[word][turn]
        text = answer() if callable(answer) else answer
        payload = json.dumps({"id": "cmpl", "object": "text_completion", "model": body["model"],
                              "choices": [{"index": 0, "text": text, "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


class CompletionsClient(LLMServerClient):
    """verl's ``LLMServerClient`` over an OpenAI-compatible completions endpoint."""

    def __init__(self, config: Any, base_url: str, tokenizer: Any) -> None:
        super().__init__(config=config, load_balancer_handle=None)
        self.base_url, self.tokenizer = base_url, tokenizer

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> TokenOutput:
        async with httpx.AsyncClient(timeout=60) as http:
            answer = await http.post(f"{self.base_url}/v1/completions", json={
                "model": "policy", "prompt": self.tokenizer.decode(prompt_ids),
                "max_tokens": sampling_params.get("max_tokens", 2048), "temperature": sampling_params["temperature"]})
        answer.raise_for_status()
        ids = self.tokenizer.encode(answer.json()["choices"][0]["text"], add_special_tokens=False)
        ids.append(self.tokenizer.eos_token_id)
        return TokenOutput(token_ids=ids, log_probs=[0.0] * len(ids), stop_reason="completed")


def worker_and_batch(root: Path, url: str, base_url: str, words: list[str]) -> tuple[AgentLoopWorker, DataProto]:
    path = model_dir(root)
    (root / "agent_loops.yaml").write_text(
        f"- name: idegym\n  _target_: idegym_env.integrations.verl.IdeGymAgentLoop\n  control_plane_url: '{url}'\n")
    rows = []
    for word in words:
        (row,) = dataset_rows([TASK], prompt=f"Follow policy {word}.")
        rows.append({**row, "extra_info": {**row["extra_info"], "index": len(rows)}})
    pd.DataFrame(rows).to_parquet(root / "train.parquet")

    config = OmegaConf.load(CONFIG)
    config.actor_rollout_ref.model.path = str(path)
    rollout = config.actor_rollout_ref.rollout
    rollout.prompt_length, rollout.response_length = 8192, 16384
    rollout.name = "vllm"  # what the engine would be; nothing of it is started here
    rollout.multi_turn.format = "hermes"
    rollout.multi_turn.max_assistant_turns = 8
    rollout.agent.agent_loop_config_path = str(root / "agent_loops.yaml")
    config.data.return_raw_chat = True
    worker = AgentLoopWorker(config, CompletionsClient(config, base_url, None))
    worker.llm_client.tokenizer = worker.tokenizer
    dataset = RLHFDataset(data_files=[str(root / "train.parquet")], tokenizer=worker.tokenizer, config=config.data)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    return worker, batch


def main(url: str) -> None:
    Policy.script = scripts(url)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Policy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base_url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            worker, batch = worker_and_batch(Path(tmp), url, base_url, ["SOLVE", "GIVE-UP", "IDLE"])
            out = asyncio.run(worker.generate_sequences(batch))
            scores = out.batch["rm_scores"].sum(dim=-1).tolist()
            assert scores[0] == 1.0 and scores[1] < 1.0 and scores[2] < 1.0, scores
            turns = out.non_tensor_batch["__num_turns__"].tolist()
            assert turns[0] == 9 and turns[1] == 3, turns  # the system-less prompt, 4 calls and their answers
            info = list(out.non_tensor_batch["idegym"])
            assert info[0] == {"task_id": TASK, "submitted": True, "tests_passed": 8, "tests_total": 8}, info
            assert info[1]["submitted"] and not info[2]["submitted"] and info[2]["tests_total"] == 8, info
            responses = worker.tokenizer.batch_decode(out.batch["responses"], skip_special_tokens=True)
            assert "Roman numerals" in responses[0] and "never reached" not in responses[0]
            assert "<tool_response>" in responses[0] and "OK" in responses[0]  # run_checks' output, tool-masked
            assert (out.batch["response_mask"][0] == 0).any() and (out.batch["response_mask"][0] == 1).any()
            report("rollout", scores=scores, turns=turns)

            offered = offered_tools(Policy.prompts[0])  # what verl's loop gave the model: every tool, as defined
            assert [t["name"] for t in offered] == list(TOOLS), offered
            for tool in offered:
                mine = arguments_schema(tool["name"])
                assert set(tool["parameters"]["properties"]) == set(mine["properties"]), tool
                assert set(tool["parameters"].get("required", [])) == set(mine.get("required", [])), tool
                assert tool["description"] == TOOLS[tool["name"]].description, tool
            report("tools", names=[t["name"] for t in offered])

            worker, batch = worker_and_batch(Path(tmp), url, base_url, ["CRASH"])
            try:
                asyncio.run(worker.generate_sequences(batch))
            except InfrastructureError as exc:
                report("sandbox-gone", error=str(exc))
            else:
                raise AssertionError("a trajectory whose sandbox died must fail, not score")

            worker, batch = worker_and_batch(Path(tmp), url, base_url, ["SOLVE"])
            batch.non_tensor_batch["extra_info"][0] = {"index": 0}
            try:
                asyncio.run(worker.generate_sequences(batch))
            except ValueError as exc:
                assert "names no IdeGym task" in str(exc), exc
                report("no-task")
            else:
                raise AssertionError("a row without a task must be refused")
    finally:
        server.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
