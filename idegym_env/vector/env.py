"""``RayVectorEnv``: the vector env itself (see the package doc for what it does and why)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import ray
from gymnasium.vector.utils import concatenate, create_empty_array, iterate
from ray.exceptions import GetTimeoutError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .. import embedded
from ..spaces.object_batch import batched_space, is_numeric_space, object_array
from ..urls import is_loopback_url
from .failures import SlotFailure, gather, reason
from .ray_session import acquire_ray, ray_usable, release_ray
from .sub_envs import RemoteSubEnvGroup

# gymnasium 1.0 has no AutoresetMode (added in 1.1); its vector envs all behave as NEXT_STEP.
AutoresetMode = getattr(gym.vector, "AutoresetMode", None)
NEXT_STEP: Any = AutoresetMode.NEXT_STEP if AutoresetMode is not None else "NextStep"

DEFAULT_ACTOR_OPTIONS: dict[str, Any] = {"num_cpus": 0}
# How long close() waits for the sub-envs to hand their sandboxes back before killing the actors.
CLOSE_TIMEOUT = 30.0


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
        if (isinstance(envs_per_actor, bool) or not isinstance(envs_per_actor, (int, np.integer))
                or envs_per_actor < 1):
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

        self._owns_ray = acquire_ray(ray_init_kwargs)
        try:
            if control_plane_url is None:
                control_plane_url = embedded.acquire().url
                self._embedded = True
            self.control_plane_url = control_plane_url
            self._env_kwargs = {"task": task, "control_plane_url": control_plane_url, **env_kwargs}
            self._actor_options = {**DEFAULT_ACTOR_OPTIONS, **(actor_options or {})}
            if is_loopback_url(control_plane_url) and "scheduling_strategy" not in self._actor_options:
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
        self.observation_space = batched_space(self.single_observation_space, self.num_envs)
        self.action_space = batched_space(self.single_action_space, self.num_envs)
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
        return RemoteSubEnvGroup.options(**self._actor_options).remote(self._env_kwargs, self.env_wrappers,
                                                                       count)

    def _describe_all(self) -> list[dict[str, Any]]:
        out = []
        for g, ref in enumerate(self._describe_refs):
            try:
                out.extend(ray.get(ref))
            except RayError as exc:
                raise RuntimeError(f"sub-env {self._members[g][0]} could not be created: "
                                   f"{reason(exc)}") from exc
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
        for g, answer in zip(groups, gather(refs, self.step_timeout), strict=True):
            for n, i in enumerate(batches[g]):
                if isinstance(answer, SlotFailure):
                    out[i] = answer
                else:
                    ok, value = answer[n]
                    out[i] = value if ok else SlotFailure("env_error", value)
        return out

    def _reset_slots(self, slots: list[int], seeds: list[Any],
                     options: dict[str, Any] | None) -> dict[int, tuple]:
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
                raise RuntimeError(f"sub-env {i} could not be reset after {self.max_slot_restarts} new "
                                   f"actors: {failure}")
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
                raise ValueError(f"options['reset_mask'] must have shape ({self.num_envs},), "
                                 f"got {mask.shape}")
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
                info = {"error": value.message, "slot_failure": value.kind,
                        "slot_restarts": int(self.restarts[i])}
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
        answers = ray.get([a.call.remote(name, args, kwargs) for a in self._actors])
        return tuple(r for rs in answers for r in rs)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        self._check_open()
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"{len(values)} values for {self.num_envs} sub-envs")
        ray.get([a.set_attr.remote(name, [values[i] for i in m])
                 for a, m in zip(self._actors, self._members, strict=True)])

    def close_extras(self, **kwargs: Any) -> None:
        actors, self._actors = self._actors, []
        try:
            if actors and ray_usable():
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
                if ray_usable():
                    release_ray()

    def __del__(self) -> None:
        if sys.meta_path is None:  # interpreter shutdown: nothing can be imported or called any more
            return
        try:
            if not getattr(self, "closed", True):
                self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def __repr__(self) -> str:
        url = getattr(self, "control_plane_url", None)
        return f"RayVectorEnv(num_envs={self.num_envs}, control_plane_url={url!r})"

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


def _stop_client(url: str, client_id: str) -> None:
    """Best effort: stop a dead actor's client so that its sandboxes go now, not when its heartbeat
    times out."""
    import httpx

    from ..client import Settings, _plans
    from ..client._sync import drive

    try:
        settings = Settings.resolve(url)
        with httpx.Client(base_url=settings.url, auth=settings.auth, timeout=10.0) as http:
            drive(http, _plans.stop_client(client_id, "idegym"))
    except Exception:  # noqa: BLE001 - the control plane's reaper gets it eventually
        pass


__all__ = ["RayVectorEnv", "NEXT_STEP", "DEFAULT_ACTOR_OPTIONS"]
