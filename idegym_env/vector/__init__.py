"""``RayVectorEnv``: many IdeGym episodes side by side in Ray actors, one sandbox per sub-env.

    import gymnasium as gym
    import idegym_env

    envs = gym.make_vec("IdeGym-v0", num_envs=8, vectorization_mode="vector_entry_point",
                        task="python-lru-cache")
    obs, infos = envs.reset(seed=0)           # obs: 1-D object array of str
    obs, rewards, terminated, truncated, infos = envs.step(actions)
    envs.close()

What it is
    A :class:`gymnasium.vector.VectorEnv` whose sub-envs are :class:`~idegym_env.env.IdeGymEnv`
    instances living in Ray actors. ``step`` sends every action at once and waits for all of
    them, so the sub-envs run concurrently; Ray does the scheduling, on one machine or many.
    Autoreset is ``NEXT_STEP`` (declared in ``metadata["autoreset_mode"]``), as RLlib expects.

Where things run
    * Ray: an initialised Ray is used as it is (``ray.init(address=...)`` for a cluster, or the
      one RLlib started); otherwise ``ray.init(**ray_init_kwargs)`` starts one on demand, and the
      last ``RayVectorEnv`` that relied on it shuts it down on ``close()``.
    * Control plane: with ``control_plane_url`` every actor connects to it (the sandboxes then
      live wherever that control plane puts them: the local backend or Kubernetes). Without it
      the *driver* starts the embedded control plane once and hands its URL to the actors;
      because that URL is a loopback address, the actors are then pinned to the driver's node.
    * Actors reserve no CPU by default (``actor_options={"num_cpus": 0}``): a sub-env mostly
      waits for its sandbox.

Spaces
    ``single_observation_space`` / ``single_action_space`` are the sub-env's (after
    ``env_wrappers``). Numeric spaces (``Box``, ``Discrete``, ``MultiDiscrete``, ``MultiBinary``
    and ``Dict``/``Tuple`` of them) batch the gymnasium way (``Box`` → ``Box`` with a leading
    axis, ``Discrete`` → ``MultiDiscrete``). Everything else, text and tool calls, batches to an
    :class:`ObjectBatch`: a 1-D ``dtype=object`` array with one element per sub-env. Object
    arrays are leaves for RLlib's batching and never go through shared memory.

Actors
    One actor per sub-env by default; ``envs_per_actor=k`` puts ``k`` sub-envs in each actor and
    steps them on threads there, so that a vector step costs one Ray call per actor. On two cores
    at 8 sub-envs that is 87 % of the raw-call ceiling, against 60–75 % with one actor each; on a
    cluster with a CPU per sub-env the default is right.

Failures
    When a sub-env's actor dies, its env raises, or a step exceeds ``step_timeout``, only that
    slot's episode ends: ``truncated=True``, ``reward=0``, the slot's last observation, and
    ``info["slot_failure"]`` (``"actor_died"``, ``"env_error"`` or ``"timeout"``) with the reason
    in ``info["error"]``. A dead or stuck actor is replaced at once (the old one is killed and its
    sandboxes are stopped); an env that raised is rebuilt inside its actor. The next step resets
    the slot, as autoreset does after any episode. With ``envs_per_actor > 1`` an actor's death
    or timeout ends the episodes of all its sub-envs; an env that raises still ends only its own.
    A sandbox that dies is handled by the sub-env itself (truncated, ``info["sandbox_lost"]``;
    the next reset gets a new sandbox). Resetting a slot is retried up to ``max_slot_restarts``
    times before the error is raised.

Sub-env wrappers
    ``env_wrappers`` are applied to each sub-env *inside* its actor, in order, e.g.
    ``[DiscreteActions, partial(TokenizeObservation, length=128)]`` for RLlib's default models.
    They must be picklable (classes, module-level functions, ``functools.partial`` of those).
    (``make_vec`` reserves the name ``wrappers`` for itself, hence ``env_wrappers``.)

Close ``close()`` before ``ray.shutdown()``; it is idempotent, and after a shutdown it only
releases what does not need Ray.
"""

from __future__ import annotations

try:
    import ray  # noqa: F401 - every module of this package needs it
except ImportError as _exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("RayVectorEnv needs Ray: pip install 'idegym[ray]'") from _exc

from ..spaces.object_batch import ObjectBatch, is_numeric_space, object_array
from .env import NEXT_STEP, RayVectorEnv
from .failures import SlotFailure
from .rllib import rllib_env_creator
from .sub_envs import SubEnvGroup

__all__ = ["RayVectorEnv", "rllib_env_creator", "ObjectBatch", "SubEnvGroup", "SlotFailure", "object_array",
           "is_numeric_space", "NEXT_STEP"]
