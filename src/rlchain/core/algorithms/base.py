"""The algorithm contract and what PPO and GRPO share."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rlchain.console import notice
from rlchain.core.buffer import minibatches, sequence_minibatches
from rlchain.core.policies import Policy
from rlchain.distributed import world
from rlchain.settings import SettingError, Settings, setting
from rlchain.utils import MAX_SEED

if TYPE_CHECKING:
    from tensordict import TensorDict

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


LR_SCHEDULES = ("constant", "linear", "adaptive", "adaptive_minibatch")
ADAPTIVE = ("adaptive", "adaptive_minibatch")
"""The schedules that adapt the rate on ``target_kl`` (see :class:`Algorithm`)."""


@dataclass
class AlgorithmConfig(Settings):
    """Hyperparameters every rlchain algorithm shares, with their defaults and ranges."""

    _target_: str = ""
    learning_rate: float = setting(3e-4, gt=0)
    """Adam step size (initial value under a schedule)."""
    n_epochs: int = setting(5, gt=0)
    """Passes over each rollout."""
    batch_size: int = setting(8192, gt=0)
    """Samples (env transitions) per minibatch; for a recurrent policy, rounded down to whole sequences of
    seq_len steps."""
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


class Algorithm:
    """Owns the optimiser of a policy and turns rollouts into updates.

    The contract of a subclass (the docs page "Extending rlchain" has a minimal one):

    * required: ``__init__(policy, **settings)``, which builds its settings
      (an :class:`AlgorithmConfig` subclass) and calls
      ``Algorithm.__init__(policy, cfg)``; :meth:`update`.
    * optional, with their defaults here: :meth:`_minibatch_loss` (raises
      ``NotImplementedError``; the loss of one minibatch, which
      :meth:`_optimise` runs over ``n_epochs`` of seeded minibatches and
      :meth:`compile` compiles), :attr:`update_keys` (``()``),
      :attr:`reset_options` (None), :meth:`check_env` (accepts any env),
      :meth:`reset_reference` (nothing), :meth:`state_dict` /
      :meth:`load_state_dict` (optimiser, schedule, generator),
      :meth:`rank_state_dict` / :meth:`load_rank_state_dict` (``{}`` /
      nothing), :meth:`compile` (compiles :meth:`_minibatch_loss`).
    * given: :attr:`current_lr`, ``self.policy``, ``self.cfg``,
      ``self.optimizer``, ``self.generator``, ``self.iteration``.

    Subclasses implement :meth:`update` (a ``[T, N]`` rollout TensorDict from
    :class:`rlchain.core.collector.SyncCollector` in, a ``dict[str, float]`` of
    training statistics out); an update learns everything the policy learns
    from a rollout, its observation statistics included
    (:meth:`~rlchain.core.policies.Policy.update_obs_normalizer`, after the
    optimiser steps, so collection and update of one rollout see the same
    statistics). Settings: ``self.cfg`` (:class:`AlgorithmConfig`). Shared here: Adam, the learning-rate schedule
    (``constant``, ``linear`` decay to 0 over ``total_iterations``, or
    ``adaptive`` and ``adaptive_minibatch``: the rule of rsl_rl, divided by 1.5
    when a KL exceeds ``2 * target_kl``, multiplied by 1.5 when it lies in
    ``(0, target_kl / 2)``, clamped to [1e-5, 1e-2]), the seeded minibatch
    generator, a non-finite loss check and ``state_dict`` /
    ``load_state_dict`` covering optimiser, schedule and generator.

    The two adaptive schedules differ in the KL they read. ``adaptive`` reads
    ``update_kl``, the KL from the rollout policy to the updated one averaged
    over the rollout's samples, measured once after each update and applied
    to the next. ``adaptive_minibatch`` is rsl_rl's schedule (which mjlab and
    Isaac Lab register for their tasks): before each minibatch's step it reads
    that minibatch's ``approx_kl`` from the rollout policy (the mean over the
    ranks in a multi-process run) and sets the rate of this step, so an update
    that starts to move the policy too far is slowed within the update; its
    ``target_kl`` is rsl_rl's ``desired_kl``. Under both, a KL of exactly 0
    leaves the rate as it is, as in rsl_rl (5.4.2, ``algorithms/ppo.py``): it
    says that nothing has moved yet. An update's first minibatch, read before
    any step, gives it wherever the update's forward pass reproduces the
    log-probabilities of the collection (the observation statistics move only
    after the optimiser steps), and ``update_kl`` after an update that left
    the policy as it was. One difference from rsl_rl remains: rsl_rl reads
    the analytic KL between the rollout's and the current Gaussians, rlchain
    the mean of the sampled ``(r - 1) - log r`` estimate (Schulman 2020) over
    the stored actions, which holds for any action distribution (Categorical
    included) and is noisier.

    A resumed run (:meth:`load_state_dict`) takes the rate of its config under
    ``constant`` and ``linear`` and goes on from the checkpoint's rate under
    the adaptive ones, saying in one line when the rate it goes on with differs
    from the checkpoint's (``constant``: the rate in use there; ``linear``:
    the configured start of its decay), or when an adaptive one leaves a changed
    ``learning_rate`` unused.

    Raises:
        SettingError: from the settings (:class:`AlgorithmConfig`): a value out
            of its range, an unknown schedule, ``linear`` without
            ``total_iterations``, an adaptive one without ``target_kl``, a
            ``target_kl`` that no setting reads.
    """

    #: ``env.reset`` options every rollout must start with (GRPO's group reset), or None to
    #: continue the episodes in progress; the trainer builds its collector with them.
    reset_options: dict[str, Any] | None = None

    #: Whether :meth:`update` trains a recurrent policy on whole sequences (its minibatches from :meth:`_optimise`,
    #: which cuts sequences for such a policy); an algorithm that does not is refused one.
    trains_sequences: bool = False

    #: Float ``[B]`` keys the update adds to the rollout's before its minibatches (PPO's ``advantages`` and
    #: ``returns``); :meth:`compile`'s example minibatch has them as zeros.
    update_keys: tuple[str, ...] = ()

    def __init__(self, policy: Policy, cfg: AlgorithmConfig) -> None:
        self.policy, self.cfg = policy, cfg
        self.recurrent = bool(getattr(policy, "is_recurrent", False))
        """Whether the policy is recurrent: minibatches are whole sequences (:func:`~rlchain.core.buffer.sequence_minibatches`)."""
        if self.recurrent and not self.trains_sequences:
            rnn = getattr(getattr(policy, "cfg", None), "rnn_type", None)
            raise SettingError(
                "policy.rnn_type",
                rnn,
                f" is not allowed with {type(self).__name__}: its update trains on single steps, not on whole "
                "sequences (Algorithm.trains_sequences); expected None (a feed-forward policy), or algorithm=ppo or grpo",
            )
        if cfg.seq_len is not None and not self.recurrent:
            raise SettingError(
                "seq_len", cfg.seq_len, " is not allowed with a feed-forward policy: expected None (or policy.rnn_type)"
            )
        # fused: one kernel for every parameter's Adam step (on the CPU too).
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.learning_rate, eps=1e-5, fused=True)
        device = next(policy.parameters()).device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(cfg.seed)
        self.iteration = 0
        self.minibatch_loss: Callable[[TensorDict], dict[str, torch.Tensor]] = self._minibatch_loss
        """The loss of one minibatch the update runs (:meth:`_minibatch_loss`; compiled by :meth:`compile`)."""

    @property
    def current_lr(self) -> float:
        """The learning rate in use."""
        return self.optimizer.param_groups[0]["lr"]

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _scheduled_lr(self) -> float:
        """The rate of the next update under ``constant`` or ``linear`` (from the config; not the adaptive ones)."""
        if self.cfg.lr_schedule == "linear":
            return self.cfg.learning_rate * max(0.0, 1.0 - self.iteration / self.cfg.total_iterations)
        return self.cfg.learning_rate

    def _schedule_before_update(self) -> None:
        if self.cfg.lr_schedule not in ADAPTIVE:
            self._set_lr(self._scheduled_lr())

    def _adapt_lr(self, kl: float) -> None:
        """The adaptive rule (see the class docstring) on ``kl``: an update's ``update_kl`` or a minibatch's
        ``approx_kl``."""
        lr = self.current_lr
        if kl > 2.0 * self.cfg.target_kl:
            lr = max(1e-5, lr / 1.5)
        elif 0.0 < kl < self.cfg.target_kl / 2.0:  # a KL of 0 (nothing moved yet) says nothing: rsl_rl's guard
            lr = min(1e-2, lr * 1.5)
        self._set_lr(lr)

    def check_rollout(self, rollout_steps: int) -> None:
        """Raise :class:`~rlchain.settings.SettingError` if a recurrent policy's sequences cannot be cut from
        rollouts of ``rollout_steps`` steps: a ``seq_len`` that does not divide them, or a ``batch_size`` below one
        sequence. Nothing for a feed-forward policy."""
        if not self.recurrent:
            return
        seq_len = self._seq_len(rollout_steps)
        if rollout_steps % seq_len:
            divisors = [d for d in range(1, rollout_steps + 1) if rollout_steps % d == 0]
            raise SettingError(
                "algorithm.seq_len",
                seq_len,
                f" does not divide trainer.rollout_steps={rollout_steps}: a recurrent policy trains on whole "
                f"sequences; expected one of {divisors[-8:]} (or None: the whole rollout)",
            )
        if self.cfg.batch_size < seq_len:
            raise SettingError(
                "algorithm.batch_size",
                self.cfg.batch_size,
                f" is smaller than one sequence (seq_len {seq_len}): a recurrent policy's minibatches are whole "
                f"sequences; expected batch_size >= {seq_len}, or a smaller algorithm.seq_len",
            )

    def _seq_len(self, rollout_steps: int) -> int:
        """Steps per training sequence: ``seq_len``, or the whole rollout."""
        return self.cfg.seq_len if self.cfg.seq_len is not None else rollout_steps

    def _minibatches(self, data: TensorDict, shuffled: bool = True):
        """The update's minibatches of a ``[T, N]`` rollout: seeded random samples ``[B]``, or for a recurrent
        policy whole sequences ``[seq_len, S]``; in order (every sample once, not shuffled) for ``shuffled=False``."""
        if self.recurrent:
            steps = data.batch_size[0]
            generator = self.generator if shuffled else None
            return sequence_minibatches(data, self._seq_len(steps), self.cfg.batch_size, generator)
        if shuffled:
            return minibatches(data, self.cfg.batch_size, self.generator)
        flat = data.reshape(-1)
        return (
            flat[start : start + self.cfg.batch_size] for start in range(0, flat.batch_size[0], self.cfg.batch_size)
        )

    def _rollout_keys(self) -> tuple[str, ...]:
        """The rollout keys a recurrent policy's update replays its sequences with (``hidden``, ``done``); none
        for a feed-forward policy."""
        return ("hidden", "done") if self.recurrent else ()

    @torch.no_grad()
    def _update_kl(self, data: TensorDict, weight: torch.Tensor | None) -> float:
        """Mean KL(rollout policy || current policy) over ``data``'s samples, weighted by ``weight``.

        Uses the ``(r - 1) - log r`` estimator (Schulman 2020) of the
        probability ratio ``r`` of each stored action; one forward pass over
        ``data`` in the update's minibatches, in order (a recurrent policy's whole sequences).

        Args:
            data: the ``[T, N]`` rollout's samples, with ``sample_log_prob`` at collection.
            weight: float, ``data``'s batch shape: each sample's weight (GRPO's live
                mask), or None for every sample alike. 0 when every weight is 0.
        """
        if weight is None:
            weight = torch.ones(data.batch_size, device=data.device)
        data = data.clone(False)
        data.set("kl_weight", weight)
        total = torch.zeros((), device=data.device)
        for chunk in self._minibatches(data, shuffled=False):
            log_ratio = self.policy.evaluate_actions(chunk)["sample_log_prob"] - chunk["sample_log_prob"]
            total += ((torch.expm1(log_ratio) - log_ratio) * chunk["kl_weight"]).sum()
        total, count = world().sum(torch.stack([total, weight.sum()]), "the all-reduce of update_kl")
        return float(total / count) if float(count) > 0 else 0.0

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
        if world().distributed:  # every rank steps with the mean of the ranks' gradients
            grads = []
            for p in self.policy.parameters():
                if p.requires_grad:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    grads.append(p.grad)
            world().average_(grads, "the all-reduce of the gradients")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.max_grad_norm)
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
        weight: torch.Tensor | None = None,
    ) -> tuple[dict[str, float], int]:
        """Run ``n_epochs`` over seeded minibatches of ``data``: one optimiser step per minibatch.

        ``minibatch_loss(batch)`` returns ``loss`` (minimised) and scalar terms to
        report, ``approx_kl`` among them. Applies the learning-rate schedule,
        counts the update, and stops training at the first non-finite loss,
        gradient norm, reported term or parameter. With ``stop_kl`` the
        epochs stop after one whose last minibatch's ``approx_kl`` exceeds it
        (CleanRL's rule: that KL is measured in the last minibatch's forward
        pass, after every earlier step of the epoch; an epoch's mean would
        count the first minibatch's KL, 0 before any step, and lag).
        ``weight`` (float, ``data``'s batch shape, or None) weights the
        samples of the adaptive schedule's ``update_kl`` (:meth:`_update_kl`).

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
        for _ in range(self.cfg.n_epochs):
            for batch in self._minibatches(data):
                terms = minibatch_loss(batch)
                if self.cfg.lr_schedule == "adaptive_minibatch":  # one host read per minibatch, as rsl_rl's
                    self._adapt_lr(
                        world().mean(terms["approx_kl"].detach(), "the all-reduce of the minibatch KL").item()
                    )
                terms["grad_norm"] = self._step(terms.pop("loss"))
                for key, value in terms.items():
                    totals[key] = totals.get(key, 0.0) + value.detach()
                count += 1
            epochs += 1
            if (
                stop_kl is not None
                and world().mean(terms["approx_kl"], "the all-reduce of the KL stop").item() > stop_kl
            ):
                break
        self.iteration += 1
        means = world().mean(torch.stack(list(totals.values())) / count, "the all-reduce of the update's terms")
        stats = dict(zip(totals, means.tolist()))
        self._check_finite(stats)
        if self.cfg.lr_schedule == "adaptive":
            stats["update_kl"] = self._update_kl(data, weight)
            self._adapt_lr(stats["update_kl"])
        return stats, epochs

    def _minibatch_loss(self, batch: TensorDict) -> dict[str, torch.Tensor]:  # pragma: no cover - abstract
        """``loss`` (minimised) and the scalar terms to report (``approx_kl`` among them) of one minibatch."""
        raise NotImplementedError

    def compile(self, rollout: TensorDict) -> None:
        """Compile the minibatch loss with ``torch.compile`` (``trainer.compile``; mode default), and run it
        forward and backward once, so that both graphs are compiled before the first update.

        The example it runs is a minibatch of the update's size cut from ``rollout`` (the collector's ``[T, N]``
        storage; its zeros before the first rollout do), with the keys :attr:`update_keys` added as zeros. The
        gradients it leaves are cleared; nothing else changes.

        Raises:
            Exception: what compiling raises (e.g. torch's ``InductorError`` without a C++ compiler).
        """
        example = next(iter(self._minibatches(rollout, shuffled=False))).clone()
        for key in self.update_keys:
            example.set(key, torch.zeros(example.batch_size, device=example.device))
        self.minibatch_loss = torch.compile(self._minibatch_loss)
        self.minibatch_loss(example)["loss"].backward()
        self.optimizer.zero_grad(set_to_none=True)

    def check_env(self, env: Any) -> None:
        """Raise :class:`~rlchain.settings.SettingError` if this algorithm cannot train on ``env`` (before any step)."""

    def reset_reference(self) -> None:
        """Take the policy as it is now as the reference of a KL penalty (GRPO); nothing for the others.

        Called by the trainer after it loaded the policy's weights from another
        run (``trainer.init_from``), so fine-tuning measures the KL to the
        loaded policy rather than to the random initialisation.
        """

    def update(self, rollout: TensorDict) -> dict[str, float]:  # pragma: no cover - abstract
        """Learn from a ``[T, N]`` rollout of the collector (see :class:`rlchain.core.buffer.RolloutBuffer` for its keys).

        Returns:
            the update's terms (losses, KLs, rates) as floats; the trainer
            logs them under ``losses/`` (``learning_rate`` under ``charts/``).

        Raises:
            NonFiniteError: a non-finite loss, gradient norm, term or parameter (see :meth:`_optimise`).
        """
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Optimiser, schedule (the configured ``learning_rate`` too) and minibatch generator state."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "iteration": self.iteration,
            "generator": self.generator.get_state(),
            "learning_rate": self.cfg.learning_rate,
        }

    def rank_state_dict(self) -> dict[str, Any]:
        """What this process has of its own, tied to its envs (each rank's in a multi-process run); {} here."""
        return {}

    def load_rank_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`rank_state_dict` output; {} starts it afresh (after the envs restarted)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; the learning rate as the class docstring says."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.iteration = state["iteration"]
        self.generator.set_state(state["generator"].cpu())  # generator states are CPU byte tensors
        schedule, configured = self.cfg.lr_schedule, state.get("learning_rate")
        changed = configured is not None and not math.isclose(configured, self.cfg.learning_rate, rel_tol=1e-9)
        if schedule in ADAPTIVE:
            if changed:
                notice(
                    f"lr_schedule={schedule!r} goes on from the checkpoint's rate {self.current_lr:g}; "
                    f"algorithm.learning_rate={self.cfg.learning_rate:g} starts fresh runs only"
                )
            return
        saved = self.current_lr if schedule == "constant" else configured  # linear: the start of the decay
        self._set_lr(self._scheduled_lr())
        if saved is not None and not math.isclose(saved, self.cfg.learning_rate, rel_tol=1e-9):
            notice(
                f"algorithm.learning_rate={self.cfg.learning_rate:g} replaces the checkpoint's {saved:g} "
                f"(lr_schedule={schedule!r})"
            )
