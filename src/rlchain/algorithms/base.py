"""The algorithm contract and what PPO and GRPO share."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from tensordict import TensorDict

from rlchain.buffer import minibatches
from rlchain.policies import Policy
from rlchain.utils import check_choice, check_in_range, check_positive

__all__ = ["Algorithm", "AlgorithmConfig", "LR_SCHEDULES", "NonFiniteError", "first_non_finite"]


class NonFiniteError(FloatingPointError):
    """A training quantity (loss, gradient norm, KL, parameter) became NaN or infinite.

    Attributes:
        metric: what went non-finite, e.g. ``"loss"``, ``"grad_norm"``,
            ``"approx_kl"`` or ``"parameter actor.0.weight"``.
        value: its value (a float; for a parameter, its first non-finite entry).
    """

    def __init__(self, metric: str, value: float, update: int) -> None:
        self.metric, self.value = metric, value
        super().__init__(f"{metric} is {value} at update {update}")

def first_non_finite(tensors: dict[str, torch.Tensor]) -> tuple[str, float] | None:
    """The name and first NaN or infinite entry of the first floating tensor of ``tensors`` that has one, else None.

    One host read when every tensor is finite (the common case).
    """
    floats = {name: t for name, t in tensors.items() if t.is_floating_point()}
    if not floats:
        return None
    with torch.no_grad():
        finite = torch.stack([torch.isfinite(t).all() for t in floats.values()])
        if bool(finite.all()):
            return None
        name = list(floats)[int((~finite).nonzero()[0])]
        value = floats[name]
        return name, value[~torch.isfinite(value)].flatten()[0].item()


LR_SCHEDULES = ("constant", "linear", "adaptive")


@dataclass
class AlgorithmConfig:
    """Hyperparameters every rlchain algorithm shares, with their defaults."""

    _target_: str = ""
    learning_rate: float = 3e-4
    """Adam step size (initial value under a schedule)."""
    n_epochs: int = 5
    """Passes over each rollout."""
    batch_size: int = 8192
    """Samples (env transitions) per minibatch."""
    gamma: float = 0.99
    """Discount factor."""
    clip_coef: float = 0.2
    """Surrogate clipping range epsilon."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip."""
    lr_schedule: str = "constant"
    """constant, linear (decay to 0 over total_iterations) or adaptive (on target_kl)."""
    target_kl: float | None = None
    """KL target of the adaptive schedule (and of PPO's stop_at_target_kl)."""
    total_iterations: int | None = None
    """Length of the linear schedule in updates (the trainer's iterations)."""
    seed: int = 0
    """Seed of the minibatch permutation."""


