"""Task sources: HumanEval-style problem sets, SWE-style instances and Harbor task directories,
each producing the one :class:`~idegym_env.tasks.Task` model."""
