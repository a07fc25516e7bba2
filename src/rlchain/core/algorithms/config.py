"""The hyperparameters every rlchain algorithm shares (:class:`AlgorithmConfig`), with their defaults and ranges."""

from __future__ import annotations

from dataclasses import dataclass

from rlchain.settings import SettingError, Settings, setting
from rlchain.utils import MAX_SEED

__all__ = ["ADAPTIVE", "LR_SCHEDULES", "AlgorithmConfig"]

LR_SCHEDULES = ("constant", "linear", "adaptive", "adaptive_minibatch")
ADAPTIVE = ("adaptive", "adaptive_minibatch")
"""The schedules that adapt the rate on ``target_kl`` (see :class:`~rlchain.core.algorithms.base.Algorithm`)."""


@dataclass
class AlgorithmConfig(Settings):
    """Hyperparameters every rlchain algorithm shares, with their defaults and ranges."""

    _target_: str = ""
    learning_rate: float = setting(3e-4, gt=0)
    """Adam step size (initial value under a schedule)."""
    n_epochs: int = setting(5, gt=0)
    """Passes over each rollout."""
    batch_size: int = setting(8192, gt=0)
    """Samples (env transitions) per minibatch. Every minibatch has this size: each epoch takes a new random order
    of the rollout's rollout_steps x num_envs samples and leaves out the remainder that does not fill a last
    minibatch (a rollout smaller than batch_size is one minibatch), so a size that divides the rollout uses every
    sample. For a recurrent policy, rounded down to whole sequences of seq_len steps."""
    gamma: float = setting(0.99, ge=0, le=1)
    """Discount factor."""
    clip_coef: float = setting(0.2, gt=0)
    """Surrogate clipping range epsilon."""
    ent_coef: float = setting(0.0, ge=0)
    """Weight of the entropy bonus."""
    max_grad_norm: float = setting(1.0, gt=0)
    """Global gradient-norm clip."""
    lr_schedule: str = setting("constant", choices=LR_SCHEDULES)
    """constant, linear (decay to 0 over total_iterations), adaptive (on target_kl, once per update, from the KL
    the update caused) or adaptive_minibatch (rsl_rl's rule: on target_kl, before every minibatch's step)."""
    target_kl: float | None = setting(None, gt=0)
    """KL target of the adaptive schedule (and of PPO's stop_at_target_kl); refused where no setting reads it."""
    total_iterations: int | None = None
    """Length of the linear schedule in updates (the trainer's iterations; read by the linear schedule only)."""
    seed: int = setting(0, ge=0, le=MAX_SEED)
    """Seed of the minibatch permutation."""
    seq_len: int | None = setting(None, gt=0)
    """Steps per training sequence of a recurrent policy (policy.rnn_type), each replayed from the state stored
    at its first step; divides trainer.rollout_steps. None: whole rollouts (rollout_steps). Refused with a
    feed-forward policy."""

    def check(self) -> None:
        """A schedule needs its parameter (an adaptive one a ``target_kl``, linear a ``total_iterations``), and a
        ``target_kl`` needs a setting that reads it (:meth:`target_kl_readers`)."""
        if self.lr_schedule in ADAPTIVE and self.target_kl is None:
            raise SettingError(
                "target_kl", None, f" is not allowed with lr_schedule={self.lr_schedule!r}: expected a number > 0"
            )
        if self.lr_schedule == "linear" and (self.total_iterations is None or self.total_iterations <= 0):
            raise SettingError(
                "total_iterations",
                self.total_iterations,
                " is not allowed with lr_schedule='linear': expected an integer > 0",
            )
        readers = self.target_kl_readers()
        if self.target_kl is not None and not any(reads for reads, _ in readers.values()):
            settings = ", ".join(f"{name}={getattr(self, name)!r}" for name in readers)
            wanted = " or ".join(want for _, want in readers.values())
            raise SettingError(
                "target_kl",
                self.target_kl,
                f" is not allowed with {settings}: no setting reads it (it is read by {wanted}); expected None",
            )

    def target_kl_readers(self) -> dict[str, tuple[bool, str]]:
        """The settings that read ``target_kl``: ``{name: (whether it reads it now, the value that would)}``."""
        return {"lr_schedule": (self.lr_schedule in ADAPTIVE, "lr_schedule=" + " or ".join(map(repr, ADAPTIVE)))}
