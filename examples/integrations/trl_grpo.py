"""GRPO on IdeGym tasks with TRL (pip install 'idegym[trl]').

    python examples/integrations/trl_grpo.py Qwen/Qwen3-0.6B

Each rollout gets an IdeGym episode: TRL calls ``reset(**row)`` with the dataset row (its ``task``
column), lets the model call the environment's tools (bash, read/write/edit/patch file,
run_checks), then ``get_reward()`` grades the episode. Rollouts whose sandbox failed score
``None``, which TRL leaves out of the group baseline. Sandboxes come from the embedded control
plane unless IDEGYM_URL names one.
"""

import os
import sys

from trl import GRPOConfig, GRPOTrainer

from idegym_env.integrations.trl import IdeGymTRLEnv, task_dataset

model = sys.argv[1] if len(sys.argv) > 1 else "Qwen/Qwen3-0.6B"
trainer = GRPOTrainer(
    model=model,
    train_dataset=task_dataset(["python-roman-numerals", "python-lru-cache"], repeat=8),
    environment_factory=IdeGymTRLEnv.factory(control_plane_url=os.environ.get("IDEGYM_URL"), max_steps=20),
    args=GRPOConfig(output_dir="grpo-idegym", num_generations=4, per_device_train_batch_size=4,
                    max_completion_length=2048, max_tool_calling_iterations=20, max_steps=10),
)
trainer.train()
