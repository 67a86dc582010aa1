"""``RayVectorEnv``: the vector env itself (see the package doc for what it does and why)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .. import embedded
from ..spaces.object_batch import batched_space, is_numeric_space
from ..urls import is_loopback_url, without_credentials
from . import channel, groups
from .batching import batch_observations, check_count, failure_info, reset_slots, seeds_for, split_actions
from .failures import SlotFailure, gather, reason
from .node_control_plane import close_registry, start_registry, stop_client
from .placement import NODE, SHARED, NodeSpreader, Placement, driver_node_id, own_node_id, required_resources
from .ray_session import acquire_ray, ray_usable, release_ray
from .sub_envs import RemoteSubEnvGroup

# gymnasium 1.0 has no AutoresetMode (added in 1.1); its vector envs all behave as NEXT_STEP.
AutoresetMode = getattr(gym.vector, "AutoresetMode", None)
NEXT_STEP: Any = AutoresetMode.NEXT_STEP if AutoresetMode is not None else "NextStep"

DEFAULT_ACTOR_OPTIONS: dict[str, Any] = {"num_cpus": 0}
# How long close() waits for the sub-envs to hand their sandboxes back before killing the actors.
CLOSE_TIMEOUT = 30.0
# How long a closed channel's actor has to show Ray why (its death's reason) before it counts as dead anyway.
PROBE_TIMEOUT = 30.0


class RayVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` IdeGym sub-envs in Ray actors, stepped concurrently (see the module doc).

    ``task`` and ``**env_kwargs`` go to every :class:`~idegym_env.env.IdeGymEnv` (``reward_fn``,
    ``reuse``, ``max_steps``, ``max_observation_chars``, ``render_mode``, …; they must be
    picklable). ``max_episode_steps`` (what ``make_vec`` passes for a spec with a limit) sets
    ``max_steps`` unless that is given. ``actor_options`` go to ``.options()`` of each actor
    (default ``{"num_cpus": 0}``). ``step_timeout`` (seconds, ``None`` = no limit) bounds one
    ``step``/``reset`` of a sub-env. ``envs_per_actor`` sub-envs share one actor (default 1): a
    step then costs one call per actor (over ``channel.py`` on this process's node, else a Ray call
    of about 1.5 ms of CPU on two cores), but a failing actor or a timeout ends the episodes of
    all its sub-envs. ``group_size=k`` makes each k consecutive sub-envs a group that starts every episode
    from one reset state, forked rather than reset k times (``groups.py``; GRPO).
    ``direct_channels=False`` sends every call through Ray (what the channel saves is measured
    side by side in ``benchmarks/vector_throughput.py``).
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
        envs_per_actor: int | None = None,
        node_warm_pool: int = 1,
        group_size: int = 1,
        direct_channels: bool = True,
        **env_kwargs: Any,
    ) -> None:
        self.closed = True  # until the actors exist; makes __del__ and close() safe on a failed __init__
        check_count("num_envs", num_envs)
        if "client" in env_kwargs:
            raise ValueError("RayVectorEnv cannot share a client with its actors; pass control_plane_url")
        if step_timeout is not None and step_timeout <= 0:
            raise ValueError(f"step_timeout must be > 0 or None, got {step_timeout!r}")
        given = envs_per_actor is not None
        envs_per_actor = 1 if envs_per_actor is None else envs_per_actor
        check_count("envs_per_actor", envs_per_actor)
        self.num_envs = int(num_envs)
        self.group_size = int(group_size) if isinstance(group_size, np.integer) else group_size
        envs_per_actor = groups.check_group_size(self.group_size, self.num_envs, int(envs_per_actor), given)
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
        self._registry: Any = None
        self._actors: list[Any] = []
        self._describe_refs: list[Any] = []
        # Each actor's direct channel (channel.py): None until tried, False where calls go through Ray.
        self._channels: list[Any] = [None] * len(self._members)
        self._nodes: list[str | None] = [None] * len(self._members)  # each actor's node, once known
        self._spreader: NodeSpreader | None = None
        self._node_warm_pool = node_warm_pool

        self._owns_ray = acquire_ray(ray_init_kwargs)
        try:
            self._driver_node = driver_node_id()
            # actors there are reached over channels, from a driver or an actor
            self._own_node = own_node_id() if direct_channels else None
            self.control_plane_url = control_plane_url
            if control_plane_url is None:
                # Sandboxes on the node of their actor. The driver's node uses the driver's own
                # embedded control plane; the registry starts one on any other node.
                self.placement = NODE
                local_url = None
                if self._driver_node is not None:
                    local_url = embedded.acquire().url
                    self._embedded = True
                self._placement = Placement(NODE, local_node=self._driver_node, local_url=local_url)
            else:
                self.placement = SHARED
                self._placement = Placement(SHARED, url=control_plane_url)
            self._env_kwargs = {"task": task, "control_plane_url": control_plane_url, **env_kwargs}
            self._actor_options = {**DEFAULT_ACTOR_OPTIONS, **(actor_options or {})}
            if "scheduling_strategy" not in self._actor_options:
                if control_plane_url is not None and is_loopback_url(control_plane_url):
                    # A loopback control plane is reachable from this node only.
                    self._actor_options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                        node_id=ray.get_runtime_context().get_node_id(), soft=False)
                else:
                    self._spreader = NodeSpreader(required_resources(self._actor_options),
                                                  prefer=self._driver_node)
            for g in range(len(self._members)):
                self._actors.append(self._new_actor(g))
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

    def _new_actor(self, g: int) -> Any:
        """Start actor ``g``: on the least used node when spreading, else where its options say."""
        options = dict(self._actor_options)
        self._nodes[g] = None
        if self._spreader is not None:
            node = self._spreader.choose(self._nodes)
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
            self._nodes[g] = node
        placement = self._placement
        if placement.mode == NODE and (self._nodes[g] is None or self._nodes[g] != placement.local_node):
            placement = replace(placement, registry=self._ensure_registry())
        return RemoteSubEnvGroup.options(**options).remote(self._env_kwargs, self.env_wrappers,
                                                           len(self._members[g]), placement)

    def _ensure_registry(self) -> Any:
        """The actor that starts and finds the other nodes' control planes, started on first need."""
        if self._registry is None:
            self._registry = start_registry(self._node_warm_pool)
        return self._registry

    def _describe_all(self) -> list[dict[str, Any]]:
        out = []
        for g, ref in enumerate(self._describe_refs):
            try:
                described = ray.get(ref)
            except RayError as exc:
                raise RuntimeError(f"sub-env {self._members[g][0]} could not be created: "
                                   f"{reason(exc)}") from exc
            self._nodes[g] = described[0]["node_id"]
            out.extend(described)
        return out

    def _node_of_actor(self, g: int) -> str | None:
        if self._nodes[g] is None:
            try:  # asked right after the actor started, answered before its first reset
                self._nodes[g] = ray.get(self._describe_refs[g], timeout=0)[0]["node_id"]
            except (RayError, GetTimeoutError, KeyError, IndexError, TypeError):
                pass
        return self._nodes[g]

    def _replace(self, g: int, failure: SlotFailure | None = None) -> None:
        """Kill actor ``g`` (stopping its sandboxes) and start a new one; its slots need a reset."""
        old, ref = self._actors[g], self._describe_refs[g]
        node = self._node_of_actor(g)
        node_lost = failure is not None and failure.node_lost
        described: list[dict[str, Any]] = []
        try:
            described = ray.get(ref, timeout=0)
        except (RayError, GetTimeoutError):
            pass
        self._close_channel(g)
        try:
            ray.kill(old, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        if node_lost and self._spreader is not None:
            self._spreader.suspect(node)
        self._stop_clients(node, [cid for d in described if (cid := d.get("client_id"))], node_lost)
        self._actors[g] = self._new_actor(g)
        self._describe_refs[g] = self._actors[g].describe.remote()
        for i in self._members[g]:
            self.restarts[i] += 1
            self._needs_reset[i] = True

    def _stop_clients(self, node: str | None, client_ids: list[str], node_lost: bool) -> None:
        """Stop a replaced actor's clients at once, wherever their control plane is."""
        if not client_ids:
            return
        if self.placement == SHARED:
            assert self.control_plane_url is not None
            for client_id in client_ids:
                stop_client(self.control_plane_url, client_id)
        elif node_lost:
            pass  # that node's control plane went with it, and its sandboxes with it
        elif node == self._placement.local_node and self._placement.local_url:
            for client_id in client_ids:
                stop_client(self._placement.local_url, client_id)
        elif self._registry is not None and node is not None:
            self._registry.stop_clients.remote(node, client_ids)  # not waited for

    def _recover(self, failures: dict[int, SlotFailure]) -> set[int]:
        """New actors for dead or stuck ones, new sub-envs for ones that raised; the slots affected."""
        affected: set[int] = set()
        by_actor: dict[int, SlotFailure] = {}
        for i, f in sorted(failures.items()):
            if f.kind != "env_error":
                by_actor.setdefault(i // self.envs_per_actor, f)
        for g, failure in sorted(by_actor.items()):
            self._replace(g, failure)
            affected.update(self._members[g])
        for i in failures:
            if i not in affected:  # env_error: only this sub-env is rebuilt (in order, before its next call)
                g = i // self.envs_per_actor
                rebuilt = self._actors[g].rebuild.remote(i % self.envs_per_actor)
                if self._channels[g]:  # the next call takes the channel, not the actor's queue: wait here
                    done, _ = ray.wait([rebuilt], timeout=self.step_timeout)
                    if not done:  # still rebuilding: this actor's calls queue behind it, through Ray
                        self._close_channel(g)
                        self._channels[g] = False
                self.restarts[i] += 1
                self._needs_reset[i] = True
                affected.add(i)
        return affected

    def actor(self, i: int) -> Any:
        """The Ray actor handle holding sub-env ``i`` (for inspection and fault-injection tests)."""
        return self._actors[i // self.envs_per_actor]

    def node_of(self, i: int) -> str | None:
        """The Ray node id of sub-env ``i``'s actor (where its sandboxes are, with ``placement="node"``)."""
        return self._node_of_actor(i // self.envs_per_actor)

    def control_planes(self) -> dict[str, dict[str, Any]]:
        """With ``placement="node"``: the running control planes by node id (``url``, ``pid``,
        ``state_dir``; ``keeper_pid`` on nodes other than the driver's). The URLs carry no
        credentials: this is for showing and logging."""
        self._check_open()
        out: dict[str, dict[str, Any]] = {}
        if self._registry is not None:
            for node_id, plane in ray.get(self._registry.describe.remote()).items():
                out[node_id] = {**plane, "url": without_credentials(plane["url"])}
        if self._embedded and self._placement.local_node:
            local = embedded.acquire()
            try:
                out[self._placement.local_node] = {"node_id": self._placement.local_node, "url": local.address,
                                                   "pid": local.process.pid,
                                                   "state_dir": str(local.state_dir)}
            finally:
                embedded.release()
        return out

    def _where(self, i: int) -> dict[str, Any]:
        return {"placement": self.placement, "node_id": self.node_of(i)}

    # -- calling many actors at once -----------------------------------------------------------------

    def _run(self, calls: dict[int, tuple[str, tuple, dict[str, Any]]]) -> dict[int, Any]:
        """One call per actor (its channel, else Ray) for ``{slot: (method, args, kwargs)}``; a failed slot's entry is a
        :class:`SlotFailure` (an actor's death or timeout fails every slot it was asked for)."""
        batches: dict[int, list[int]] = {}
        for i in sorted(calls):
            batches.setdefault(i // self.envs_per_actor, []).append(i)
        deadline = None if self.step_timeout is None else time.monotonic() + self.step_timeout
        requests = {g: [(i % self.envs_per_actor, *calls[i]) for i in batch] for g, batch in batches.items()}
        sent = [g for g in requests if self._send(g, requests[g])]
        by_ray = [g for g in requests if g not in sent]
        refs = [self._actors[g].run.remote(requests[g]) for g in by_ray]
        answers = dict(zip(by_ray, gather(refs, self.step_timeout), strict=True))
        answers.update({g: self._receive(g, deadline) for g in sent})
        out: dict[int, Any] = {}
        for g, answer in answers.items():
            for n, i in enumerate(batches[g]):
                if isinstance(answer, SlotFailure):
                    out[i] = answer
                else:
                    ok, value = answer[n]
                    out[i] = value if ok else SlotFailure("env_error", value)
        return out

    def _send(self, g: int, request: list[tuple]) -> bool:
        """Send actor ``g``'s batch over its channel (opened on first use); False: it goes through Ray."""
        conn = self._channels[g]
        if conn is None:
            conn = self._channels[g] = self._open_channel(g)
        if not conn:
            return False
        try:
            channel.send(conn, request)
        except channel.ChannelClosed:
            pass  # the answer's turn reports it, with Ray's reason
        return True

    def _open_channel(self, g: int) -> Any:
        """A channel to actor ``g`` if it is on this node, else False (also when opening fails: a
        dead or stuck actor is then reported by its Ray call)."""
        if self._own_node is None:
            return False
        key = channel.new_key()
        try:
            address = ray.get(self._actors[g].open_channel.remote(key, self._own_node), timeout=self.step_timeout)
            return channel.connect(address, key) if address else False
        except Exception:  # noqa: BLE001 - RayError, GetTimeoutError, OSError, AuthenticationError: use Ray
            return False

    def _receive(self, g: int, deadline: float | None) -> Any:
        """Actor ``g``'s answer from its channel, or a :class:`SlotFailure` for all of its batch."""
        try:
            return channel.receive(self._channels[g], deadline)
        except TimeoutError:
            return SlotFailure("timeout", f"no answer within step_timeout={self.step_timeout:g} s")
        except channel.BatchFailed as exc:
            return SlotFailure("env_error", str(exc))
        except channel.ChannelClosed as exc:
            # The actor's process is gone: Ray says why (and whether its node went with it).
            timeout = PROBE_TIMEOUT if self.step_timeout is None else min(self.step_timeout, PROBE_TIMEOUT)
            [probe] = gather([self._actors[g].__ray_ready__.remote()], timeout)
            if isinstance(probe, SlotFailure):
                return probe if probe.kind == "actor_died" else SlotFailure("actor_died", probe.message)
            return SlotFailure("actor_died", f"its channel closed: {exc}")

    def _close_channel(self, g: int) -> None:
        conn, self._channels[g] = self._channels[g], None
        if conn:
            conn.close()

    def _reset_slots(self, slots: list[int], seeds: list[Any],
                     options: dict[str, Any] | None) -> dict[int, tuple]:
        """Reset the given slots concurrently, replacing what fails; returns (obs, info) by slot."""
        results: dict[int, tuple] = {}
        pending, wanted = list(slots), set(slots)
        attempts = 0
        while pending:
            if self.group_size > 1:
                calls = groups.reset_calls(pending, seeds, options, self.group_size)
                values = groups.spread(self._run(calls), calls, self.group_size)
            else:
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
        seeds = seeds_for(seed, self.num_envs)
        options, slots = reset_slots(options, self.num_envs, self.group_size)
        if seeds[0] is not None:
            self.action_space.seed(int(seeds[0]))
            self.observation_space.seed(int(seeds[0]))
        results = self._reset_slots(slots, seeds, options or None)
        infos: dict[str, Any] = {}
        for i in slots:
            obs, info = results[i]
            self._last_obs[i] = obs
            self._autoreset[i] = False
            infos = self._add_info(infos, {**info, **self._where(i)}, i)
        return self._batch_obs(), infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        self._check_open()
        items = split_actions(actions, self.action_space, self.num_envs, self._numeric_act)
        # NEXT_STEP autoreset: a slot whose episode ended last step is reset now, its action ignored.
        resetting = [bool(self._autoreset[i] or self._needs_reset[i]) for i in range(self.num_envs)]
        calls = {i: ("reset", (), {"seed": None, "options": None}) if resetting[i]
                 else ("step", (items[i],), {}) for i in range(self.num_envs)}
        waiting: set[int] = set()
        if self.group_size > 1:  # a group resets once all its members have ended (groups.py)
            calls, resetting, waiting = groups.step_calls(calls, resetting, self.group_size)
            values = groups.spread(self._run(calls), calls, self.group_size)
            values.update({i: groups.waiting_step(self._last_obs[i]) for i in waiting})
        else:
            values = self._run(calls)

        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=np.bool_)
        truncated = np.zeros(self.num_envs, dtype=np.bool_)
        infos: dict[str, Any] = {}
        failures = {i: v for i, v in values.items() if isinstance(v, SlotFailure)}
        lost_on = {i: self.node_of(i) for i in failures}  # before a new actor moves the slot
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
                info = {**info, **self._where(i)}
                self._needs_reset[i] = False
            elif isinstance(value, SlotFailure):
                obs = self._last_obs[i]
                info = failure_info(value, int(self.restarts[i]), self.placement, lost_on[i])
                truncated[i] = True
            else:
                obs, reward, term, trunc, info = value
                rewards[i] = float(reward)
                terminated[i] = bool(term)
                truncated[i] = bool(trunc)
            self._last_obs[i] = obs
            infos = self._add_info(infos, info, i)
        self._autoreset = terminated | truncated
        self._autoreset[list(waiting)] = True  # still ended: reset with the rest of its group
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
        for g in range(len(self._channels)):
            self._close_channel(g)  # the actors' channel threads end
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
            registry, self._registry = self._registry, None
            if registry is not None and ray_usable():  # after the sub-envs have handed their sandboxes back
                close_registry(registry)
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

    def _batch_obs(self) -> Any:
        return batch_observations(self._last_obs, self.single_observation_space, self._numeric_obs)


__all__ = ["RayVectorEnv", "NEXT_STEP", "DEFAULT_ACTOR_OPTIONS"]
