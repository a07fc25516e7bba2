"""The algorithm contract and what PPO and GRPO share."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from rlchain.core.algorithms.config import LR_SCHEDULES, AlgorithmConfig
from rlchain.core.algorithms.update import MinibatchUpdate, NonFiniteError, first_non_finite
from rlchain.core.policies import Policy
from rlchain.settings import SettingError

if TYPE_CHECKING:
    from tensordict import TensorDict

__all__ = ["Algorithm", "AlgorithmConfig", "LR_SCHEDULES", "NonFiniteError", "first_non_finite"]


class Algorithm:
    """Turns rollouts into updates of a policy: the contract an algorithm writes against.

    An algorithm writes two things, as rsl_rl's ``PPO`` does: its samples (advantages, returns, masks) in
    :meth:`update`, and the loss of one minibatch in :meth:`_minibatch_loss`. Everything else of an update is
    its :attr:`updater` (:class:`~rlchain.core.algorithms.update.MinibatchUpdate`): Adam, the learning-rate
    schedule, the seeded minibatches, the train step (gradients, their clip, the ranks' mean), the non-finite
    checks, and compiling that step (``trainer.compile``). The docs page "Extending rlchain" has a minimal one.

    * required: ``__init__(policy, **settings)``, which builds its settings
      (an :class:`AlgorithmConfig` subclass) and calls
      ``Algorithm.__init__(policy, cfg)``; :meth:`update`.
    * optional, with their defaults here: :meth:`_minibatch_loss` (raises ``NotImplementedError``; the loss of one
      minibatch, which :meth:`_optimise` runs over ``n_epochs`` of seeded minibatches) and :attr:`term_names`,
      :attr:`reset_options` (None), :attr:`trains_sequences` (False), :meth:`check_env` (accepts any env),
      :meth:`reset_reference` (nothing), :meth:`state_dict` / :meth:`load_state_dict` (optimiser, schedule,
      generator), :meth:`rank_state_dict` / :meth:`load_rank_state_dict` (``{}`` / nothing).
    * given: :meth:`_samples`, :meth:`_optimise`, :attr:`current_lr`, ``self.policy``, ``self.cfg``,
      ``self.updater``, ``self.iteration``.

    :meth:`update` takes a ``[T, N]`` rollout TensorDict from :class:`rlchain.core.collector.SyncCollector` and
    returns a ``dict[str, float]`` of training statistics; it learns everything the policy learns from a rollout,
    its observation statistics included (:meth:`~rlchain.core.policies.Policy.update_obs_normalizer`, after the
    optimiser steps, so collection and update of one rollout see the same statistics). Settings: ``self.cfg``
    (:class:`AlgorithmConfig`). The learning-rate schedules: ``constant``, ``linear`` (decay to 0 over
    ``total_iterations``), and ``adaptive`` and ``adaptive_minibatch``, the rule of rsl_rl: divided by 1.5 when
    a KL exceeds ``2 * target_kl``, multiplied by 1.5 when it lies in ``(0, target_kl / 2)``, clamped to
    [1e-5, 1e-2].

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

    #: The names of the scalar terms :meth:`_minibatch_loss` reports besides ``loss``, in the order the update
    #: sums them (``approx_kl`` among them).
    term_names: tuple[str, ...] = ("approx_kl",)

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
        self.updater = MinibatchUpdate(policy, cfg, self._minibatch_loss, self.term_names, self.recurrent)
        """The update's mechanics: Adam, the schedule, the minibatches, the train step (its ``step`` compiles)."""

    @property
    def current_lr(self) -> float:
        """The learning rate in use (a host read)."""
        return self.updater.current_lr

    @property
    def iteration(self) -> int:
        """The updates run so far."""
        return self.updater.iteration

    def check_rollout(self, rollout_steps: int) -> None:
        """Raise :class:`~rlchain.settings.SettingError` if a recurrent policy's sequences cannot be cut from
        rollouts of ``rollout_steps`` steps: a ``seq_len`` that does not divide them, or a ``batch_size`` below one
        sequence. Nothing for a feed-forward policy."""
        if not self.recurrent:
            return
        seq_len = self.updater.seq_len(rollout_steps)
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

    def _samples(self, rollout: TensorDict, *keys: str) -> TensorDict:
        """The update's samples: ``keys`` of the ``[T, N]`` ``rollout`` (and a recurrent policy's ``hidden`` and
        ``done``, with which its sequences are replayed), in a TensorDict of their own (the tensors are shared,
        not copied), to which :meth:`update` adds what it computed (advantages, returns, ...).

        Raises:
            KeyError: a key that the rollout lacks.
        """
        return rollout.select(*keys, *(("hidden", "done") if self.recurrent else ())).clone(False)

    def _minibatches(self, data: TensorDict, shuffled: bool = True) -> Iterable[TensorDict]:
        """The update's minibatches of a ``[T, N]`` rollout (:meth:`MinibatchUpdate.minibatches`)."""
        return self.updater.minibatches(data, shuffled)

    def _optimise(
        self,
        data: TensorDict,
        *,
        stop_kl: float | None = None,
        weight: torch.Tensor | None = None,
    ) -> tuple[dict[str, float], int]:
        """Train on ``data`` (``[T, N]`` samples: :meth:`_samples` and what :meth:`update` added): ``n_epochs`` of
        seeded minibatches, one optimiser step each on :meth:`_minibatch_loss`, with the schedule, the clip and
        the non-finite checks (:meth:`MinibatchUpdate.run`, where ``stop_kl`` and ``weight`` are described).

        Returns:
            the mean of every reported term over the minibatches run (plus ``grad_norm``, and ``update_kl``
            under the adaptive schedule), and the number of epochs run.

        Raises:
            NonFiniteError: the first non-finite loss, gradient norm, reported term or parameter of the update.
        """
        return self.updater.run(data, stop_kl=stop_kl, weight=weight)

    def _minibatch_loss(self, batch: TensorDict) -> dict[str, torch.Tensor]:  # pragma: no cover - abstract
        """``loss`` (minimised) and the scalar terms :attr:`term_names` of one minibatch, each a 0-d tensor."""
        raise NotImplementedError

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
        return self.updater.state_dict()

    def rank_state_dict(self) -> dict[str, Any]:
        """What this process has of its own, tied to its envs (each rank's in a multi-process run); {} here."""
        return {}

    def load_rank_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`rank_state_dict` output; {} starts it afresh (after the envs restarted)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; the learning rate as the class docstring says."""
        self.updater.load_state_dict(state)
