"""A null OpenEnv server for ``benchmarks/_plugin_steps.py`` (verifiers): openenv-core's own app
(``create_app``, the same WebSocket handler as ``idegym openenv serve``) around a bare
environment whose ``step_async`` makes ``AsyncSandbox.bash`` on the server's loop, with our async
client, and answers an ``IdeObservation`` of the same fields: no ``IdeGymEnv``, no episode.

A step through it is what any OpenEnv server making the direct call costs (openenv-core's step
message, the call from a second process on an event loop); ours over it is our server's own work.

``python _openenv_null_server.py URL IMAGE FD`` starts a sandbox of IMAGE, serves on a free port
(uvloop, uvicorn configured as ``idegym openenv serve`` configures it) and writes ``ready PORT``
and a newline to file descriptor FD."""

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from idegym_env.openenv._compat import import_openenv  # noqa: E402

import_openenv()

from openenv.core.env_server.http_server import create_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402

from idegym_env.client import AsyncIdeGymClient, AsyncSandbox  # noqa: E402
from idegym_env.openenv.models import IdeAction, IdeObservation, IdeState  # noqa: E402

TASK = "python-roman-numerals"


class NullEnv(Environment[IdeAction, IdeObservation, IdeState]):
    SUPPORTS_CONCURRENT_SESSIONS = True
    sandbox: AsyncSandbox | None = None  # set once serving

    def __init__(self) -> None:
        super().__init__()
        self._state = IdeState(task_id=TASK)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> IdeObservation:
        return IdeObservation(text="", task_id=TASK, episode_id=episode_id, done=False, reward=None)

    def step(self, action: IdeAction, timeout_s: float | None = None, **kwargs: Any) -> IdeObservation:
        raise NotImplementedError("step_async only")

    async def step_async(self, action: IdeAction, timeout_s: float | None = None, **kwargs: Any) -> IdeObservation:
        assert self.sandbox is not None and isinstance(action.arguments, dict)
        done = await self.sandbox.bash(action.arguments["command"], timeout=120)
        self._state.step_count += 1
        return IdeObservation(text=f"{done.stdout}{done.stderr}[exit code {done.exit_code}]", task_id=TASK,
                              step=self._state.step_count, tool=action.tool, exit_code=done.exit_code,
                              done=False, reward=0.0)

    @property
    def state(self) -> IdeState:
        return self._state


async def serve(url: str, image: str, ready_fd: int) -> None:
    import uvicorn

    app = create_app(NullEnv, IdeAction, IdeObservation, env_name="null", max_concurrent_envs=4)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False,
                                           ws_max_size=100 << 20, ws_per_message_deflate=False))
    async with AsyncIdeGymClient(url, name="bench-openenv-null") as client:
        NullEnv.sandbox = await client.start(image, server_name="bench-openenv-null", reuse="NONE")
        try:
            serving = asyncio.ensure_future(server.serve())
            while not server.started and not serving.done():
                await asyncio.sleep(0.005)
            if server.started:
                os.write(ready_fd, f"ready {server.servers[0].sockets[0].getsockname()[1]}\n".encode())
            os.close(ready_fd)
            await serving
        finally:
            await NullEnv.sandbox.stop()


if __name__ == "__main__":
    import uvloop

    uvloop.run(serve(sys.argv[1], sys.argv[2], int(sys.argv[3])))
