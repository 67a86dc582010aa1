"""Starting a sandbox's server as a plain child process (isolation ``none``: NOT isolated).

The server runs with the control plane's user and view of the host; only a per-sandbox copy of
the project (``<sandbox dir>/project``) separates sandboxes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

from sandbox_server import procfs

from . import cgroups, priority
from .handle_data import LocalHandleData
from .layout import SOCKET_NAME, Plan
from .server_kinds import ServerKindEntry, sandbox_server_args


def spawn(plan: Plan, data: LocalHandleData, kind: ServerKindEntry, track: Callable[[subprocess.Popen], None],
          nice: int = priority.NORMAL_NICE) -> int:
    """Start the server for ``plan`` at ``nice``; records ``server`` in ``data`` and hands its
    Popen to ``track``. Returns the fd the server reports ready on."""
    ready_r, ready_w = os.pipe()
    tool_env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": os.environ.get("LANG", "C.UTF-8")}
    args = sandbox_server_args(plan, tool_env, str(plan.sb / "project"), ready_w, str(plan.run / SOCKET_NAME))
    args += ["--project-source", plan.project_lower, "--state-dir", str(plan.sb / "server-state")]
    if data.cgroups:  # the tools' groups, in the <dir>/<controller> shape the server expects
        links = plan.sb / "tool-cgroups"
        links.mkdir()
        for ctrl, path in cgroups.sub(data.cgroups, cgroups.DELEGATED).items():
            os.symlink(path, links / ctrl)
        args += ["--tool-cgroups", str(links)]
        if "memory" in data.cgroups:
            args += ["--memory-events", str(links / "memory" / "memory.oom_control")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("IDEGYM_")}
    if kind.image_env:
        env.update(plan.env)
    command = [sys.executable, "-c", f"import sys\nfrom {kind.module} import main\nmain(sys.argv[1:])\n",
               *kind.server_args(args, str(plan.run / "oe"))]
    logf = open(plan.log, "ab")
    try:
        popen = subprocess.Popen(command, pass_fds=(ready_w,), stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                 start_new_session=True, cwd=str(plan.sb), env=env)
    except BaseException:
        os.close(ready_r)
        raise
    finally:
        logf.close()
        os.close(ready_w)
    if nice != priority.NORMAL_NICE:
        priority.set_tasks((popen.pid,), nice)
    track(popen)
    data.server = procfs.record(popen.pid)
    return ready_r
