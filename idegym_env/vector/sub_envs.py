"""The Ray actor that holds sub-envs: ``SubEnvGroup``, one or more ``IdeGymEnv`` in one actor."""

from __future__ import annotations

import concurrent.futures
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import ray

from .channel import ChannelServer
from .failures import reason
from .placement import Placement

ENV_CLASS = "env_class"  # an env_kwargs key: another class than IdeGymEnv ("module:Name", e.g. the agent env)


def build_env(env_kwargs: dict[str, Any], wrappers: Sequence[Callable[[gym.Env], gym.Env]]) -> gym.Env:
    """One ``IdeGymEnv`` (or the ``env_class`` named in ``env_kwargs``) with ``wrappers`` applied, in order."""
    import importlib

    from ..env import IdeGymEnv

    kwargs = dict(env_kwargs)
    cls: Any = IdeGymEnv
    if kwargs.get(ENV_CLASS):
        module, _, name = kwargs.pop(ENV_CLASS).partition(":")
        cls = getattr(importlib.import_module(module), name)
    kwargs.pop(ENV_CLASS, None)
    env: gym.Env = cls(**kwargs)
    for wrapper in wrappers:
        env = wrapper(env)
    return env


class SubEnvGroup:
    """Holds ``count`` sub-envs inside one Ray actor (``ray.remote(SubEnvGroup)``).

    ``run`` takes one batch of calls, at most one per sub-env, and runs them side by side on
    threads (a sub-env mostly waits for its sandbox): a vector step costs one call per actor,
    not one per sub-env. A sub-env's exception is returned as its result, not raised, so that it
    ends only that sub-env's episode.
    """

    def __init__(self, env_kwargs: dict[str, Any], wrappers: Sequence[Callable[[gym.Env], gym.Env]],
                 count: int = 1, placement: Placement | None = None) -> None:
        self._env_kwargs, self._wrappers, self._placement = env_kwargs, tuple(wrappers), placement
        self.node_id = ray.get_runtime_context().get_node_id()
        self.control_plane_url = env_kwargs.get("control_plane_url")
        self.envs = [self._build() for _ in range(count)]
        self._threads = concurrent.futures.ThreadPoolExecutor(count) if count > 1 else None
        self._channel: ChannelServer | None = None

    def open_channel(self, authkey: bytes, caller_node: str) -> str | None:
        """Serve ``run`` on a direct channel to a caller on this node (``channel.py``); its address,
        or None when the caller is elsewhere (its calls keep going through Ray)."""
        if caller_node != self.node_id:
            return None
        if self._channel is not None:
            raise RuntimeError("this actor's channel is already open")
        self._channel = ChannelServer(self.run, authkey)
        return self._channel.address

    def _build(self) -> gym.Env:
        if self._placement is not None:
            # Found again for every new sub-env: a node's control plane that died is started again.
            self.control_plane_url = self._placement.control_plane_url()
        return build_env({**self._env_kwargs, "control_plane_url": self.control_plane_url}, self._wrappers)

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
                "node_id": self.node_id,
                "actor_pid": os.getpid(),
                "control_plane_url": self.control_plane_url,
            })
        return out

    def run(self, calls: list[tuple[int, str, tuple, dict[str, Any]]]) -> list[tuple[bool, Any]]:
        """``(sub-env, "reset" | "step", args, kwargs)`` each; ``(True, result)`` or ``(False, reason)``."""
        def one(call: tuple[int, str, tuple, dict[str, Any]]) -> tuple[bool, Any]:
            j, method, args, kwargs = call
            if method not in ("reset", "step", "reset_group"):
                return False, f"ValueError: {method!r} is not a sub-env call"
            try:
                if method == "reset_group":
                    return True, self.reset_group(j, *args, **kwargs)
                return True, getattr(self.envs[j], method)(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - reported as this sub-env's failure
                return False, reason(exc)

        if self._threads is None or len(calls) < 2:
            return [one(c) for c in calls]
        others = [self._threads.submit(one, c) for c in calls[1:]]
        first = one(calls[0])  # on this thread: one hand-off fewer
        return [first, *(f.result() for f in others)]

    def reset_group(self, j: int, size: int, seed: int | None = None, options: dict[str, Any] | None = None
                    ) -> list[tuple[Any, dict[str, Any]]]:
        """Sub-envs ``j .. j+size-1`` start one episode from one reset state (``vector/groups.py``):
        sub-env ``j`` resets, its episode is forked into the others, which replace theirs (their
        old sandboxes are stopped, not kept for reuse)."""
        obs, info = self.envs[j].reset(seed=seed, options=options)
        forks = self.envs[j].unwrapped.fork(size - 1)  # type: ignore[attr-defined]
        out = [(obs, {**info, "group": j, "group_leader": True})]
        for m, fork in enumerate(forks, start=1):
            old, self.envs[j + m] = self.envs[j + m], self._wrap(fork)
            _discard(old)
            out.append((obs, {**info, "server_id": fork.sandbox.server_id, "sandbox": "forked", "group": j,
                              "group_leader": False, "forked_from": info.get("server_id")}))
        return out

    def _wrap(self, env: gym.Env) -> gym.Env:
        for wrapper in self._wrappers:
            env = wrapper(env)
        return env

    def rebuild(self, j: int) -> None:
        """Replace sub-env ``j`` after its env raised: the old one is closed as far as it can be."""
        try:
            self.envs[j].close()
        except Exception:  # noqa: BLE001 - it is being thrown away
            pass
        self.envs[j] = self._build()

    def render(self) -> list[Any]:
        return [env.render() for env in self.envs]

    def call(self, name: str, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        out = []
        for env in self.envs:
            attr = env.get_wrapper_attr(name)
            out.append(attr(*args, **kwargs) if callable(attr) else attr)
        return out

    def set_attr(self, name: str, values: list[Any]) -> None:
        for env, value in zip(self.envs, values, strict=True):
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


def _discard(env: gym.Env) -> None:
    """Close a sub-env a group's fork replaces; its sandbox is stopped (a fork of an old episode is
    of no use to anybody)."""
    from ..client import APIError

    inner = env.unwrapped
    sandbox = getattr(inner, "sandbox", None)
    if sandbox is not None and getattr(sandbox, "server_id", None) is not None:
        try:
            sandbox.stop()
        except APIError:
            pass
        inner.sandbox = None  # type: ignore[attr-defined]
    try:
        env.close()
    except Exception:  # noqa: BLE001 - it is being thrown away
        pass


RemoteSubEnvGroup = ray.remote(SubEnvGroup)

__all__ = ["SubEnvGroup", "RemoteSubEnvGroup", "build_env"]
