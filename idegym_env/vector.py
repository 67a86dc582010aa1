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

import concurrent.futures
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

import gymnasium as gym
import numpy as np
from gymnasium import spaces as gym_spaces
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

try:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError as _exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("RayVectorEnv needs Ray: pip install 'idegym[ray]'") from _exc

from . import embedded

# gymnasium 1.0 has no AutoresetMode (added in 1.1); its vector envs all behave as NEXT_STEP.
AutoresetMode = getattr(gym.vector, "AutoresetMode", None)
NEXT_STEP: Any = AutoresetMode.NEXT_STEP if AutoresetMode is not None else "NextStep"

DEFAULT_ACTOR_OPTIONS: dict[str, Any] = {"num_cpus": 0}
# How long close() waits for the sub-envs to hand their sandboxes back before killing the actors.
CLOSE_TIMEOUT = 30.0
_LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]", "0.0.0.0"}


# -- the batched space of non-numeric sub-spaces ------------------------------------------------


class ObjectBatch(gym.Space):
    """``n`` members of ``single`` as a 1-D ``dtype=object`` array (text, tool calls, …)."""

    def __init__(self, single: gym.Space, n: int, seed: int | np.random.Generator | None = None) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.single = single
        self.n = n
        super().__init__(shape=(n,), dtype=object, seed=seed)

    def seed(self, seed: int | None = None) -> Any:
        result = super().seed(seed)
        # The elements draw from the single space: seed it from ours so that sample() is reproducible.
        self.single.seed(int(self.np_random.integers(2**31)) if seed is not None else None)
        return result

    def contains(self, x: Any) -> bool:
        if isinstance(x, np.ndarray):
            if x.shape != (self.n,):
                return False
        elif not isinstance(x, (list, tuple)) or len(x) != self.n:
            return False
        return all(self.single.contains(item) for item in x)

    def sample(self, mask: Any | None = None, probability: Any | None = None) -> np.ndarray:
        out = np.empty(self.n, dtype=object)
        for i in range(self.n):
            m = None if mask is None else mask[i]
            p = None if probability is None else probability[i]
            out[i] = self.single.sample(mask=m, probability=p) if (m is not None or p is not None) \
                else self.single.sample()
        return out

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def to_jsonable(self, sample_n: Sequence[np.ndarray]) -> list[list[Any]]:
        return [self.single.to_jsonable(list(x)) for x in sample_n]

    def from_jsonable(self, sample_n: Sequence[Sequence[Any]]) -> list[np.ndarray]:
        return [object_array(self.single.from_jsonable(list(x))) for x in sample_n]

    def __repr__(self) -> str:
        return f"ObjectBatch({self.single!r}, {self.n})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectBatch) and self.n == other.n and self.single == other.single

    def __hash__(self) -> int:
        return hash((ObjectBatch, self.n))


def object_array(items: Iterable[Any]) -> np.ndarray:
    """A 1-D object array of ``items`` (element by element, so that lists or dicts stay whole)."""
    items = list(items)
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


def is_numeric_space(space: gym.Space) -> bool:
    """True when gymnasium's own batching (``batch_space``/``concatenate``) fits the space."""
    if isinstance(space, (gym_spaces.Box, gym_spaces.Discrete, gym_spaces.MultiDiscrete, gym_spaces.MultiBinary)):
        return True
    if isinstance(space, gym_spaces.Dict):
        return all(is_numeric_space(s) for s in space.spaces.values())
    if isinstance(space, gym_spaces.Tuple):
        return all(is_numeric_space(s) for s in space.spaces)
    return False


# -- the actor ----------------------------------------------------------------------------------


def _build_env(env_kwargs: dict[str, Any], wrappers: Sequence[Callable[[gym.Env], gym.Env]]) -> gym.Env:
    from .env import IdeGymEnv

    env: gym.Env = IdeGymEnv(**env_kwargs)
    for wrapper in wrappers:
        env = wrapper(env)
    return env


