"""Every error ``idegym_env`` raises derives from :class:`IdeGymError`, most also from the builtin
it stands for (a ``TaskError`` is a ``ValueError``, a ``TimeoutError`` a builtin ``TimeoutError``),
so ``except ValueError`` still catches what it did::

    IdeGymError
    ├── ConfigurationError (ValueError)       a variable or setting that cannot be used   errors
    ├── ServiceError                          a call to the control plane or a sandbox failed  errors
    │   ├── TransportError                    no HTTP answer: refused, reset, DNS…
    │   │   └── TimeoutError (TimeoutError)   no answer in time, an operation past its deadline
    │   ├── APIError                          an HTTP error answer: status, message, origin
    │   │   ├── BadRequest                    400, 413; 422 (ValidationError: the fields)
    │   │   │   └── ValidationError
    │   │   ├── Unauthorized                  401, 403
    │   │   ├── NotFound                      404 (unknown client, server, file…)
    │   │   ├── Conflict                      409 (e.g. a patch whose hunks did not apply)
    │   │   ├── SandboxGone                   410 (the sandbox crashed, was stopped or reaped)
    │   │   ├── Busy                          429, 503 (retry later)
    │   │   ├── Cancelled                     499
    │   │   └── ServerError                   500 and other 5xx
    │   └── InfrastructureError (RuntimeError)  an episode's sandbox or control plane failed: no
    │                                         reward, a trainer masks the sample (integrations)
    ├── ToolCallError (ValueError)            a malformed tool call, or one out of turn   errors
    ├── InvalidAction (ValueError)            an action that is no valid tool call        tools/base.py
    ├── EpisodeEnded (ResetNeeded, RuntimeError)  step() after the episode ended          env.py
    ├── TaskError (ValueError)                a task that cannot be found or loaded       tasks/task.py
    ├── DownloadTooLarge (RuntimeError)       a download over its bound                   integrations/bounded_tar.py
    ├── ComposeError (ValueError)             a Harbor compose file that cannot be run    tasks/services.py
    ├── SlotFailure                           one sub-env of a vector env failed          vector/failures.py
    ├── ChannelClosed                         a vector actor's channel went away          vector/channel.py
    ├── BatchFailed                           an actor could not send a batch's answer    vector/channel.py
    ├── LayerError (RuntimeError)             a harness layer could not be built          agents/layers.py
    ├── ReplyError (ValueError)               a policy's reply is no assistant message    agents/apis.py
    ├── UpstreamError (RuntimeError)          the model server did not answer             agents/upstream.py
    ├── AgentSpecError (ValueError)           an eval agent spec that names no agent      eval/agents.py
    ├── ChatCompletionError (RuntimeError)    the model endpoint answered an error        eval/openai_agent.py
    │   └── ModelUnreachable                  …or could not be reached                    eval/openai_agent.py
    ├── ControlPlaneUnavailable (RuntimeError)  the run's control plane cannot be used    eval/runner.py
    └── ManifestMismatch (RuntimeError)       the output directory holds another run      eval/manifest.py

The right-hand column is the module of ``idegym_env`` a class is defined in (``errors``: here;
``idegym_env`` and ``idegym_env.client`` export these); a private class derives from the root
too, and ``tests/test_error_tree.py`` checks that this drawing is the tree. ``APIError.origin``
says who answered: ``"sandbox"`` (the sandbox server rejected the call, e.g. a missing file),
``"control-plane"`` (e.g. an unknown server) or ``"client"`` (a request that failed its wire
model before it was sent: the same 422 items the server would have answered);
``client/_exceptions.py`` maps answers to these classes.
"""

from __future__ import annotations

import builtins
from typing import Any


class IdeGymError(Exception):
    """Base of every error ``idegym_env`` raises."""


class ConfigurationError(IdeGymError, ValueError):
    """An environment variable or a setting that cannot be used; the message names it."""


class ServiceError(IdeGymError):
    """A call to the control plane or a sandbox failed: it got no answer, or an error answer."""


class TransportError(ServiceError):
    """The request got no HTTP answer."""


class TimeoutError(TransportError, builtins.TimeoutError):  # noqa: A001 - mirrors the builtin on purpose
    """No answer within the timeout (or an operation did not end within its deadline)."""


class APIError(ServiceError):
    """``kind`` is the server's error kind (``NotFound``, ``Gone``…; the ``error`` field of its
    body) and ``details`` its structured details, when it sent them."""

    def __init__(self, status: int, message: str, body: str = "", origin: str = "control-plane",
                 detail: Any = None, kind: str | None = None, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} from the {origin}: {message}")
        self.status = status
        self.message = message
        self.body = body
        self.origin = origin
        self.detail = detail
        self.kind = kind
        self.details = details


class BadRequest(APIError):
    pass


class ValidationError(BadRequest):
    pass


class Unauthorized(APIError):
    pass


class NotFound(APIError):
    pass


class Conflict(APIError):
    pass


class SandboxGone(APIError):
    pass


class Busy(APIError):
    pass


class Cancelled(APIError):
    pass


class ServerError(APIError):
    pass


class InfrastructureError(ServiceError, RuntimeError):
    """The sandbox or the control plane failed (not the agent's doing): the episode has no reward.

    Trainers should drop or mask the sample rather than score it 0."""


class ToolCallError(IdeGymError, ValueError):
    """A malformed tool call or one out of turn; the message says what is wrong and how to call it."""


__all__ = [
    "IdeGymError", "ConfigurationError", "ServiceError", "TransportError", "TimeoutError", "APIError", "BadRequest",
    "ValidationError", "Unauthorized", "NotFound", "Conflict", "SandboxGone", "Busy", "Cancelled", "ServerError",
    "InfrastructureError", "ToolCallError",
]
