"""One SkyRL-style multi-turn rollout of the ``idegym`` text env (pip install 'idegym[skyrl]').

    python examples/integrations/skyrl_rollout.py

In a SkyRL training run the generator does exactly this with the model's text: ``skyrl_gym.make``
with the dataset row's ``env_extras`` (``{"task": ...}``), ``init(prompt)``, ``step(text)`` until
``done``, ``close()``. In the config: ``environment.env_class: idegym`` and, per row,
``env_extras: {task: python-roman-numerals}``; ``skyrl_gym.idegym.control_plane_url`` if you run one.
"""

import json

import skyrl_gym

import idegym_env.integrations.skyrl  # noqa: F401 - registers "idegym"
from idegym_env.tasks import load_task

fix = load_task("python-roman-numerals").solution[0]
turns = [  # what a model would write, one tool call per turn
    '<tool_call>{"name": "bash", "arguments": {"command": "cat -n roman.py"}}</tool_call>',
    "<tool_call>" + json.dumps({"name": "edit_file", "arguments": fix.arguments.model_dump()}) + "</tool_call>",
    '<tool_call>{"name": "run_checks"}</tool_call>',
    '<tool_call>{"name": "submit"}</tool_call>',
]
env = skyrl_gym.make("idegym", env_config={}, extras={"task": "python-roman-numerals", "max_turns": 10})
prompt, meta = env.init([{"role": "user", "content": "Fix the bug described below."}])
for text in turns:
    out = env.step(text)
    print(f"reward={out['reward']} done={out['done']}")
    if out["done"]:
        break
print(env.get_metrics())
env.close()
