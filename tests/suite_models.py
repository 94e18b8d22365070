"""Which model the suite runs. Most tests need a model's speed, not its quality: the small
SmolLM2-135M (`smollm2-135m`) is the suite's default, set through $KSPEC_MODEL for the test process
and every server it starts (tests/conftest.py). Tests of what a user gets with no model named
(prompts, quality, the README's demo) run the real default (`REAL_DEFAULT`, `real_default_env`).
`bash scripts/setup.sh test` installs both."""

from __future__ import annotations

import os

from kspec.engine.models.catalog import DEFAULT_MODEL, DEFAULT_MODEL_ENV

TEST_MODEL = "smollm2-135m"
REAL_DEFAULT = DEFAULT_MODEL


def use_test_model() -> None:
    os.environ[DEFAULT_MODEL_ENV] = TEST_MODEL


def real_default_env() -> dict[str, str]:
    """This environment without the suite's choice of model: a command started with it uses the
    real default, as a user's would."""
    return {key: value for key, value in os.environ.items() if key != DEFAULT_MODEL_ENV}
