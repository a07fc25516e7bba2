"""The mechanics of an update, shared by every algorithm: minibatches, the train step, Adam, the rate, faults.

An :class:`~rlchain.core.algorithms.base.Algorithm` writes its advantages and its minibatch loss; its
:class:`MinibatchUpdate` does the rest. :meth:`MinibatchUpdate.run` copies the update's samples into buffers of
fixed addresses (the staging), draws each epoch's seeded minibatch order, and runs one train step per minibatch
(loss, gradients, their mean over the ranks, the clip to ``max_grad_norm``, the adaptive rate, Adam's step with a
rate tensor) with no host read: a non-finite loss or gradient norm is a flag on the device, read once per update.
For a feed-forward policy the train step takes its minibatch from the staged samples on the device, so it is one
zero-argument function, :attr:`MinibatchUpdate.step` (a :class:`~rlchain.core.compiling.Step`), that compiles
whole and replays as a CUDA graph; a recurrent policy's update replays whole sequences, cut on the host.

The learning-rate schedule (``constant``, ``linear``, ``adaptive``, ``adaptive_minibatch``) lives here too, as a
float64 0-d tensor the schedules set in place: a compiled or captured step reads the current rate without a
recompile.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.adam import adam

from rlchain.console import notice
from rlchain.core.algorithms.config import ADAPTIVE, AlgorithmConfig
from rlchain.core.buffer import minibatch_order, sequence_minibatches
from rlchain.core.compiling import Step
from rlchain.distributed import world

if TYPE_CHECKING:
    from tensordict import TensorDict

    from rlchain.core.policies import Policy

__all__ = ["MinibatchUpdate", "NonFiniteError", "adapted_lr", "first_non_finite", "update_step"]


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


class MinibatchUpdate:
    """Runs a minibatch loss over ``n_epochs`` of seeded minibatches, one train step each; owns Adam and the rate.

    Args:
        policy: the policy whose trainable parameters it optimises.
        cfg: the algorithm's settings (:class:`~rlchain.core.algorithms.base.AlgorithmConfig`): ``learning_rate``,
            ``lr_schedule``, ``target_kl``, ``total_iterations``, ``n_epochs``, ``batch_size``, ``max_grad_norm``,
            ``seed``, ``seq_len``.
        loss: one minibatch's ``loss`` (minimised) and the scalar terms ``term_names``, 0-d tensors.
        term_names: the terms the update averages over its minibatches (``approx_kl`` among them).
        recurrent: the policy is recurrent: minibatches are whole sequences (:func:`sequence_minibatches`).

    Attributes:
        optimizer: ``torch.optim.Adam`` (Kingma and Ba 2015) over the parameters, its state made at once: its
            ``state_dict`` is the checkpoint's; its step runs inside :meth:`train_step` on its own state tensors.
        lr: the rate in use, float64 0-d on the policy's device.
        generator: the seeded generator of the minibatch order.
        iteration: the updates run (the linear schedule's position; in :class:`NonFiniteError`'s message).
        step: the feed-forward minibatch step (:meth:`_indexed_step`) as a :class:`~rlchain.core.compiling.Step`;
            :func:`update_step` gives it its warm-up.
    """

    def __init__(
        self,
        policy: Policy,
        cfg: AlgorithmConfig,
        loss: Callable[[TensorDict], dict[str, torch.Tensor]],
        term_names: tuple[str, ...],
        recurrent: bool,
    ) -> None:
        self.policy, self.cfg, self.loss, self.term_names, self.recurrent = policy, cfg, loss, term_names, recurrent
        device = next(policy.parameters()).device
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.learning_rate, eps=1e-5, fused=True)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(cfg.seed)
        self.iteration = 0
        self.lr = torch.tensor(cfg.learning_rate, dtype=torch.float64, device=device)
        self._params = [p for p in policy.parameters() if p.requires_grad]
        self._adam_state = _init_adam_state(self.optimizer, self._params)
        self._step_lr = torch.zeros((), dtype=torch.float32, device=device)
        self._totals = torch.zeros(len(term_names) + 1, dtype=torch.float64, device=device)
        """The sums of the update's reported terms and ``grad_norm`` over its minibatches (float64 ``[K + 1]``)."""
        self._fault = torch.zeros((), dtype=torch.int64, device=device)
        """0 while the update's losses and gradient norms are finite; else what went non-finite first (1 the
        loss, 2 the gradient norm), and from then on every later step of the update leaves the parameters as
        they are. Read once, at the update's end."""
        self._fault_value = torch.zeros((), dtype=torch.float32, device=device)
        self.train_step: Callable[[TensorDict], torch.Tensor] = self._train_step
        """One minibatch's optimiser step (:meth:`_train_step`)."""
        self._staged: TensorDict | None = None
        """The update's samples, flat ``[B]``, in a buffer of fixed addresses (a feed-forward policy's update)."""
        self._order = torch.zeros(0, dtype=torch.int64, device=device)
        """This epoch's minibatches as sample indices ``[M, size]`` (:func:`~rlchain.core.buffer.minibatch_order`)."""
        self._order_buffer = torch.zeros(0, dtype=torch.int64, device=device)
        self._position = torch.zeros(1, dtype=torch.int64, device=device)
        """The minibatch of the epoch that the next :meth:`_indexed_step` takes, on the device."""
        self.step: Step = self.make_step(lambda: None, lambda: None, lambda _: None)

    # ---------------------------------------------------------------- the step
    def make_step(
        self, warm_up: Callable[[], Any], snapshot: Callable[[], Any], restore: Callable[[Any], None]
    ) -> Step:
        """The minibatch step (:meth:`_indexed_step`) as a :class:`~rlchain.core.compiling.Step` with this warm-up,
        installed as :attr:`step` (what :meth:`run` calls). Where it cannot compile whole (a recurrent policy's
        sequences are cut on the host; a multi-process run's gradients are averaged eagerly), the loss alone does."""
        blocker = (
            "a recurrent policy's update replays sequences with a host read"
            if self.recurrent
            else "the gradients' all-reduce of a multi-process run runs eagerly"
            if world().distributed
            else None
        )

        def compile_loss(compile_fn: Callable[[Callable], Callable]) -> None:
            self.loss = compile_fn(self.loss)

        self.step = Step(
            "minibatch update",
            self._indexed_step,
            self.lr.device,
            warm_up=warm_up,
            snapshot=snapshot,
            restore=restore,
            blocker=blocker,
            part=compile_loss,
            autograd=True,
        )
        return self.step

    # ------------------------------------------------------------- the update
    def run(
        self, data: TensorDict, *, stop_kl: float | None = None, weight: torch.Tensor | None = None
    ) -> tuple[dict[str, float], int]:
        """Run ``n_epochs`` over seeded minibatches of ``data`` (``[T, N]`` samples), one :attr:`train_step` each.

        Applies the learning-rate schedule, counts the update, and stops
        training at the first non-finite loss, gradient norm, reported term or
        parameter (read once, at the end: see :meth:`_train_step`). With
        ``stop_kl`` the epochs stop after one whose last minibatch's
        ``approx_kl`` exceeds it (CleanRL's rule: that KL is measured in the
        last minibatch's forward pass, after every earlier step of the epoch;
        an epoch's mean would count the first minibatch's KL, 0 before any
        step, and lag); it is the one option that reads the host once per
        epoch. ``weight`` (float, ``data``'s batch shape, or None) weights the
        samples of the adaptive schedule's ``update_kl`` (:meth:`update_kl`).

        Returns:
            the mean of every reported term over the minibatches run (plus
            ``grad_norm``, and ``update_kl`` under the adaptive schedule), and
            the number of epochs run.

        Raises:
            NonFiniteError: see :meth:`_finish`.
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
                for batch in self.minibatches(data):
                    row = self.train_step(batch)
                    count += 1
            else:  # fixed buffers: the order written in place, the step takes its minibatch on the device
                samples = self._staged.batch_size[0]
                self._order = minibatch_order(samples, self.cfg.batch_size, self.generator, out=self._order_buffer)
                self._position.zero_()
                for _ in range(self._order.shape[0]):
                    row = self.step()
                    count += 1
            epochs += 1
            if stop_kl is not None and float(world().mean(row[kl_column], "the all-reduce of the KL stop")) > stop_kl:
                break
        stats = self._finish(count)
        if self.cfg.lr_schedule == "adaptive":
            kl = self.update_kl(data, weight)
            self._adapt_lr(kl)
            stats["update_kl"] = float(kl)
        return stats, epochs

    def _train_step(self, batch: TensorDict) -> torch.Tensor:
        """One minibatch's optimiser step, the one function an update runs per minibatch: the loss
        (:attr:`loss`), its gradients, their mean over the ranks (a multi-process run), the clip to
        ``max_grad_norm``, under ``adaptive_minibatch`` the rate from this minibatch's ``approx_kl``, and Adam's
        step with the rate :attr:`lr`.

        No host read and no Python branch on a tensor: a non-finite loss or gradient norm is recorded on the
        device (``_fault``) and, from that minibatch on, the step moves no parameter (its gradients and rate are
        zeroed); :meth:`_finish` reads the record once per update and raises.

        Returns:
            float64 ``[K + 1]``: the minibatch's :attr:`term_names` and ``grad_norm`` (before clipping), also
            added to the update's sums.
        """
        terms = self.loss(batch)
        loss = terms["loss"]
        grads = list(torch.autograd.grad(loss, self._params, allow_unused=True))
        grads = [_laid_out_as(g, p) for p, g in zip(self._params, grads)]
        world().average_(grads, "the all-reduce of the gradients")  # every rank steps with the ranks' mean
        grads, grad_norm = _clip(grads, self.cfg.max_grad_norm)
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

    def _finish(self, count: int) -> dict[str, float]:
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

    # ------------------------------------------------------------ minibatches
    def seq_len(self, rollout_steps: int) -> int:
        """Steps per training sequence of a recurrent policy: ``seq_len``, or the whole rollout."""
        return self.cfg.seq_len if self.cfg.seq_len is not None else rollout_steps

    def minibatches(self, data: TensorDict, shuffled: bool = True) -> Iterable[TensorDict]:
        """The update's minibatches of a ``[T, N]`` rollout, every sample at most once: for a feed-forward policy
        minibatches of one size (:func:`~rlchain.core.buffer.minibatch_order`: seeded random samples; in order for
        ``shuffled=False``, where the last may be smaller so that every sample counts); for a recurrent policy
        whole sequences ``[seq_len, S]`` (:func:`~rlchain.core.buffer.sequence_minibatches`)."""
        if self.recurrent:
            steps = data.batch_size[0]
            generator = self.generator if shuffled else None
            return sequence_minibatches(data, self.seq_len(steps), self.cfg.batch_size, generator)
        flat = data.reshape(-1)
        if shuffled:
            order = minibatch_order(flat.batch_size[0], self.cfg.batch_size, self.generator)
            return (flat[indices] for indices in order.to(flat.device))
        return (
            flat[start : start + self.cfg.batch_size] for start in range(0, flat.batch_size[0], self.cfg.batch_size)
        )

    @torch.no_grad()
    def update_kl(self, data: TensorDict, weight: torch.Tensor | None) -> torch.Tensor:
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
        for chunk in self.minibatches(data, shuffled=False):
            log_ratio = self.policy.evaluate_actions(chunk)["sample_log_prob"] - chunk["sample_log_prob"]
            total += ((torch.expm1(log_ratio) - log_ratio) * chunk["kl_weight"]).sum()
        total, count = world().sum(torch.stack([total, weight.sum()]), "the all-reduce of update_kl")
        return torch.where(count > 0, total / count.clamp_min(1e-30), 0.0)

    # ---------------------------------------------------------- the schedule
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
        """:func:`adapted_lr` of :attr:`lr` on ``kl`` (a 0-d tensor: an update's ``update_kl`` or a minibatch's
        ``approx_kl``) and ``target_kl``, written into :attr:`lr` (no host read)."""
        self.lr.copy_(adapted_lr(self.lr, kl, self.cfg.target_kl))

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Optimiser, schedule (the configured ``learning_rate`` too) and minibatch generator state."""
        self.optimizer.param_groups[0]["lr"] = self.current_lr  # the checkpoint's record of the rate in use
        return {
            "optimizer": self.optimizer.state_dict(),
            "iteration": self.iteration,
            "generator": self.generator.get_state(),
            "learning_rate": self.cfg.learning_rate,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output into the same tensors. The rate: the config's under ``constant`` and
        ``linear``, the checkpoint's under the adaptive ones, with one line where the two differ."""
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


def adapted_lr(lr: torch.Tensor, kl: torch.Tensor, target: float | torch.Tensor) -> torch.Tensor:
    """rsl_rl's adaptive rule: ``lr`` (a tensor of rates) divided by 1.5 where ``kl`` exceeds ``2 * target``,
    multiplied by 1.5 where it lies in ``(0, target / 2)``, clamped to [1e-5, 1e-2], else as it is; a NaN KL, or a
    KL of 0 (nothing moved yet: rsl_rl's guard), leaves it. Elementwise (``lr``, ``kl`` and ``target``
    broadcast), in tensor operations: no host read."""
    down = (lr / 1.5).clamp_min(1e-5)
    up = (lr * 1.5).clamp_max(1e-2)
    return torch.where(kl > 2.0 * target, down, torch.where((kl > 0.0) & (kl < target / 2.0), up, lr))


def update_step(algorithm: Any, rollout: TensorDict) -> Step:
    """``algorithm``'s (an :class:`~rlchain.core.algorithms.base.Algorithm`) minibatch update as the :class:`~rlchain.core.compiling.Step` that ``trainer.compile``
    compiles and ``trainer.cudagraphs`` captures, warmed up by one ``algorithm.update(rollout)`` (the collector's
    ``[T, N]`` storage; its zeros before the first rollout do): the update's own samples, whatever their keys, so
    the first real update runs the step compiled here. What the warm-up changed (parameters, optimiser, schedule,
    generator, statistics) is put back from the algorithm's ``state_dict`` and ``rank_state_dict`` and the
    policy's, the same states a checkpoint saves."""
    import copy

    def snapshot() -> tuple[dict[str, Any], ...]:
        return copy.deepcopy((algorithm.policy.state_dict(), algorithm.state_dict(), algorithm.rank_state_dict()))

    def restore(saved: tuple[dict[str, Any], ...]) -> None:
        policy, state, rank = saved
        algorithm.policy.load_state_dict(policy)
        algorithm.load_state_dict(state)
        algorithm.load_rank_state_dict(rank)

    return algorithm.updater.make_step(lambda: algorithm.update(rollout), snapshot, restore)


def _clip(grads: list[torch.Tensor], max_norm: float) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``grads`` scaled to a total L2 norm of at most ``max_norm``, and their norm before (0-d): torch's foreach
    kernels in eager mode, one op per tensor when compiled (a foreach op in a compiled step is what inductor's
    Triton backend failed to generate; see :mod:`rlchain.core.compiling`)."""
    if torch.compiler.is_compiling():
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        scale = (max_norm / (norm + 1e-6)).clamp_max(1.0)
        return [g * scale for g in grads], norm
    norm = torch.nn.utils.get_total_norm(grads, foreach=True)
    return torch._foreach_mul(grads, (max_norm / (norm + 1e-6)).clamp_max(1.0)), norm


def _laid_out_as(grad: torch.Tensor | None, param: torch.Tensor) -> torch.Tensor:
    """``param``'s gradient in ``param``'s memory layout (zeros where it has none).

    ``torch.autograd.grad`` hands a gradient back in the layout its backward made: a convolution of a
    channels-last image (a camera's ``[H, W, C]``, permuted for the CNN) gives channels-last weight gradients.
    torch's fused Adam reads a gradient's storage in its parameter's order (``.grad`` is laid out as its parameter
    by autograd's accumulation; this path does not go through it), so such a gradient would move every weight by
    another weight's step.
    """
    if grad is None:
        return torch.zeros_like(param)
    if grad.stride() == param.stride():
        return grad
    return torch.empty_like(param).copy_(grad)


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
    with ``optimizer``'s hyperparameters and state: torch's fused kernel in eager mode; compiled, its
    single-tensor form with the step count on the device (the fused kernel is not traceable, and the foreach
    form is a foreach op: see :func:`_clip`)."""
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
        foreach=False,
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
