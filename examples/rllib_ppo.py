"""Train PPO with RLlib on the discrete-action variant of a bundled IdeGym task.

    .venv/bin/python examples/rllib_ppo.py                  # python-roman-numerals, 10 iterations
    .venv/bin/python examples/rllib_ppo.py --iterations 20 --num-envs 8 --task python-lru-cache
    .venv/bin/python examples/rllib_ppo.py --simulate-nodes 3 --num-envs 6   # 3 Ray nodes on this host

The policy sees the observation as 64 byte-token ids (``TokenizeObservation``) and picks one of
the task's candidate tool calls or ``submit`` (``DiscreteActions``). The episodes run in
sandboxes, one Ray actor per sub-env (``RayVectorEnv``, RLlib's ``VECTOR_ENTRY_POINT`` mode).
Each iteration prints the mean episode reward; a random policy earns the reward of a random
sequence of edits, the learned one applies the fix and submits. Not a test: PPO is stochastic,
and the numbers depend on the seed and the machine.

The recipe is explained in docs/rllib.md.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time

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
                        help="reward cost per tool call, so that fixing and submitting early pays most; "
                             "0 keeps the task's own reward (default: %(default)s)")
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

    reward_fn = None
    if args.step_penalty:
        reward_fn = clip(weighted_sum({load_task(args.task).reward_function(): 1.0,
                                       step_penalty(args.step_penalty): 1.0}))
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
        .debugging(seed=args.seed, log_level="ERROR")
    )
    algo = config.build_algo()
    rewards: list[float] = []
    try:
        print(f"{'iter':>4}  {'episodes':>8}  {'env steps':>9}  {'mean reward':>11}  {'mean length':>11}  "
              f"{'seconds':>7}", flush=True)
        for i in range(1, args.iterations + 1):
            started = time.monotonic()
            result = algo.train()
            runners = result.get("env_runners", {})
            mean = float(runners.get("episode_return_mean", math.nan))
            length = float(runners.get("episode_len_mean", math.nan))
            episodes = int(runners.get("num_episodes", 0))
            steps = int(runners.get("num_env_steps_sampled", 0))
            rewards.append(mean)
            print(f"{i:>4}  {episodes:>8}  {steps:>9}  {mean:>11.3f}  {length:>11.2f}  "
                  f"{time.monotonic() - started:>7.1f}", flush=True)
    finally:
        algo.stop()
        if cluster is not None:
            cluster.close()
        else:
            ray.shutdown()
    finite = [r for r in rewards if not math.isnan(r)]
    if len(finite) >= 2:
        first, last = finite[0], finite[-1]
        verdict = "rose" if last > first else "did not rise"
        print(f"mean episode reward {verdict}: {first:.3f} (iteration 1) -> {last:.3f} (iteration {len(rewards)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