class Algorithm:
    """Owns the optimiser of a policy and turns rollouts into updates.

    Subclasses implement :meth:`update` (a ``[T, N]`` rollout TensorDict from
    :class:`rlchain.collector.SyncCollector` in, a ``dict[str, float]`` of
    training statistics out). Shared here: Adam, the learning-rate schedule
    (``constant``, ``linear`` decay to 0 over ``total_iterations``, or
    ``adaptive``, the rule of rsl_rl: divided by 1.5 when the KL of an update
    exceeds ``2 * target_kl``, multiplied by 1.5 when it is below
    ``target_kl / 2``, clamped to [1e-5, 1e-2]), the seeded minibatch
    generator, a non-finite loss check and ``state_dict`` /
    ``load_state_dict`` covering optimiser, schedule and generator.

    The adaptive rule reads ``update_kl``, the KL from the rollout policy to
    the updated one averaged over the rollout's samples, measured once after
    each update and applied to the next. The KL a minibatch sees before its
    own step would not do: on an update's first minibatch the policy is still
    the rollout policy, so that KL is 0 whatever ``target_kl`` is.

    Raises:
        ValueError: out-of-range hyperparameters, an unknown schedule,
            ``linear`` without ``total_iterations``, ``adaptive`` without
            ``target_kl``.
    """

    #: ``env.reset`` options to apply before every rollout (GRPO's group reset), or None.
    reset_options: dict[str, Any] | None = None

    def __init__(
        self,
        policy: Policy,
        learning_rate: float,
        n_epochs: int,
        batch_size: int,
        max_grad_norm: float,
        lr_schedule: str,
        target_kl: float | None,
        total_iterations: int | None,
        seed: int,
    ) -> None:
        check_positive("learning_rate", learning_rate)
        check_positive("n_epochs", n_epochs, integer=True)
        check_positive("batch_size", batch_size, integer=True)
        check_positive("max_grad_norm", max_grad_norm)
        check_choice("lr_schedule", lr_schedule, LR_SCHEDULES)
        if target_kl is not None:
            check_positive("target_kl", target_kl)
        if lr_schedule == "adaptive" and target_kl is None:
            raise ValueError("target_kl=None is not allowed with lr_schedule='adaptive': expected a number > 0")
        if lr_schedule == "linear":
            if total_iterations is None:
                raise ValueError("total_iterations=None is not allowed with lr_schedule='linear': expected an integer > 0")
            check_positive("total_iterations", total_iterations, integer=True)
        self.policy = policy
        self.learning_rate = float(learning_rate)
        self.n_epochs, self.batch_size = int(n_epochs), int(batch_size)
        self.max_grad_norm = float(max_grad_norm)
        self.lr_schedule, self.target_kl, self.total_iterations = lr_schedule, target_kl, total_iterations
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=self.learning_rate, eps=1e-5)
        device = next(policy.parameters()).device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(int(seed))
        self.iteration = 0

    @property
    def current_lr(self) -> float:
        """The learning rate in use."""
        return self.optimizer.param_groups[0]["lr"]

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _schedule_before_update(self) -> None:
        if self.lr_schedule == "linear":
            self._set_lr(self.learning_rate * max(0.0, 1.0 - self.iteration / self.total_iterations))

    def _schedule_after_update(self, update_kl: float) -> None:
        """The adaptive rule (see the class docstring) on the KL an update caused."""
        lr = self.current_lr
        if update_kl > 2.0 * self.target_kl:
            lr = max(1e-5, lr / 1.5)
        elif update_kl < self.target_kl / 2.0:
            lr = min(1e-2, lr * 1.5)
        self._set_lr(lr)

    @torch.no_grad()
    def _update_kl(self, data: TensorDict) -> float:
        """Mean KL(rollout policy || current policy) over ``data``'s samples (live ones where it has a ``mask``).

        Uses the ``(r - 1) - log r`` estimator (Schulman 2020) of the
        probability ratio ``r`` of each stored action; one forward pass over
        ``data`` in chunks of ``batch_size``.
        """
        flat = data.reshape(-1)
        total = weight = 0.0
        for start in range(0, flat.batch_size[0], self.batch_size):
            chunk = flat[start : start + self.batch_size]
            log_ratio = self.policy.evaluate_actions(chunk)["sample_log_prob"] - chunk["sample_log_prob"]
            kl = torch.expm1(log_ratio) - log_ratio
            mask = chunk["mask"] if "mask" in chunk.keys() else torch.ones_like(kl)
            total = total + (kl * mask).sum()
            weight = weight + mask.sum()
        return float(total / weight) if float(weight) > 0 else 0.0

    def _step(self, loss: torch.Tensor) -> torch.Tensor:
        """Backpropagate ``loss``, clip gradients, step; return the pre-clip gradient norm (0-d tensor).

        Raises:
            NonFiniteError: ``loss`` or the gradient norm is NaN or infinite;
                the parameters are left untouched.
        """
        if not torch.isfinite(loss):
            raise NonFiniteError("loss", loss.item(), self.iteration + 1)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
        if not torch.isfinite(grad_norm):
            raise NonFiniteError("grad_norm", grad_norm.item(), self.iteration + 1)
        self.optimizer.step()
        return grad_norm

    def _check_finite(self, stats: dict[str, float]) -> None:
        """Raise :class:`NonFiniteError` for a non-finite reported term or policy parameter.

        The terms are the minibatch means of one update (``approx_kl`` among
        them); the parameters are checked once per update, after its last step.
        """
        for name, value in stats.items():
            if not math.isfinite(value):
                raise NonFiniteError(name, value, self.iteration)
        bad = first_non_finite(dict(self.policy.named_parameters()))
        if bad is not None:
            raise NonFiniteError(f"parameter {bad[0]}", bad[1], self.iteration)

    def _optimise(
        self,
        data: TensorDict,
        minibatch_loss: Callable[[TensorDict], dict[str, torch.Tensor]],
        stop_kl: float | None = None,
    ) -> tuple[dict[str, float], int]:
        """Run ``n_epochs`` over seeded minibatches of ``data``: one optimiser step per minibatch.

        ``minibatch_loss(batch)`` returns ``loss`` (minimised) and scalar terms to
        report, ``approx_kl`` among them. Applies the learning-rate schedule,
        stops after an epoch whose mean ``approx_kl`` exceeds ``stop_kl``,
        counts the update, and stops training at the first non-finite loss,
        gradient norm, reported term or parameter.

        Returns:
            the mean of every reported term over the minibatches run (plus
            ``grad_norm``, and ``update_kl`` under the adaptive schedule), and
            the number of epochs run.

        Raises:
            NonFiniteError: see :meth:`_step` and :meth:`_check_finite`.
        """
        self._schedule_before_update()
        totals: dict[str, torch.Tensor] = {}
        count, epochs = 0, 0
        for _ in range(self.n_epochs):
            epoch_kl = []
            for batch in minibatches(data, self.batch_size, self.generator):
                terms = minibatch_loss(batch)
                terms["grad_norm"] = self._step(terms.pop("loss"))
                for key, value in terms.items():
                    totals[key] = totals.get(key, 0.0) + value.detach()
                count += 1
                epoch_kl.append(terms["approx_kl"].detach())
            epochs += 1
            if stop_kl is not None and torch.stack(epoch_kl).mean().item() > stop_kl:
                break
        self.iteration += 1
        stats = {key: (value / count).item() for key, value in totals.items()}
        self._check_finite(stats)
        if self.lr_schedule == "adaptive":
            stats["update_kl"] = self._update_kl(data)
            self._schedule_after_update(stats["update_kl"])
        return stats, epochs

    def check_env(self, env: Any) -> None:
        """Raise ``ValueError`` if this algorithm cannot train on ``env`` (before any step)."""

    def reset_reference(self) -> None:
        """Take the policy as it is now as the reference of a KL penalty (GRPO); nothing for the others.

        Called by the trainer after it loaded the policy's weights from another
        run (``trainer.init_from``), so fine-tuning measures the KL to the
        loaded policy rather than to the random initialisation.
        """

    def update(self, rollout: TensorDict) -> dict[str, float]:  # pragma: no cover - abstract
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Optimiser, schedule and minibatch generator state."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "iteration": self.iteration,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.iteration = state["iteration"]
        self.generator.set_state(state["generator"].cpu())  # generator states are CPU byte tensors


def check_probability(name: str, value: float) -> None:
    """Raise unless ``0 <= value <= 1``."""
    check_in_range(name, value, 0.0, 1.0)
