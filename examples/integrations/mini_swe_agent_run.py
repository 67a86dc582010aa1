"""mini-swe-agent's DefaultAgent on an IdeGym task (pip install 'idegym[mini-swe-agent]').

    python examples/integrations/mini_swe_agent_run.py

The model here is mini-swe-agent's DeterministicModel replaying the known fix, so the example runs
without an LLM; put ``get_model(config=...)`` (LiteLLM, OpenRouter...) in its place for a real one.
The environment is made exactly as mini-swe-agent makes it from a YAML ``environment`` section.
"""

import os

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

import yaml  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.config import builtin_config_dir  # noqa: E402
from minisweagent.environments import get_environment  # noqa: E402
from minisweagent.models.test_models import DeterministicModel, make_output  # noqa: E402

from idegym_env.tasks import load_task  # noqa: E402

config = yaml.safe_load((builtin_config_dir / "default.yaml").read_text())
env = get_environment({**config["environment"],
                       "environment_class": "idegym_env.integrations.mini_swe_agent.IdeGymEnvironment",
                       "task": "python-roman-numerals"})

fix = load_task("python-roman-numerals").solution[0].arguments  # an edit of roman.py's lines
edit = (f"python3 - <<'EOF'\nimport pathlib\np = pathlib.Path({fix.path!r})\nlines = p.read_text().splitlines(True)\n"
        f"lines[{fix.start_line - 1}:{fix.end_line}] = [{fix.new_content!r}]\np.write_text(''.join(lines))\nEOF")
commands = ["cat -n roman.py", edit, "$IDEGYM_JUDGE tests/ | tail -n 2", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]
model = DeterministicModel(outputs=[make_output(f"THOUGHT: step {i}", [{"command": c}])
                                    for i, c in enumerate(commands)])

agent = DefaultAgent(model, env, **config["agent"])
result = agent.run(env.instruction)
print(result["exit_status"], "reward:", env.reward)
print("tests:", env.grading["tests"]["scores"])
env.cleanup()
