"""``IdeGymEnv.fork(n)``: n envs that continue the running episode from where it is.

Each fork has its own sandbox, forked from the env's (``Sandbox.fork``: the whole filesystem as
it is now, fresh processes — nothing that runs in the sandbox is copied), and the env's episode
state: the task, the step count, the transcript, the clock of the episode, the reward function
and limits, the random generator's state. The env and its forks then go separate ways; each
``close()`` hands its own sandbox back. They share the env's control-plane session: the last of
them to close ends it (and stops its servers), not the first.
"""

from __future__ import annotations

import copy
import threading
from typing import TYPE_CHECKING, TypeVar

from . import embedded
from .client import IdeGymClient

if TYPE_CHECKING:
    from .env import IdeGymEnv


class ClientShare:
    """A client session used by an env and its forks: closed by the last one to let go."""

    def __init__(self, client: IdeGymClient) -> None:
        self.client = client
        self.users = 1
        self._lock = threading.Lock()

    def join(self) -> ClientShare:
        with self._lock:
            self.users += 1
        return self

    def release(self) -> None:
        with self._lock:
            self.users -= 1
            last = self.users == 0
        if last:
            self.client.close(stop=True)


E = TypeVar("E", bound="IdeGymEnv")


def fork_env(env: E, n: int) -> list[E]:
    if env._closed:
        raise RuntimeError("the environment is closed")
    if env._direct is not None:
        raise RuntimeError("this env runs on a sandbox connected directly: there is no control plane to fork it")
    if env.sandbox is None:
        raise RuntimeError("no episode is running: call reset() before fork()")
    if getattr(env, "_ended", False):
        raise RuntimeError("the episode has ended: fork while it runs (or reset() first)")
    if getattr(env, "_services", None):
        names = ", ".join(sorted(env._services))
        raise RuntimeError(f"task {env.task.id!r} runs services beside its sandbox ({names}): fork copies one "
                           "sandbox, and its children would share the parent's services; start an env per episode "
                           "for such a task")
    sandboxes = env.sandbox.fork(n)
    share = env._client_share
    if share is None and env._owns_client and env.client is not None:  # the session ends with the last of them
        share = env._client_share = ClientShare(env.client)
        env._owns_client = False
    forks = []
    for sandbox in sandboxes:
        child = copy.copy(env)
        child.sandbox = sandbox
        child._transcript = list(env._transcript)
        child._owns_client = False
        child._client_share = share.join() if share is not None else None
        if env._embedded:
            embedded.acquire()  # one more user of the embedded control plane
        child.action_space = copy.deepcopy(env.action_space)
        child.observation_space = copy.deepcopy(env.observation_space)
        if getattr(env, "_np_random", None) is not None:
            child._np_random = copy.deepcopy(env._np_random)
        forks.append(child)
    return forks
