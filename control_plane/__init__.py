"""IdeGym's control plane: the orchestrator of sandboxes (clients, servers, forwarding,
operations, snapshots, image builds), wire-compatible with the published ``idegym-client``."""

__version__ = "0.1.0"
