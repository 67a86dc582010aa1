"""Reward functions over an episode's check results.

A reward is any callable ``CheckResults -> float`` (:class:`RewardFunction`). The leaves are in
``[0, 1]``; combine them with :func:`weighted_sum`, :func:`step_penalty` and :func:`clip`, or
describe them as data (:class:`RewardSpec`, :func:`build_reward`) as tasks do::

    reward = clip(weighted_sum({test_pass_fraction: 1.0, step_penalty(0.01): 1.0}))
    reward(CheckResults.from_responses(tests=body, steps=12))

Rules shared by all leaves (see :class:`CheckResults`): checks form a pipeline setup →
compilation → tests, a failed stage fails the later ones, a missing stage counts as passed, and
any infrastructure error in ``errors`` gives 0.
"""

from .combinators import Clip, StepPenalty, WeightedSum, clip, reward_name, step_penalty, weighted_sum
from .functions import (
    RewardFunction,
    all_tests_pass,
    compiles,
    reward_components,
    setup_succeeds,
    submitted,
    test_pass_fraction,
    verifier_reward,
)
from .results import CheckResult, CheckResults, Status, TestReport, TestScores
from .spec import LEAVES, RewardSpec, build_reward, register_reward

__all__ = [
    "CheckResults",
    "CheckResult",
    "TestReport",
    "TestScores",
    "Status",
    "RewardFunction",
    "setup_succeeds",
    "compiles",
    "test_pass_fraction",
    "all_tests_pass",
    "submitted",
    "verifier_reward",
    "reward_components",
    "weighted_sum",
    "step_penalty",
    "clip",
    "WeightedSum",
    "StepPenalty",
    "Clip",
    "reward_name",
    "RewardSpec",
    "build_reward",
    "register_reward",
    "LEAVES",
]
