"""The oracle's pytest plugin (scripts/judge_oracle.py tests): wraps the judge's entry points
once pytest's own import hooks are in place, so that the tests' in-process checks are written
down too."""

import sitecustomize


def pytest_configure(config):
    if sitecustomize.OUT:
        sitecustomize.wrap_all()
