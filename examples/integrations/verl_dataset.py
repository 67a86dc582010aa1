"""Rows for verl's RLHFDataset whose trajectories are IdeGym episodes (pip install 'idegym[verl]').

    python examples/integrations/verl_dataset.py /tmp/idegym_train.parquet
    python -m verl.trainer.main_ppo \\
        data.train_files=/tmp/idegym_train.parquet data.val_files=/tmp/idegym_train.parquet \\
        actor_rollout_ref.rollout.multi_turn.format=hermes \\
        actor_rollout_ref.rollout.agent.agent_loop_config_path=examples/integrations/verl_agent_loops.yaml \\
        ...                                        # the model, engine (vLLM/SGLang) and trainer settings

Each row names its task in ``extra_info.task`` and the ``idegym`` agent loop in ``agent_name``;
the reward is the task's grading (``reward_score`` of the agent loop's output), so no reward
function is needed.
"""

import sys

import pandas as pd

from idegym_env.integrations.verl import dataset_rows

rows = dataset_rows(["python-roman-numerals", "python-lru-cache"], repeat=4)
pd.DataFrame(rows).to_parquet(sys.argv[1] if len(sys.argv) > 1 else "idegym_train.parquet")
print(f"{len(rows)} rows")
