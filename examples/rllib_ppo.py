"""Train PPO with RLlib on the discrete-action variant of a bundled IdeGym task.

    .venv/bin/python examples/rllib_ppo.py                  # python-roman-numerals, 10 iterations
    .venv/bin/python examples/rllib_ppo.py --iterations 20 --num-envs 8 --task python-lru-cache
    .venv/bin/python examples/rllib_ppo.py --simulate-nodes 3 --num-envs 6   # 3 Ray nodes on this host

The policy sees the observation as 64 byte-token ids (``TokenizeObservation``) and picks one of
the task's candidate tool calls or ``submit`` (``DiscreteActions``). The episodes run in
sandboxes, one Ray actor per sub-env (``RayVectorEnv``, RLlib's ``VECTOR_ENTRY_POINT`` mode).

What it learns: to apply the fix, then submit. The reward is the task's (the fraction of tests
that pass) for a *submitted* episode, minus 0.02 per tool call; an episode that runs out of
steps earns 0 (IdeGym grades a truncated episode too, and with the task's reward alone a policy
that applies the fix and never submits scores almost as well: ``--pay-truncated`` shows it).
Each iteration prints the mean episode reward, the mean episode length (tool calls, counted by
the env), and how many episodes were submitted and solved. A random policy submits early and
rarely solves (mean reward about 0.3); the learned one fixes and submits in 2 steps (0.96).

RLlib's own ``episode_len_mean`` can exceed ``--max-steps`` with ``--env-runners 0``: RLlib
counts an episode's earlier chunks after its learner has added a bootstrap step to the very same
episode objects, so an episode that spans two ``sample()`` calls counts one step too many. The
"length" column is the env's own count (``info["step"]`` at the episode's end), which never does.
Not a test: PPO is stochastic, and the numbers depend on the seed and the machine; the figures
of a run are in docs/rllib.md.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time
from typing import Any

# Ray prints a warning about token authentication on every start; keep the output readable.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DEDUP_LOGS", "1")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Train PPO (RLlib) on the discrete-action variant of a bundled IdeGym task and print the "
                    "mean episode reward per iteration.")
    parser.add_argument("--task", default="python-roman-numerals", help="bundled task id (default: %(default)s)")
    parser.add_argument("--iterations", type=int, default=10, help="PPO training iterations (default: %(default)s)")
    parser.add_argument("--num-envs", type=int, default=4,
                        help="sub-envs (sandboxes) per env runner (default: %(default)s)")
    parser.add_argument("--env-runners", type=int, default=0,
                        help="remote env runners; 0 samples in the driver (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=128, help="env steps per training batch (default: %(default)s)")
    parser.add_argument("--max-steps", type=int, default=5, help="episode step budget (default: %(default)s)")
    parser.add_argument("--tokens", type=int, default=64, help="observation length in tokens (default: %(default)s)")
    parser.add_argument("--step-penalty", type=float, default=0.02,
                        help="reward cost per tool call, so that fixing and submitting early pays most "
                             "(default: %(default)s)")
    parser.add_argument("--pay-truncated", action="store_true",
                        help="pay the task's reward for an episode that ran out of steps too (IdeGym grades "
                             "it); by default only a submitted episode earns it")
    parser.add_argument("--lr", type=float, default=1e-3, help="learning rate (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    parser.add_argument("--control-plane-url", default=None,
                        help="an IdeGym control plane; default: the embedded one, started here")
    parser.add_argument("--ray-address", default=None,
                        help="an existing Ray cluster (ray.init(address=...)); default: a local Ray with "
                             "2 CPUs, listening on 127.0.0.1 only")
    parser.add_argument("--simulate-nodes", type=int, default=0, metavar="N",
                        help="instead, a simulated cluster of N Ray nodes on this host (each sub-env's sandbox "
                             "on its actor's node)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"starting Ray and RLlib (PPO on {args.task}, {args.num_envs} sandboxes) ...", flush=True)
    import gymnasium as gym
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.tune.registry import register_env

    from idegym_env.rewards import clip, step_penalty, weighted_sum
    from idegym_env.tasks import load_task
    from idegym_env.vector import rllib_env_creator
    from idegym_env.vector.local_ray import SimulatedCluster, init_local
    from idegym_env.wrappers import DiscreteActions, TokenizeObservation

    cluster = None
    if args.ray_address:
        ray.init(address=args.ray_address, log_to_driver=False)
    elif args.simulate_nodes:
        cluster = SimulatedCluster(args.simulate_nodes, cpus_per_node=1)
    else:
        init_local(num_cpus=2, log_to_driver=False)  # a Ray for this machine only: on 127.0.0.1
    register_env("idegym", rllib_env_creator)

    task_reward = load_task(args.task).reward_function()
    if not args.pay_truncated:
        task_reward = functools.partial(if_submitted, task_reward)
    reward_fn = clip(weighted_sum({task_reward: 1.0, step_penalty(args.step_penalty): 1.0}))
    env_config = {
        "task": args.task,
        "max_steps": args.max_steps,
        "reward_fn": reward_fn,
        "control_plane_url": args.control_plane_url,
        # Applied inside each actor: discrete actions, then text → token ids.
        "env_wrappers": [DiscreteActions, functools.partial(TokenizeObservation, length=args.tokens)],
    }
    config = (
        PPOConfig()
        .environment("idegym", env_config=env_config)
        .env_runners(
            num_env_runners=args.env_runners,
            num_envs_per_env_runner=args.num_envs,
            gym_env_vectorize_mode=gym.VectorizeMode.VECTOR_ENTRY_POINT,
            num_cpus_per_env_runner=0,  # the sandboxes do the work; the runners mostly wait
            rollout_fragment_length="auto",
        )
        .training(
            train_batch_size_per_learner=args.batch,
            minibatch_size=min(32, args.batch),
            num_epochs=8,
            lr=args.lr,
            gamma=0.95,
            entropy_coeff=0.01,
        )
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[64, 64]))
        .callbacks(on_episode_end=log_episode)
        .debugging(seed=args.seed, log_level="ERROR")
    )
    algo = config.build_algo()
    rows: list[dict[str, float]] = []
    try:
        print(f"{'iter':>4}  {'episodes':>8}  {'env steps':>9}  {'mean reward':>11}  {'length':>6}  "
              f"{'RLlib length':>12}  {'submitted':>9}  {'solved':>6}  {'seconds':>7}", flush=True)
        for i in range(1, args.iterations + 1):
            started = time.monotonic()
            result = algo.train()
            runners = result.get("env_runners", {})
            row = {key: float(runners.get(name, math.nan)) for key, name in (
                ("reward", "episode_return_mean"), ("rllib_length", "episode_len_mean"),
                ("length", "idegym_steps"), ("submitted", "idegym_submitted"), ("solved", "idegym_solved"))}
            rows.append(row)
            print(f"{i:>4}  {int(runners.get('num_episodes', 0)):>8}  {int(runners.get('num_env_steps_sampled', 0)):>9}"
                  f"  {row['reward']:>11.3f}  {row['length']:>6.2f}  {row['rllib_length']:>12.2f}  "
                  f"{row['submitted']:>9.0%}  {row['solved']:>6.0%}  {time.monotonic() - started:>7.1f}", flush=True)
    finally:
        algo.stop()
        if cluster is not None:
            cluster.close()
        else:
            ray.shutdown()
    if len(rows) >= 2:
        first, last = rows[0], rows[-1]
        print(f"iteration 1 -> {len(rows)}: mean reward {first['reward']:.3f} -> {last['reward']:.3f}, "
              f"length {first['length']:.2f} -> {last['length']:.2f} steps, submitted {first['submitted']:.0%} -> "
              f"{last['submitted']:.0%}, solved {first['solved']:.0%} -> {last['solved']:.0%}")
    return 0


def if_submitted(reward_fn: Any, results: Any) -> float:
    """``reward_fn``'s reward for a submitted episode; 0 for one that ran out of steps."""
    return float(reward_fn(results)) if results.submitted else 0.0


def log_episode(*, episode: Any, metrics_logger: Any, **_: Any) -> None:
    """RLlib callback: the env's own account of each finished episode (its last step's info)."""
    info = episode.get_infos(-1)
    components = info.get("reward_components") or {}
    for name, value in (("idegym_steps", info.get("step", math.nan)),
                        ("idegym_submitted", float(bool(info.get("submitted")))),
                        ("idegym_solved", float(components.get("all_tests_pass") == 1.0))):
        metrics_logger.log_value(name, float(value), reduce="mean", window=100)


if __name__ == "__main__":
    sys.exit(main())
