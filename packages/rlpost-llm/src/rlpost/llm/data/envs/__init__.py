"""Text environments for multi-turn agents (issue 20): the protocol and our environments."""

from rlpost.llm.data.envs import household, kg, rewrite, search  # noqa: F401  (register them)
from rlpost.llm.data.envs.base import ENVIRONMENTS, StepResult, TextEnv, make_env, register_env

__all__ = ["ENVIRONMENTS", "StepResult", "TextEnv", "make_env", "register_env"]
