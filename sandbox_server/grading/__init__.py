"""Grading inside the sandbox: the pristine tree, the check stages, the graded report."""
