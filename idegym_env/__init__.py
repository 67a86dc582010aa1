"""IdeGym: disposable coding sandboxes as reinforcement-learning environments."""

__version__ = "0.1.0"
