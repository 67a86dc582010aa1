"""Entry point of the judge (``python3 -I run.py ...``): loads this directory as the package
``idegym_judge`` — test modules import ``from idegym_judge import subject`` — without putting
anything else on ``sys.path``."""

import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _package():
    spec = importlib.util.spec_from_file_location("idegym_judge", os.path.join(HERE, "__init__.py"),
                                                  submodule_search_locations=[HERE])
    package = importlib.util.module_from_spec(spec)
    sys.modules["idegym_judge"] = package
    spec.loader.exec_module(package)
    return package


if __name__ == "__main__":
    _package()
    from idegym_judge.runner import main

    sys.exit(main())
