"""An env ``_target_`` whose evaluations fail on chosen resets: a population's shared evaluation (a reset with each
member's seed) or the evaluation of one seed."""

from __future__ import annotations

from typing import Any

from rlchain.core.envs import PushCubeEnv


class EvaluationFaultPushCube(PushCubeEnv):
    """``PushCubeEnv`` whose ``reset`` raises ``RuntimeError`` where its seed is ``fail_seed``, and, with
    ``shared_fails``, where it is a list (the reset of a task split into members: a population's shared
    evaluation)."""

    def __init__(self, fail_seed: int | None = None, shared_fails: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail_seed, self.shared_fails = fail_seed, shared_fails

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None):
        if self.shared_fails and isinstance(seed, list):
            raise RuntimeError(f"the shared reset of seeds {seed} failed")
        if seed is not None and seed == self.fail_seed:
            raise RuntimeError(f"the reset of seed {seed} failed")
        return super().reset(seed=seed, options=options)
