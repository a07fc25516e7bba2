"""The algorithm contract and what PPO and GRPO share."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.adam import adam

from rlchain.console import notice
from rlchain.core.buffer import minibatch_order, sequence_minibatches
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
      :meth:`compile` compiles), :attr:`sample_keys` (``obs``, ``action``,
      ``sample_log_prob``), :attr:`update_keys` (``()``),
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

    #: The rollout keys the update's samples take from the rollout (:meth:`_samples`); :meth:`compile`'s example
    #: has the same keys, so that the compiled step it traces is the one every update runs.
    sample_keys: tuple[str, ...] = ("obs", "action", "sample_log_prob")

    #: Float ``[B]`` keys the update adds to its samples, in the order it adds them (PPO's ``advantages`` and
    #: ``returns``); :meth:`compile`'s example has them as zeros.
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
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.learning_rate, eps=1e-5, fused=True)
        """Adam (Kingma and Ba 2015) over the policy's parameters: its ``state_dict`` is the checkpoint's; its step
        runs inside :meth:`_train_step` (:func:`torch.optim.adam.adam` on the optimiser's own state tensors)."""
        device = next(policy.parameters()).device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(cfg.seed)
        self.iteration = 0
        self.lr = torch.tensor(cfg.learning_rate, dtype=torch.float64, device=device)
        """The learning rate in use, a float64 0-d tensor on the policy's device: the schedules set it in place, so
        a compiled or captured step reads the current rate without a recompile."""
        self._params = [p for p in policy.parameters() if p.requires_grad]
        self._adam_state = _init_adam_state(self.optimizer, self._params)
        self._step_lr = torch.zeros((), dtype=torch.float32, device=device)
        self._totals = torch.zeros(len(self.term_names) + 1, dtype=torch.float64, device=device)
        """The sums of the update's reported terms and ``grad_norm`` over its minibatches (float64 ``[K + 1]``)."""
        self._fault = torch.zeros((), dtype=torch.int64, device=device)
        """0 while the update's losses and gradient norms are finite; else what went non-finite first (1 the
        loss, 2 the gradient norm), and from then on every later step of the update leaves the parameters as
        they are. Read once, at the update's end."""
        self._fault_value = torch.zeros((), dtype=torch.float32, device=device)
        self.minibatch_loss: Callable[[TensorDict], dict[str, torch.Tensor]] = self._minibatch_loss
        """The loss of one minibatch (:meth:`_minibatch_loss`)."""
        self.train_step: Callable[[TensorDict], torch.Tensor] = self._train_step
        """One minibatch's optimiser step (:meth:`_train_step`)."""
        self.indexed_step: Callable[[], torch.Tensor] = self._indexed_step
        """A feed-forward policy's minibatch step over the staged update data (:meth:`_indexed_step`; compiled
        whole by :meth:`compile`, replayed as a CUDA graph by :meth:`capture`)."""
        self.compiled_whole = False
        """Whether :meth:`compile` compiled the whole minibatch step (else at most the loss)."""
        self._staged: TensorDict | None = None
        """The update's samples, flat ``[B]``, in a buffer of fixed addresses (a feed-forward policy's update)."""
        self._order = torch.zeros(0, dtype=torch.int64, device=device)
        """This epoch's minibatches as sample indices ``[M, size]`` (:func:`~rlchain.core.buffer.minibatch_order`)."""
        self._order_buffer = torch.zeros(0, dtype=torch.int64, device=device)
        self._position = torch.zeros(1, dtype=torch.int64, device=device)
        """The minibatch of the epoch that the next :meth:`_indexed_step` takes, on the device."""

    @property
    def current_lr(self) -> float:
        """The learning rate in use (a host read of :attr:`lr`)."""
        return float(self.lr)

    def _set_lr(self, lr: float) -> None:
        self.lr.fill_(lr)

    def _scheduled_lr(self) -> float:
        """The rate of the next update under ``constant`` or ``linear`` (from the config; not the adaptive ones)."""
        if self.cfg.lr_schedule == "linear":
            return self.cfg.learning_rate * max(0.0, 1.0 - self.iteration / self.cfg.total_iterations)
        return self.cfg.learning_rate

    def _schedule_before_update(self) -> None:
        if self.cfg.lr_schedule not in ADAPTIVE:
            self._set_lr(self._scheduled_lr())

    def _adapt_lr(self, kl: torch.Tensor) -> None:
        """The adaptive rule (see the class docstring) on ``kl`` (a 0-d tensor: an update's ``update_kl`` or a
        minibatch's ``approx_kl``), in tensor operations on :attr:`lr` (no host read); a NaN KL leaves it."""
        target, lr = self.cfg.target_kl, self.lr
        down = (lr / 1.5).clamp_min(1e-5)
        up = (lr * 1.5).clamp_max(1e-2)
        # A KL of 0 (nothing moved yet) says nothing: rsl_rl's guard.
        self.lr.copy_(torch.where(kl > 2.0 * target, down, torch.where((kl > 0.0) & (kl < target / 2.0), up, lr)))

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
        """The update's minibatches of a ``[T, N]`` rollout, every sample at most once: for a feed-forward policy
        minibatches of one size (:func:`~rlchain.core.buffer.minibatch_order`: seeded random samples; in order for
        ``shuffled=False``, where the last may be smaller so that every sample counts); for a recurrent policy
        whole sequences ``[seq_len, S]`` (:func:`~rlchain.core.buffer.sequence_minibatches`)."""
        if self.recurrent:
            steps = data.batch_size[0]
            generator = self.generator if shuffled else None
            return sequence_minibatches(data, self._seq_len(steps), self.cfg.batch_size, generator)
        flat = data.reshape(-1)
        if shuffled:
            order = minibatch_order(flat.batch_size[0], self.cfg.batch_size, self.generator)
            return (flat[indices] for indices in order.to(flat.device))
        return (
            flat[start : start + self.cfg.batch_size] for start in range(0, flat.batch_size[0], self.cfg.batch_size)
        )

    def _samples(self, rollout: TensorDict) -> TensorDict:
        """The update's samples: the keys :attr:`sample_keys` (and a recurrent policy's ``hidden`` and ``done``) of
        the ``[T, N]`` ``rollout``, in a TensorDict of their own (the tensors are shared, not copied), to which
        :meth:`update` adds :attr:`update_keys`.

        Raises:
            KeyError: a key of :attr:`sample_keys` that the rollout lacks.
        """
        return rollout.select(*self.sample_keys, *self._rollout_keys()).clone(False)

    def _example(self, rollout: TensorDict) -> TensorDict:
        """Samples with the keys of every update's (``[T, N]``): :meth:`_samples` of ``rollout`` with
        :attr:`update_keys` added as float32 zeros, in the order the update adds them; what :meth:`compile` traces
        the update's step on."""
        example = self._samples(rollout)
        for key in self.update_keys:
            example.set(key, torch.zeros(example.batch_size, device=example.device))
        return example

    def _rollout_keys(self) -> tuple[str, ...]:
        """The rollout keys a recurrent policy's update replays its sequences with (``hidden``, ``done``); none
        for a feed-forward policy."""
        return ("hidden", "done") if self.recurrent else ()

    @torch.no_grad()
    def _update_kl(self, data: TensorDict, weight: torch.Tensor | None) -> torch.Tensor:
        """Mean KL(rollout policy || current policy) over ``data``'s samples, weighted by ``weight``: a float32 0-d
        tensor (no host read).

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
        return torch.where(count > 0, total / count.clamp_min(1e-30), 0.0)

    def _train_step(self, batch: TensorDict) -> torch.Tensor:
        """One minibatch's optimiser step, the one function an update runs per minibatch (:meth:`compile`
        compiles it whole): the loss (:attr:`minibatch_loss`), its gradients, their mean over the ranks (a
        multi-process run), the clip to ``max_grad_norm``, under ``adaptive_minibatch`` the rate from this
        minibatch's ``approx_kl``, and Adam's step with the rate :attr:`lr`.

        No host read and no Python branch on a tensor: a non-finite loss or gradient norm is recorded on the
        device (``_fault``) and, from that minibatch on, the step moves no parameter (its gradients and rate are
        zeroed); :meth:`_finish_update` reads the record once per update and raises.

        Returns:
            float64 ``[K + 1]``: the minibatch's :attr:`term_names` and ``grad_norm`` (before clipping), also
            added to the update's sums.
        """
        terms = self.minibatch_loss(batch)
        loss = terms["loss"]
        grads = list(torch.autograd.grad(loss, self._params, allow_unused=True))
        grads = [torch.zeros_like(p) if g is None else g for p, g in zip(self._params, grads)]
        world().average_(grads, "the all-reduce of the gradients")  # every rank steps with the ranks' mean
        grad_norm = torch.nn.utils.get_total_norm(grads, foreach=True)
        grads = torch._foreach_mul(grads, (self.cfg.max_grad_norm / (grad_norm + 1e-6)).clamp_max(1.0))
        loss = loss.detach()
        code = torch.where(~torch.isfinite(loss), 1, torch.where(~torch.isfinite(grad_norm), 2, 0))
        first = (self._fault == 0) & (code != 0)
        self._fault_value.copy_(torch.where(first, torch.where(code == 1, loss, grad_norm), self._fault_value))
        self._fault.copy_(torch.where(self._fault == 0, code, self._fault))
        ok = self._fault == 0
        if self.cfg.lr_schedule == "adaptive_minibatch":  # rsl_rl's rule: this step's rate from this minibatch's KL
            self._adapt_lr(world().mean(terms["approx_kl"].detach(), "the all-reduce of the minibatch KL"))
        self._step_lr.copy_(torch.where(ok, self.lr, 0.0))
        grads = [torch.where(ok, g, 0.0) for g in grads]
        with torch.no_grad():
            _adam_step(self.optimizer, self._params, grads, self._adam_state, self._step_lr)
        row = torch.stack([*(terms[name].detach() for name in self.term_names), grad_norm]).double()
        self._totals.add_(row)
        return row

    def _stage(self, flat: TensorDict) -> None:
        """Copy the update's samples ``flat`` (``[B]``) into :attr:`_staged`, whose addresses stay from update to
        update (a new buffer only when the keys or ``B`` change)."""
        staged = self._staged
        if (
            staged is None
            or staged.batch_size != flat.batch_size
            or set(staged.keys(True, True)) != set(flat.keys(True, True))
        ):
            self._staged = flat.clone()
            self._order_buffer = torch.empty(flat.batch_size[0], dtype=torch.int64, device=self.lr.device)
            return
        staged.update_(flat)

    def _indexed_step(self) -> torch.Tensor:
        """:attr:`train_step` on the epoch's next minibatch of the staged samples (row :attr:`_position` of the
        order), the position moved on, on the device: the same call every minibatch, so that it compiles once and
        replays as one CUDA graph."""
        # A copy of the position: the joint graph's backward must not see the position it moves on.
        indices = self._order.index_select(0, self._position.clone()).squeeze(0)
        row = self.train_step(self._staged[indices])
        self._position.add_(1)
        return row

    def _finish_update(self, count: int) -> dict[str, float]:
        """Count the update and read it, once: the means of its terms over its ``count`` minibatches (and the ranks),
        its fault record and whether every parameter is finite.

        Raises:
            NonFiniteError: the first non-finite loss or gradient norm of the update, else a non-finite reported
                term, else a non-finite parameter.
        """
        self.iteration += 1
        means = world().mean(self._totals / count, "the all-reduce of the update's terms")
        params = torch.stack([torch.isfinite(p).all() for p in self._params]).all()
        host = torch.cat([means, torch.stack([self._fault, params]).double(), self._fault_value.double()[None]])
        *values, fault, params_finite, fault_value = host.tolist()
        if fault:
            raise NonFiniteError("loss" if fault == 1 else "grad_norm", fault_value, self.iteration)
        stats = dict(zip((*self.term_names, "grad_norm"), values))
        for name, value in stats.items():
            if not math.isfinite(value):
                raise NonFiniteError(name, value, self.iteration)
        if not params_finite:
            bad = first_non_finite(dict(self.policy.named_parameters()))
            raise NonFiniteError(f"parameter {bad[0]}", bad[1], self.iteration)
        return stats

    def _optimise(
        self,
        data: TensorDict,
        *,
        stop_kl: float | None = None,
        weight: torch.Tensor | None = None,
    ) -> tuple[dict[str, float], int]:
        """Run ``n_epochs`` over seeded minibatches of ``data`` (:meth:`_minibatches`): one :attr:`train_step` per
        minibatch.

        Applies the learning-rate schedule, counts the update, and stops
        training at the first non-finite loss, gradient norm, reported term or
        parameter (read once, at the end: see :meth:`_train_step`). With
        ``stop_kl`` the epochs stop after one whose last minibatch's
        ``approx_kl`` exceeds it (CleanRL's rule: that KL is measured in the
        last minibatch's forward pass, after every earlier step of the epoch;
        an epoch's mean would count the first minibatch's KL, 0 before any
        step, and lag); it is the one option that reads the host once per
        epoch. ``weight`` (float, ``data``'s batch shape, or None) weights the
        samples of the adaptive schedule's ``update_kl`` (:meth:`_update_kl`).

        Returns:
            the mean of every reported term over the minibatches run (plus
            ``grad_norm``, and ``update_kl`` under the adaptive schedule), and
            the number of epochs run.

        Raises:
            NonFiniteError: see :meth:`_finish_update`.
        """
        self._schedule_before_update()
        self._totals.zero_()
        self._fault.zero_()
        kl_column = self.term_names.index("approx_kl") if stop_kl is not None else None
        count, epochs = 0, 0
        if not self.recurrent:
            self._stage(data.reshape(-1))
        for _ in range(self.cfg.n_epochs):
            if self.recurrent:
                for batch in self._minibatches(data):
                    row = self.train_step(batch)
                    count += 1
            else:  # fixed buffers: the order written in place, the step takes its minibatch on the device
                samples = self._staged.batch_size[0]
                self._order = minibatch_order(samples, self.cfg.batch_size, self.generator, out=self._order_buffer)
                self._position.zero_()
                for _ in range(self._order.shape[0]):
                    row = self.indexed_step()
                    count += 1
            epochs += 1
            if stop_kl is not None and float(world().mean(row[kl_column], "the all-reduce of the KL stop")) > stop_kl:
                break
        stats = self._finish_update(count)
        if self.cfg.lr_schedule == "adaptive":
            kl = self._update_kl(data, weight)
            self._adapt_lr(kl)
            stats["update_kl"] = float(kl)
        return stats, epochs

    #: The names of the scalar terms :meth:`_minibatch_loss` reports besides ``loss``, in the order the update
    #: sums them (``approx_kl`` among them).
    term_names: tuple[str, ...] = ("approx_kl",)

    def _minibatch_loss(self, batch: TensorDict) -> dict[str, torch.Tensor]:  # pragma: no cover - abstract
        """``loss`` (minimised) and the scalar terms :attr:`term_names` of one minibatch."""
        raise NotImplementedError

    def compile(self, rollout: TensorDict) -> None:
        """Compile the update's step with ``torch.compile`` (``trainer.compile``) and run it once, so that it is
        compiled before the first update: a feed-forward policy's whole minibatch step (:meth:`_indexed_step`:
        loss, gradients, clip, Adam) with ``fullgraph=True``; a recurrent policy's loss alone (its sequence replay
        reads the host), and in a multi-process run the loss alone (the gradients' all-reduce runs eagerly).

        The example it runs is :meth:`_samples` of ``rollout`` (the collector's ``[T, N]`` storage; its zeros
        before the first rollout do) with the keys :attr:`update_keys` added as zeros: the keys of every update's
        samples, so the first update runs the step compiled here. The parameters, the optimiser's
        state and the rate are restored afterwards: nothing changes.

        Raises:
            Exception: what compiling raises (e.g. torch's ``InductorError`` without a C++ compiler, or dynamo's
                ``Unsupported`` for a loss that does not compile whole).
        """
        example = self._example(rollout)
        if self.recurrent or world().distributed:
            self.compiled_whole = False
            self.minibatch_loss = torch.compile(self._minibatch_loss)
            batch = next(iter(self._minibatches(example, shuffled=False)))
            grads = torch.autograd.grad(self.minibatch_loss(batch)["loss"], self._params, allow_unused=True)
            del grads
            return
        compiled = torch.compile(self._indexed_step, fullgraph=True)

        def indexed_step() -> torch.Tensor:
            with torch._dynamo.config.patch(trace_autograd_ops=True):
                return compiled()

        self.indexed_step = indexed_step
        self.compiled_whole = True
        self._warm_up(example)

    def capture(self) -> None:
        """Replay the compiled :attr:`indexed_step` as one CUDA graph (``trainer.cudagraphs``; after
        :meth:`compile`, a feed-forward policy on CUDA), with tensordict's ``CudaGraphModule``: every tensor it
        keeps across steps (parameters, Adam's state, the rate, the staged samples, the order) has a fixed address,
        and its output is copied out of the graph. The first two calls run it eagerly (warm-up, then capture)."""
        from tensordict.nn import CudaGraphModule  # imported where used: see rlchain.commands.config

        self.indexed_step = CudaGraphModule(self.indexed_step, warmup=2, device=self.lr.device)

    def _warm_up(self, example: TensorDict) -> None:
        """Run :attr:`indexed_step` once on ``example`` (``[T, N]``, the update's keys) and restore what it changed:
        the parameters, the optimiser's state, the rate and the update's sums."""
        kept = [*self._params, *(t for state in self._adam_state for t in state), self.lr]
        saved = [t.detach().clone() for t in kept]
        self._stage(example.reshape(-1))
        self._order = minibatch_order(
            self._staged.batch_size[0], self.cfg.batch_size, torch.Generator(self.lr.device), out=self._order_buffer
        )
        self._position.zero_()
        self.indexed_step()
        with torch.no_grad():
            torch._foreach_copy_(kept, saved)
        self._totals.zero_()
        self._fault.zero_()

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
        self.optimizer.param_groups[0]["lr"] = self.current_lr  # the checkpoint's record of the rate in use
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
        _reinstall_adam_state(self.optimizer, self._params, self._adam_state)
        self._set_lr(self.optimizer.param_groups[0]["lr"])
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


def _init_adam_state(
    optimizer: torch.optim.Adam, params: list[torch.Tensor]
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Create Adam's state of ``params`` now (torch creates it at the first step) and return its tensors
    ``(exp_avg, exp_avg_sq, step)``, one per parameter: a compiled or captured step updates them in place, and
    :func:`_reinstall_adam_state` keeps their addresses across a checkpoint load."""
    for p in params:
        optimizer.state[p].update(
            step=torch.zeros((), dtype=torch.float32, device=p.device),
            exp_avg=torch.zeros_like(p, memory_format=torch.preserve_format),
            exp_avg_sq=torch.zeros_like(p, memory_format=torch.preserve_format),
        )
    return tuple([optimizer.state[p][key] for p in params] for key in ("exp_avg", "exp_avg_sq", "step"))


def _reinstall_adam_state(
    optimizer: torch.optim.Adam, params: list[torch.Tensor], state: tuple[list[torch.Tensor], ...]
) -> None:
    """After ``optimizer.load_state_dict``: copy the loaded state into the tensors of ``state`` and put those
    back in the optimiser, so that their addresses stay those the step was compiled or captured with."""
    with torch.no_grad():
        for key, tensors in zip(("exp_avg", "exp_avg_sq", "step"), state):
            for p, mine in zip(params, tensors):
                loaded = optimizer.state[p].get(key)
                if loaded is None:
                    mine.zero_()
                else:
                    mine.copy_(loaded)
                optimizer.state[p][key] = mine


def _adam_step(
    optimizer: torch.optim.Adam,
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    state: tuple[list[torch.Tensor], ...],
    lr: torch.Tensor,
) -> None:
    """Adam's step (Kingma and Ba 2015) of ``params`` with ``grads`` and the rate ``lr`` (a float32 0-d tensor),
    with ``optimizer``'s hyperparameters and state: torch's fused kernel in eager mode, its foreach form with the
    step count on the device when compiled (torch's fused kernel is not traceable)."""
    group = optimizer.param_groups[0]
    compiling = torch.compiler.is_compiling()
    beta1, beta2 = group["betas"]
    exp_avgs, exp_avg_sqs, steps = state
    adam(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        [],
        steps,
        foreach=compiling,
        fused=not compiling,
        capturable=compiling,
        amsgrad=False,
        beta1=beta1,
        beta2=beta2,
        lr=lr,
        weight_decay=group["weight_decay"],
        eps=group["eps"],
        maximize=False,
    )
