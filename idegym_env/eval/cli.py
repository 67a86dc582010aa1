"""``idegym eval``: arguments and entry point (wired into ``idegym_env.cli``)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any

from ..settings import ClientSettings, add_control_plane_argument, chosen_control_plane

DESCRIPTION = """\
Run every task (--attempts times) as an IdeGym episode with an agent, --parallel at a time, and
report the pass rate. Each finished episode is appended to OUT/episodes.jsonl (with its transcript
in OUT/transcripts/); the summary is printed and written to OUT/summary.md and OUT/summary.json.

Running the same command again resumes: finished episodes are not redone. A directory holding a
different run (other tasks, agent or its arguments, attempts, seed, step limit or pass
criterion) is refused; use --overwrite.
An agent that raises, or an episode over --episode-timeout, is recorded as an error and the run
goes on. Exit status: 0 when the run finished (whatever the pass rate); 1 when any episode ended
in an infrastructure error (the environment failed: image, sandbox, control plane; or the agent's
model endpoint was unreachable) or the control plane could not be used at all; 2 for bad
arguments; 130 when interrupted.
An episode passes when its reward is 1.0 (--pass-threshold R: reward >= R; "solved":
every check of the task succeeded, whatever the reward).
"""

EPILOG = """\
agents:
  oracle               replays each task's known solution, then submits (validates a task set)
  noop                 submits at once
  openai               a model behind an OpenAI-compatible /v1/chat/completions endpoint with tool
                       calling; --agent-arg model=NAME base_url=URL (or $OPENAI_MODEL,
                       $OPENAI_BASE_URL, $OPENAI_API_KEY), temperature=0, max_tokens=N
  MODULE:NAME          e.g. my_agents:Agent or ./agent.py:Agent. A class is instantiated per
                       episode with the --agent-arg values; any other callable
                       (observation, info) -> action is shared by all episodes.
  harness:NAME         an agent that brings its own loop (mini-swe-agent, tmux, codex) runs in
                       the sandbox, its model calls forwarded to --agent-arg model_url=URL (an
                       OpenAI-compatible server) and recorded; model_name=, api_key= (docs/agents.md)

examples:
  idegym eval --tasks bundled --agent oracle --parallel 4 --out results/oracle
  idegym eval --tasks ./my-tasks --agent openai --agent-arg model=qwen2.5-coder \\
      --agent-arg base_url=http://localhost:8000/v1 --attempts 5 --parallel 8 --out results/qwen
  idegym eval --tasks bundled --agent harness:mini-swe-agent \
      --agent-arg model_url=http://localhost:8000/v1 --agent-arg model_name=qwen2.5-coder --out results/msa
"""


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    env = ClientSettings.from_env()
    parser.add_argument("--tasks", action="append", required=True, metavar="DIR_OR_NAME",
                        help="'bundled', a directory of tasks, a task directory, a bundled task id, or a "
                             "comma-separated list of these (repeatable)")
    parser.add_argument("--agent", required=True, metavar="SPEC",
                        help="oracle, noop, openai, or MODULE:CALLABLE (see below)")
    parser.add_argument("--agent-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="keyword argument for the agent (VALUE parsed as JSON when it can be; "
                             "repeatable). Keys that look secret are not recorded")
    parser.add_argument("--out", required=True, metavar="DIR", help="results directory (created if needed)")
    parser.add_argument("--parallel", "-n", type=int, metavar="N",
                        default=env.eval_parallel,
                        help="episodes at a time (default 1) [$IDEGYM_EVAL_PARALLEL]")
    parser.add_argument("--attempts", "-k", type=int, default=1, metavar="K",
                        help="attempts per task; pass@K is reported (default 1)")
    parser.add_argument("--episode-timeout", type=float, default=1800.0, metavar="SECONDS",
                        help="wall-time limit of one episode, sandbox start and grading included "
                             "(default 1800)")
    parser.add_argument("--max-steps", type=int, default=None, metavar="N",
                        help="step budget per episode (default: each task's max_steps)")
    parser.add_argument("--seed", type=int, default=0, help="run seed; each episode's seed derives from it, "
                                                            "the task and the attempt (default 0)")
    parser.add_argument("--pass-threshold", type=_threshold, default=1.0, metavar="R",
                        help="an episode passes when its reward >= R (default 1.0); 'solved': when "
                             "every check of the task succeeded (setup, compilation, all tests), whatever "
                             "the reward")
    add_control_plane_argument(parser)
    parser.add_argument("--ray", action="store_true",
                        help="run episodes as Ray tasks instead of threads (needs idegym[ray])")
    parser.add_argument("--ray-address", default=None, metavar="ADDR",
                        help="Ray cluster to join (default: $RAY_ADDRESS or a local Ray)")
    parser.add_argument("--bash-timeout", type=float, default=120.0, metavar="SECONDS",
                        help="default timeout of the agent's bash calls (default 120)")
    parser.add_argument("--retry-errors", action="store_true",
                        help="when resuming, also redo episodes that were recorded as errors")
    parser.add_argument("--overwrite", action="store_true",
                        help="discard the results of a previous run in --out instead of resuming it")
    parser.add_argument("--no-progress", action="store_true", help="no progress line on stderr")


def parse_agent_args(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"idegym eval: --agent-arg must be KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _threshold(text: str) -> float | None:
    if text.strip().lower() == "solved":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'solved', got {text!r}") from None


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run_eval(args: argparse.Namespace) -> int:
    from ..tasks import TaskError
    from . import AgentSpecError, ManifestMismatch, evaluate
    from .runner import ControlPlaneUnavailable

    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the run like Ctrl-C: resumable
    try:
        result = evaluate(
            ",".join(args.tasks), args.agent, out=args.out, agent_args=parse_agent_args(args.agent_arg),
            attempts=args.attempts, parallel=args.parallel, episode_timeout=args.episode_timeout,
            max_steps=args.max_steps, seed=args.seed, control_plane_url=chosen_control_plane(args.control_plane_url),
            use_ray=args.ray, ray_address=args.ray_address, retry_errors=args.retry_errors,
            overwrite=args.overwrite, pass_threshold=args.pass_threshold, progress=not args.no_progress,
            print_summary=True, bash_timeout=args.bash_timeout)
    except (ManifestMismatch, AgentSpecError, TaskError, ValueError) as exc:
        print(f"idegym eval: {exc}", file=sys.stderr)
        return 2
    except ControlPlaneUnavailable as exc:
        print(f"idegym eval: {exc}; nothing was run (exit status 1)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"idegym eval: interrupted; run the same command again to resume ({args.out})", file=sys.stderr)
        return 130
    if result.interrupted:
        print(f"idegym eval: interrupted after {result.ran} episodes; run the same command again to resume "
              f"({args.out})", file=sys.stderr)
        return 130
    broken = result.summary["overall"].get("infrastructure_errors") or 0
    if broken:
        print(f"idegym eval: {broken} of {result.summary['episodes_done']} episodes ended in an infrastructure "
              f"error (exit status 1); their errors are in {args.out}/episodes.jsonl. Once the cause is fixed, "
              "run the same command with --retry-errors to run them again", file=sys.stderr)
        return 1
    return 0


__all__ = ["add_eval_arguments", "run_eval", "DESCRIPTION", "EPILOG"]
