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
      one RLlib started); otherwise ``ray.init(**ray_init_kwargs)`` starts one on demand, on
      127.0.0.1 only, and the last ``RayVectorEnv`` that relied on it shuts it down on ``close()``.
    * Actors are spread over the live nodes that have what ``actor_options`` ask for, the least
      used node first (Ray would pack them onto one); a ``scheduling_strategy`` in
      ``actor_options`` replaces that. They reserve no CPU by default (``{"num_cpus": 0}``): a
      sub-env mostly waits for its sandbox.
    * Sandboxes (``info["placement"]`` and ``info["node_id"]`` of every reset say which): without
      ``control_plane_url``, ``"node"``: each sub-env's sandbox lives on the node of its actor, in
      that node's embedded control plane (the driver's own on the driver's node, one started on
      demand on any other, and stopped with the env; see ``placement.py``). With
      ``control_plane_url``, ``"shared"``: every actor uses that control plane and its backend
      decides (the Kubernetes backend at scale); a loopback URL pins the actors to this node.

Spaces
    ``single_observation_space`` / ``single_action_space`` are the sub-env's (after
    ``env_wrappers``). Numeric spaces (``Box``, ``Discrete``, ``MultiDiscrete``, ``MultiBinary``
    and ``Dict``/``Tuple`` of them) batch the gymnasium way (``Box`` → ``Box`` with a leading
    axis, ``Discrete`` → ``MultiDiscrete``). Everything else, text and tool calls, batches to an
    :class:`ObjectBatch`: a 1-D ``dtype=object`` array with one element per sub-env. Object
    arrays are leaves for RLlib's batching and never go through shared memory.

Actors
    One actor per sub-env by default; ``envs_per_actor=k`` puts ``k`` sub-envs in each actor and
    steps them on threads there, so that a vector step costs one call per actor. A step reaches
    an actor on the env's own node (a driver's, or an RLlib EnvRunner's) over a direct channel
    (``channel.py``: a Unix socket, a fraction of a Ray call's CPU); actors on other nodes, and
    every other call, go through Ray.

Failures
    When a sub-env's actor dies, its env raises, or a step exceeds ``step_timeout``, only that
    slot's episode ends: ``truncated=True``, ``reward=0``, the slot's last observation, and
    ``info["slot_failure"]`` (``"actor_died"``, ``"env_error"`` or ``"timeout"``) with the reason
    in ``info["error"]`` and ``info["infrastructure_error"]``: the 0 is no score, mask it. A
    dead or stuck actor is replaced at once (the old one is killed and its sandboxes are
    stopped); an env that raised is rebuilt inside its actor. When a node is lost, its sub-envs
    are reported so (``info["node_lost"]``, ``info["node_id"]``) and come back on the other nodes
    (the lost node is avoided from then on); the vector env keeps its ``num_envs``, and the lost
    node's control plane ends and deletes its sandboxes. The next step resets
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

import importlib
from typing import Any

# Names -> the module that defines them. They load on first use, so that the node keeper
# (``python -m idegym_env.vector.node_keeper``, a plain process) does not import Ray.
_EXPORTS = {
    "RayVectorEnv": ".env", "NEXT_STEP": ".env",
    "rllib_env_creator": ".rllib",
    "SubEnvGroup": ".sub_envs",
    "SlotFailure": ".failures",
    "SimulatedCluster": ".local_ray",
    "ObjectBatch": "..spaces.object_batch", "object_array": "..spaces.object_batch",
    "is_numeric_space": "..spaces.object_batch",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module, __name__), name)
    except ModuleNotFoundError as exc:
        if exc.name == "ray" or (exc.name or "").startswith("ray."):
            raise ImportError("RayVectorEnv needs Ray: pip install 'idegym[ray]'") from exc
        raise
    globals()[name] = value
    return value


__all__ = ["NEXT_STEP", "ObjectBatch", "RayVectorEnv", "SimulatedCluster", "SlotFailure", "SubEnvGroup",
           "is_numeric_space", "object_array", "rllib_env_creator"]