class SubEnvGroup:
    """Holds ``count`` sub-envs inside one Ray actor (``ray.remote(SubEnvGroup)``).

    ``run`` takes one batch of calls, at most one per sub-env, and runs them side by side on
    threads (a sub-env mostly waits for its sandbox): a vector step costs one Ray call per actor,
    not one per sub-env. A sub-env's exception is returned as its result, not raised, so that it
    ends only that sub-env's episode.
    """

    def __init__(self, env_kwargs: dict[str, Any], wrappers: Sequence[Callable[[gym.Env], gym.Env]],
                 count: int = 1) -> None:
        self._env_kwargs, self._wrappers = env_kwargs, tuple(wrappers)
        self.envs = [_build_env(env_kwargs, wrappers) for _ in range(count)]
        self._threads = concurrent.futures.ThreadPoolExecutor(count) if count > 1 else None

    def describe(self) -> list[dict[str, Any]]:
        out = []
        for env in self.envs:
            try:
                client_id = env.unwrapped.client.client_id  # type: ignore[attr-defined]
            except (AttributeError, RuntimeError):
                client_id = None
            out.append({
                "observation_space": env.observation_space,
                "action_space": env.action_space,
                "metadata": dict(getattr(env, "metadata", {}) or {}),
                "render_mode": env.render_mode,
                "client_id": client_id,
            })
        return out

    def run(self, calls: list[tuple[int, str, tuple, dict[str, Any]]]) -> list[tuple[bool, Any]]:
        """``(sub-env, "reset" | "step", args, kwargs)`` each; ``(True, result)`` or ``(False, reason)``."""
        def one(call: tuple[int, str, tuple, dict[str, Any]]) -> tuple[bool, Any]:
            j, method, args, kwargs = call
            if method not in ("reset", "step"):
                return False, f"ValueError: {method!r} is not a sub-env call"
            try:
                return True, getattr(self.envs[j], method)(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - reported as this sub-env's failure
                return False, _reason(exc)

        if self._threads is None or len(calls) < 2:
            return [one(c) for c in calls]
        return list(self._threads.map(one, calls))

    def rebuild(self, j: int) -> None:
        """Replace sub-env ``j`` after its env raised: the old one is closed as far as it can be."""
        try:
            self.envs[j].close()
        except Exception:  # noqa: BLE001 - it is being thrown away
            pass
        self.envs[j] = _build_env(self._env_kwargs, self._wrappers)

    def render(self) -> list[Any]:
        return [env.render() for env in self.envs]

    def call(self, name: str, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        out = []
        for env in self.envs:
            attr = env.get_wrapper_attr(name)
            out.append(attr(*args, **kwargs) if callable(attr) else attr)
        return out

    def set_attr(self, name: str, values: list[Any]) -> None:
        for env, value in zip(self.envs, values):
            env.set_wrapper_attr(name, value)

    def sleep(self, seconds: float) -> float:  # for tests: proves that calls overlap
        time.sleep(seconds)
        return seconds

    def close(self) -> None:
        errors = []
        for env in self.envs:
            try:
                env.close()
            except Exception as exc:  # noqa: BLE001 - close the others first
                errors.append(exc)
        if errors:
            raise errors[0]


_RemoteSubEnvGroup = ray.remote(SubEnvGroup)


# -- Ray started on demand ------------------------------------------------------------------------

_ray_lock = threading.Lock()
_ray_users = 0  # RayVectorEnvs using a Ray that one of them started


def _acquire_ray(init_kwargs: dict[str, Any] | None) -> bool:
    """Make sure Ray is up; True when this env relies on a Ray started here (and must release it)."""
    global _ray_users
    with _ray_lock:
        if ray.is_initialized():
            if _ray_users == 0:
                return False  # somebody else's Ray (a cluster, RLlib, a test fixture)
        else:
            kwargs = {"include_dashboard": False, "ignore_reinit_error": True, **(init_kwargs or {})}
            ray.init(**kwargs)
            _ray_users = 0
        _ray_users += 1
        return True


def _release_ray() -> None:
    global _ray_users
    with _ray_lock:
        _ray_users = max(_ray_users - 1, 0)
        if _ray_users == 0 and ray.is_initialized():
            ray.shutdown()


# -- the vector env ----------------------------------------------------------------------------------


class SlotFailure(Exception):
    """What went wrong in one slot: ``kind`` is ``actor_died``, ``env_error`` or ``timeout``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class RayVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` IdeGym sub-envs in Ray actors, stepped concurrently (see the module doc).

    ``task`` and ``**env_kwargs`` go to every :class:`~idegym_env.env.IdeGymEnv` (``reward_fn``,
    ``reuse``, ``max_steps``, ``max_observation_chars``, ``render_mode``, …; they must be
    picklable). ``max_episode_steps`` (what ``make_vec`` passes for a spec with a limit) sets
    ``max_steps`` unless that is given. ``actor_options`` go to ``.options()`` of each actor
    (default ``{"num_cpus": 0}``). ``step_timeout`` (seconds, ``None`` = no limit) bounds one
    ``step``/``reset`` of a sub-env. ``envs_per_actor`` sub-envs share one actor (default 1): a
    step then costs one Ray call per actor, which on a small machine is most of Ray's cost (about
    1 ms per call on two cores), but a failing actor or a timeout ends the episodes of all its
    sub-envs.
    """

    metadata: dict[str, Any] = {"autoreset_mode": NEXT_STEP, "render_modes": ["ansi"]}

    def __init__(
        self,
        num_envs: int = 1,
        task: Any = None,
        *,
        control_plane_url: str | None = None,
        env_wrappers: Sequence[Callable[[gym.Env], gym.Env]] = (),
        actor_options: dict[str, Any] | None = None,
        step_timeout: float | None = None,
        max_slot_restarts: int = 3,
        ray_init_kwargs: dict[str, Any] | None = None,
        max_episode_steps: int | None = None,
        envs_per_actor: int = 1,
        **env_kwargs: Any,
    ) -> None:
        self.closed = True  # until the actors exist; makes __del__ and close() safe on a failed __init__
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
        if "client" in env_kwargs:
            raise ValueError("RayVectorEnv cannot share a client with its actors; pass control_plane_url")
        if step_timeout is not None and step_timeout <= 0:
            raise ValueError(f"step_timeout must be > 0 or None, got {step_timeout!r}")
        if isinstance(envs_per_actor, bool) or not isinstance(envs_per_actor, (int, np.integer)) or envs_per_actor < 1:
            raise ValueError(f"envs_per_actor must be an int >= 1, got {envs_per_actor!r}")
        self.num_envs = int(num_envs)
        self.envs_per_actor = min(int(envs_per_actor), self.num_envs)
        # Slot i lives in actor i // envs_per_actor, as its sub-env i % envs_per_actor.
        self._members = [list(range(g, min(g + self.envs_per_actor, self.num_envs)))
                         for g in range(0, self.num_envs, self.envs_per_actor)]
        self.step_timeout = step_timeout
        self.max_slot_restarts = max_slot_restarts
        self.env_wrappers = tuple(env_wrappers)
        if max_episode_steps is not None and env_kwargs.get("max_steps") is None:
            env_kwargs["max_steps"] = max_episode_steps
        self.render_mode = env_kwargs.get("render_mode")

        self._owns_ray = False
        self._embedded = False
        self._actors: list[Any] = []
        self._describe_refs: list[Any] = []

        self._owns_ray = _acquire_ray(ray_init_kwargs)
        try:
            if control_plane_url is None:
                control_plane_url = embedded.acquire().url
                self._embedded = True
            self.control_plane_url = control_plane_url
            self._env_kwargs = {"task": task, "control_plane_url": control_plane_url, **env_kwargs}
            self._actor_options = {**DEFAULT_ACTOR_OPTIONS, **(actor_options or {})}
            if _is_loopback(control_plane_url) and "scheduling_strategy" not in self._actor_options:
                # A loopback control plane is reachable from this node only.
                self._actor_options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                    node_id=ray.get_runtime_context().get_node_id(), soft=False)
            self._actors = [self._new_actor(len(m)) for m in self._members]
            self._describe_refs = [a.describe.remote() for a in self._actors]
            self.closed = False
            descriptions = self._describe_all()
        except BaseException:
            self.closed = False
            self.close()
            raise

        first = descriptions[0]
        self.single_observation_space = first["observation_space"]
        self.single_action_space = first["action_space"]
        self.observation_space = _batched(self.single_observation_space, self.num_envs)
        self.action_space = _batched(self.single_action_space, self.num_envs)
        self._numeric_obs = is_numeric_space(self.single_observation_space)
        self._numeric_act = is_numeric_space(self.single_action_space)
        self.metadata = {**type(self).metadata, "sub_env_metadata": first["metadata"]}
        self.render_mode = first["render_mode"]

        self._last_obs: list[Any] = [None] * self.num_envs
        self._autoreset = np.zeros(self.num_envs, dtype=np.bool_)
        self._needs_reset = np.ones(self.num_envs, dtype=np.bool_)
        self.restarts = np.zeros(self.num_envs, dtype=np.int64)  # actors replaced, by slot

    # -- actors ---------------------------------------------------------------------------------

    def _new_actor(self, count: int) -> Any:
        return _RemoteSubEnvGroup.options(**self._actor_options).remote(self._env_kwargs, self.env_wrappers, count)

    def _describe_all(self) -> list[dict[str, Any]]:
        out = []
        for g, ref in enumerate(self._describe_refs):
            try:
                out.extend(ray.get(ref))
            except RayError as exc:
                raise RuntimeError(f"sub-env {self._members[g][0]} could not be created: {_reason(exc)}") from exc
        return out

    def _replace(self, g: int) -> None:
        """Kill actor ``g`` (stopping its sandboxes) and start a new one; its slots need a reset."""
        old, ref = self._actors[g], self._describe_refs[g]
        client_ids = []
        try:
            client_ids = [d["client_id"] for d in ray.get(ref, timeout=0)]
        except (RayError, GetTimeoutError, KeyError, TypeError):
            pass
        try:
            ray.kill(old, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        for client_id in client_ids:
            if client_id:
                _stop_client(self.control_plane_url, client_id)
        self._actors[g] = self._new_actor(len(self._members[g]))
        self._describe_refs[g] = self._actors[g].describe.remote()
        for i in self._members[g]:
            self.restarts[i] += 1
            self._needs_reset[i] = True

    def _recover(self, failures: dict[int, SlotFailure]) -> set[int]:
        """New actors for dead or stuck ones, new sub-envs for ones that raised; the slots affected."""
        affected: set[int] = set()
        for g in sorted({i // self.envs_per_actor for i, f in failures.items() if f.kind != "env_error"}):
            self._replace(g)
            affected.update(self._members[g])
        for i in failures:
            if i not in affected:  # env_error: only this sub-env is rebuilt (in order, before its next call)
                self._actors[i // self.envs_per_actor].rebuild.remote(i % self.envs_per_actor)
                self.restarts[i] += 1
                self._needs_reset[i] = True
                affected.add(i)
        return affected

    def actor(self, i: int) -> Any:
        """The Ray actor handle holding sub-env ``i`` (for inspection and fault-injection tests)."""
        return self._actors[i // self.envs_per_actor]

    # -- calling many actors at once -----------------------------------------------------------------

    def _gather(self, refs: list[Any], timeout: float | None) -> list[Any]:
        """Results in order; a failed call's entry is a :class:`SlotFailure`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            return ray.get(refs, timeout=timeout)  # the common case: one round of waiting
        except (RayError, GetTimeoutError):
            pass
        remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=remaining)
        done = set(ready)
        out: list[Any] = []
        for ref in refs:
            if ref not in done:
                out.append(SlotFailure("timeout", f"no answer within step_timeout={timeout:g} s"))
                continue
            try:
                out.append(ray.get(ref))
            except RayActorError as exc:
                out.append(SlotFailure("actor_died", _reason(exc)))
            except RayTaskError as exc:
                out.append(SlotFailure("env_error", _reason(exc)))
            except RayError as exc:
                out.append(SlotFailure("actor_died", _reason(exc)))
        return out

    def _run(self, calls: dict[int, tuple[str, tuple, dict[str, Any]]]) -> dict[int, Any]:
        """One Ray call per actor for ``{slot: (method, args, kwargs)}``; a failed slot's entry is a
        :class:`SlotFailure` (an actor's death or timeout fails every slot it was asked for)."""
        batches: dict[int, list[int]] = {}
        for i in sorted(calls):
            batches.setdefault(i // self.envs_per_actor, []).append(i)
        groups = list(batches)
        refs = [self._actors[g].run.remote([(i % self.envs_per_actor, *calls[i]) for i in batches[g]])
                for g in groups]
        out: dict[int, Any] = {}
        for g, answer in zip(groups, self._gather(refs, self.step_timeout)):
            for n, i in enumerate(batches[g]):
                if isinstance(answer, SlotFailure):
                    out[i] = answer
                else:
                    ok, value = answer[n]
                    out[i] = value if ok else SlotFailure("env_error", value)
        return out

    def _reset_slots(self, slots: list[int], seeds: list[Any], options: dict[str, Any] | None) -> dict[int, tuple]:
        """Reset the given slots concurrently, replacing what fails; returns (obs, info) by slot."""
        results: dict[int, tuple] = {}
        pending, wanted = list(slots), set(slots)
        attempts = 0
        while pending:
            values = self._run({i: ("reset", (), {"seed": seeds[i], "options": options}) for i in pending})
            failed = {i: v for i, v in values.items() if isinstance(v, SlotFailure)}
            for i, value in values.items():
                if i not in failed:
                    results[i] = value
                    self._needs_reset[i] = False
            if not failed:
                break
            attempts += 1
            if attempts > self.max_slot_restarts:
                i, failure = min(failed.items())
                raise RuntimeError(f"sub-env {i} could not be reset after {self.max_slot_restarts} new actors: "
                                   f"{failure}")
            # A replaced actor takes its other sub-envs' resets with it: those are done again too.
            affected = self._recover(failed)
            for i in affected:
                results.pop(i, None)
            pending = sorted(affected & wanted)
        return results

    # -- the VectorEnv API -------------------------------------------------------------------------------

    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self._check_open()
        if seed is None:
            seeds: list[Any] = [None] * self.num_envs
        elif isinstance(seed, (int, np.integer)):
            seeds = [int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"{len(seeds)} seeds for {self.num_envs} sub-envs")
        options = dict(options) if options else None
        mask = options.pop("reset_mask", None) if options else None
        if mask is not None:
            mask = np.asarray(mask, dtype=np.bool_)
            if mask.shape != (self.num_envs,):
                raise ValueError(f"options['reset_mask'] must have shape ({self.num_envs},), got {mask.shape}")
            slots = [i for i in range(self.num_envs) if mask[i]]
        else:
            slots = list(range(self.num_envs))
        if seeds[0] is not None:
            self.action_space.seed(int(seeds[0]))
            self.observation_space.seed(int(seeds[0]))
        results = self._reset_slots(slots, seeds, options or None)
        infos: dict[str, Any] = {}
        for i in slots:
            obs, info = results[i]
            self._last_obs[i] = obs
            self._autoreset[i] = False
            infos = self._add_info(infos, info, i)
        return self._batch_obs(), infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        self._check_open()
        items = self._split_actions(actions)
        # NEXT_STEP autoreset: a slot whose episode ended last step is reset now, its action ignored.
        resetting = [bool(self._autoreset[i] or self._needs_reset[i]) for i in range(self.num_envs)]
        values = self._run({i: ("reset", (), {"seed": None, "options": None}) if resetting[i]
                             else ("step", (items[i],), {}) for i in range(self.num_envs)})

        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=np.bool_)
        truncated = np.zeros(self.num_envs, dtype=np.bool_)
        infos: dict[str, Any] = {}
        failures = {i: v for i, v in values.items() if isinstance(v, SlotFailure)}
        if failures:
            self._recover(failures)
            failed_resets = [i for i in sorted(failures) if resetting[i]]
            if failed_resets:
                retried = self._reset_slots(failed_resets, [None] * self.num_envs, None)
                for i in failed_resets:
                    values[i] = retried[i]
        for i in range(self.num_envs):
            value = values[i]
            if resetting[i]:
                obs, info = value
                self._needs_reset[i] = False
            elif isinstance(value, SlotFailure):
                obs = self._last_obs[i]
                info = {"error": value.message, "slot_failure": value.kind, "slot_restarts": int(self.restarts[i])}
                truncated[i] = True
            else:
                obs, reward, term, trunc, info = value
                rewards[i] = float(reward)
                terminated[i] = bool(term)
                truncated[i] = bool(trunc)
            self._last_obs[i] = obs
            infos = self._add_info(infos, info, i)
        self._autoreset = terminated | truncated
        return self._batch_obs(), rewards, terminated, truncated, infos

    def render(self) -> tuple[Any, ...] | None:
        self._check_open()
        if self.render_mode is None:
            return None
        return tuple(r for rs in ray.get([a.render.remote() for a in self._actors]) for r in rs)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` of every sub-env (or get the attribute when it is not callable)."""
        self._check_open()
        return tuple(r for rs in ray.get([a.call.remote(name, args, kwargs) for a in self._actors]) for r in rs)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        self._check_open()
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"{len(values)} values for {self.num_envs} sub-envs")
        ray.get([a.set_attr.remote(name, [values[i] for i in m]) for a, m in zip(self._actors, self._members)])

    def close_extras(self, **kwargs: Any) -> None:
        actors, self._actors = self._actors, []
        try:
            if actors and _ray_usable():
                refs = []
                for a in actors:
                    try:
                        refs.append(a.close.remote())  # hands the sandboxes back
                    except Exception:  # noqa: BLE001 - dead, or from a Ray session that has ended
                        pass
                try:
                    if refs:
                        ray.wait(refs, num_returns=len(refs), timeout=CLOSE_TIMEOUT)
                except Exception:  # noqa: BLE001 - the actors are killed below anyway
                    pass
                for a in actors:
                    try:
                        ray.kill(a, no_restart=True)
                    except Exception:  # noqa: BLE001
                        pass
        finally:
            if self._embedded:
                self._embedded = False
                embedded.release()
            if self._owns_ray:
                self._owns_ray = False
                if _ray_usable():
                    _release_ray()

    def __del__(self) -> None:
        if sys.meta_path is None:  # interpreter shutdown: nothing can be imported or called any more
            return
        try:
            if not getattr(self, "closed", True):
                self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def __repr__(self) -> str:
        return f"RayVectorEnv(num_envs={self.num_envs}, control_plane_url={getattr(self, 'control_plane_url', None)!r})"

    # -- helpers ----------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("the vector environment is closed")

    def _split_actions(self, actions: Any) -> list[Any]:
        if self._numeric_act:
            return list(iterate(self.action_space, actions))
        if isinstance(actions, (str, bytes, dict)) or not hasattr(actions, "__len__"):
            raise ValueError(f"expected {self.num_envs} actions (an object array, list or tuple), got "
                             f"{type(actions).__name__}")
        items = list(actions)
        if len(items) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(items)}")
        return items

    def _batch_obs(self) -> Any:
        if self._numeric_obs:
            filled = [o if o is not None else self.single_observation_space.sample() for o in self._last_obs]
            return concatenate(self.single_observation_space, filled,
                               create_empty_array(self.single_observation_space, self.num_envs))
        return object_array(self._last_obs)


# Arguments that only the vector env takes; a single env built by ``rllib_env_creator`` drops them.
_VECTOR_ONLY = ("actor_options", "step_timeout", "max_slot_restarts", "ray_init_kwargs", "envs_per_actor")


def rllib_env_creator(config: Any) -> gym.Env:
    """An env creator for ``ray.tune.registry.register_env``.

    RLlib's ``SingleAgentEnvRunner`` calls the creator with ``num_envs`` added to ``env_config``
    when ``gym_env_vectorize_mode`` is ``VECTOR_ENTRY_POINT``: that gives a :class:`RayVectorEnv`.
    Without ``num_envs`` (other modes) it gives one ``IdeGymEnv`` with ``env_wrappers`` applied.
    Every other key of ``env_config`` goes to the env (``task``, ``control_plane_url``, …).
    """
    kwargs = dict(config)
    num_envs = kwargs.pop("num_envs", None)
    if num_envs is not None:
        return RayVectorEnv(num_envs=num_envs, **kwargs)
    wrappers = kwargs.pop("env_wrappers", ())
    for key in _VECTOR_ONLY:
        kwargs.pop(key, None)
    if kwargs.get("max_steps") is None and "max_episode_steps" in kwargs:
        kwargs["max_steps"] = kwargs.pop("max_episode_steps")
    kwargs.pop("max_episode_steps", None)
    return _build_env(kwargs, wrappers)


def _batched(space: gym.Space, n: int) -> gym.Space:
    return batch_space(space, n) if is_numeric_space(space) else ObjectBatch(space, n)


def _reason(exc: BaseException, limit: int = 2000) -> str:
    """A readable one-paragraph reason: the env's own exception for task errors, else Ray's."""
    cause = getattr(exc, "cause", None)
    if isinstance(exc, RayTaskError) and isinstance(cause, BaseException):
        text = f"{type(cause).__name__}: {cause}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _is_loopback(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return host in _LOOPBACK or host.startswith("127.")


def _ray_usable() -> bool:
    try:
        return ray.is_initialized()
    except Exception:  # noqa: BLE001 - interpreter shutdown
        return False


def _stop_client(url: str, client_id: str) -> None:
    """Best effort: stop a dead actor's client so that its sandboxes go now, not when its heartbeat times out."""
    import httpx

    from .client import Settings, _plans
    from .client._sync import drive

    try:
        settings = Settings.resolve(url)
        with httpx.Client(base_url=settings.url, auth=settings.auth, timeout=10.0) as http:
            drive(http, _plans.stop_client(client_id, "idegym"))
    except Exception:  # noqa: BLE001 - the control plane's reaper gets it eventually
        pass


__all__ = ["RayVectorEnv", "rllib_env_creator", "ObjectBatch", "SubEnvGroup", "SlotFailure", "object_array", "is_numeric_space", "NEXT_STEP"]
