"""The mechanics of an update, shared by every algorithm and by populations: minibatches, the train step, Adam,
the rate, faults.

An :class:`~rlchain.core.algorithms.base.Algorithm` writes its advantages and its minibatch loss; its
:class:`MinibatchUpdate` does the rest. :meth:`MinibatchUpdate.run` copies the update's samples into buffers of
fixed addresses (the staging), draws each epoch's seeded minibatch order, and runs one train step per minibatch
(loss, gradients, their mean over the ranks, the clip to ``max_grad_norm``, the adaptive rate, Adam's step with a
rate tensor) with no host read: a non-finite loss or gradient norm is a flag on the device, read once per update.
For a feed-forward policy the train step takes its minibatch from the staged samples on the device, so it is one
zero-argument function, :attr:`MinibatchUpdate.step` (a :class:`~rlchain.core.compiling.Step`), that compiles
whole and replays as a CUDA graph; a recurrent policy's update replays whole sequences, cut on the host.

A solo run is a population of one: the same class, with its state ``[1]``, trains a population's ``P`` members
(:class:`~rlchain.core.population.Population`), each with its own Adam state, rate, clip, schedule and faults.

The learning-rate schedule (``constant``, ``linear``, ``adaptive``, ``adaptive_minibatch``) lives here too, as a
float64 tensor the schedules set in place: a compiled or captured step reads the current rate without a
recompile.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch

from rlchain.console import notice
from rlchain.core.algorithms.config import ADAPTIVE, AlgorithmConfig
from rlchain.core.buffer import minibatch_order, sequence_minibatches
from rlchain.core.compiling import Step
from rlchain.distributed import world
from rlchain.settings import SettingError

if TYPE_CHECKING:
    from tensordict import TensorDict

    from rlchain.core.policies import Policy

__all__ = [
    "ADAM_BETAS",
    "ADAM_EPS",
    "MinibatchUpdate",
    "NonFiniteError",
    "adapted_lr",
    "first_non_finite",
    "update_step",
]

#: Adam's moment decay rates (``torch.optim.Adam``'s defaults) and its epsilon (rsl_rl's and CleanRL's 1e-5).
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-5


class NonFiniteError(FloatingPointError):
    """A training quantity (loss, gradient norm, KL, parameter) became NaN or infinite.

    Attributes:
        metric: what went non-finite, e.g. ``"loss"``, ``"grad_norm"``,
            ``"approx_kl"`` or ``"parameter actor.0.weight"``.
        value: its value (a float; for a parameter, its first non-finite entry).
        update: the update it happened in (counted from 1).
    """

    def __init__(self, metric: str, value: float, update: int) -> None:
        self.metric, self.value, self.update = metric, value, update
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

    One code path for a solo run and a population (:class:`~rlchain.core.population.Population`): a solo run is a
    population of one. Every tensor of the update's state has a leading member dimension ``P``: 1 for a solo run
    (``members=None``: its parameters and its loss's 0-d terms are its own), ``P`` for a population, whose
    parameters are stacked ``[P, ...]`` and whose loss gives ``[P]`` terms (its members' own code under
    :func:`torch.vmap`). What stops a member (a KL stop, a non-finite loss or gradient norm) is a mask on its
    steps, not a ``break``; the epochs stop where every member has stopped. (A 0-d float64 state tensor would not
    do: torch 2.13's ``torch.compile`` drops in-place writes to one on the CPU.)

    Args:
        policy: the policy whose trainable parameters it optimises (a population's
            :class:`~rlchain.core.population.PopulationPolicy`).
        cfg: the algorithm's settings (:class:`~rlchain.core.algorithms.base.AlgorithmConfig`): ``learning_rate``,
            ``lr_schedule``, ``target_kl``, ``total_iterations``, ``n_epochs``, ``batch_size``, ``max_grad_norm``,
            ``seed``, ``seq_len`` (a population's: its first member's).
        loss: one minibatch's ``loss`` (minimised) and the terms ``term_names``, each ``[P]`` (a solo run's 0-d).
        term_names: the terms the update averages over its minibatches (``approx_kl`` among them).
        recurrent: the policy is recurrent: minibatches are whole sequences (:func:`sequence_minibatches`; a solo
            run's only).
        members: None for a solo run; ``P`` for a population.
        params: a population's stacked ``[P, ...]`` parameters (None: ``policy``'s trainable parameters).
        varying: a population's settings that differ between its members, name -> float32 ``[P]``
            (:class:`~rlchain.core.population.Scalars`); the others are read from ``cfg``.
        generators: a population's members' minibatch generators, one each (None: one seeded from ``cfg.seed``).

    Raises:
        SettingError: ``lr_schedule='adaptive_minibatch'`` where ``term_names`` has no ``approx_kl``.

    Attributes:
        optimizer: a solo run's ``torch.optim.Adam``: its ``state_dict`` is the checkpoint's; its state tensors
            are views of the flat moments this class steps (:meth:`_adam_step`). None for a population.
        lr: float64 ``[P]``: the rate in use.
        updates: float64 ``[P]``: the updates run (the linear schedule's position; in
            :class:`NonFiniteError`'s message).
        stopped: bool ``[P]``: members stopped for good (:meth:`stop`); their steps move nothing.
        generator: a solo run's seeded generator of the minibatch order (``generators[0]``).
        step: the feed-forward minibatch step (:meth:`_indexed_step`) as a :class:`~rlchain.core.compiling.Step`;
            :func:`update_step` gives it its warm-up.
    """

    def __init__(
        self,
        policy: Policy,
        cfg: AlgorithmConfig,
        loss: Callable[[Any], dict[str, torch.Tensor]],
        term_names: tuple[str, ...],
        recurrent: bool,
        *,
        members: int | None = None,
        params: list[torch.Tensor] | None = None,
        varying: dict[str, torch.Tensor] | None = None,
        generators: list[torch.Generator] | None = None,
    ) -> None:
        self.policy, self.cfg, self.loss, self.term_names, self.recurrent = policy, cfg, loss, term_names, recurrent
        if cfg.lr_schedule == "adaptive_minibatch" and "approx_kl" not in term_names:
            raise SettingError(
                "lr_schedule",
                cfg.lr_schedule,
                f" needs each minibatch's approx_kl, which this algorithm does not report (its terms: "
                f"{', '.join(term_names)}); expected 'constant', 'linear' or 'adaptive'",
            )
        self.members, self.varying = members, dict(varying or {})
        shape = self._shape = (1,) if members is None else (members,)
        self._params = params if params is not None else [p for p in policy.parameters() if p.requires_grad]
        device = self._params[0].device
        self._sizes = [p.numel() // shape[0] for p in self._params]  # a solo run's parameters have no member dim
        # Adam's moments, each one flat [P, D] buffer (one set of ops per step for every parameter), and per
        # parameter views of it shaped as the parameter.
        self._exp_avg_flat = torch.zeros(*shape, sum(self._sizes), device=device)
        self._exp_avg_sq_flat = torch.zeros_like(self._exp_avg_flat)
        self._exp_avg = self._per_parameter(self._exp_avg_flat)
        self._exp_avg_sq = self._per_parameter(self._exp_avg_sq_flat)
        self._adam_steps = torch.zeros(shape, dtype=torch.float32, device=device)
        self.optimizer: torch.optim.Adam | None = None
        if members is None:
            # Every parameter, as the checkpoint's group has always held (a frozen one without state).
            self.optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.learning_rate, betas=ADAM_BETAS, eps=ADAM_EPS)
            for p, m, v in zip(self._params, self._exp_avg, self._exp_avg_sq):
                self.optimizer.state[p].update(step=self._adam_steps[0], exp_avg=m, exp_avg_sq=v)
            generator = torch.Generator(device=device)
            generator.manual_seed(cfg.seed)
            generators = [generator]
        self.generators = list(generators)
        self.generator = self.generators[0]
        self.lr = torch.zeros(shape, dtype=torch.float64, device=device)
        self.lr.copy_(torch.as_tensor(self._setting("learning_rate"), dtype=torch.float64))
        self.updates = torch.zeros(shape, dtype=torch.float64, device=device)
        self.stopped = torch.zeros(shape, dtype=torch.bool, device=device)
        self._stopped = [False] * (members or 1)  # the host's copy of :attr:`stopped`
        # The update's fixed buffers (what a compiled or captured step reads and writes in place): the members
        # still stepping, their fault records (0 while finite; else 1 the loss, 2 the gradient norm went
        # non-finite first, and from then on that member moves nothing; read once, at the update's end), the sums
        # of their terms and grad_norm, the minibatches counted, the epochs run and the last minibatch's KL.
        self._running = torch.zeros(shape, dtype=torch.bool, device=device)
        self._fault = torch.zeros(shape, dtype=torch.int64, device=device)
        self._fault_value = torch.zeros(shape, dtype=torch.float32, device=device)
        self._totals = torch.zeros(*shape, len(term_names) + 1, dtype=torch.float64, device=device)
        self._counts = torch.zeros(shape, dtype=torch.float64, device=device)
        self._epochs_run = torch.zeros(shape, dtype=torch.float64, device=device)
        self._last_kl = torch.zeros(shape, dtype=torch.float32, device=device)
        self.train_step: Callable[[Any], torch.Tensor] = self._train_step
        """One minibatch's optimiser step (:meth:`_train_step`)."""
        self._staged: Any = None
        """The update's samples in buffers of fixed addresses: a solo run's flat ``[B]`` TensorDict, a population's
        dict of ``[P, B, ...]`` tensors (a feed-forward policy's update)."""
        self._samples = 0
        self._order_buffer = torch.zeros(*shape, 0, dtype=torch.int64, device=device)
        self._order = torch.zeros(*shape, 0, 0, dtype=torch.int64, device=device)
        """This epoch's minibatches as sample indices ``[P, M, size]`` (:func:`~rlchain.core.buffer.minibatch_order`,
        each member's from its own generator), a view of ``_order_buffer``."""
        self._position = torch.zeros(1, dtype=torch.int64, device=device)
        """The minibatch of the epoch that the next :meth:`_indexed_step` takes, on the device."""
        self._rows = torch.arange(shape[0], device=device)[:, None]  # a population's staged samples' member rows
        self.step: Step = self.make_step(lambda: None, lambda: None, lambda _: None)

    def _setting(self, name: str) -> float | torch.Tensor:
        """Setting ``name``: a population's float32 ``[P]`` where its members differ, else the config's value."""
        return self.varying.get(name, getattr(self.cfg, name))

    def _per_parameter(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """A flat ``[P, D]`` tensor as views shaped as the parameters."""
        return [part.view(p.shape) for part, p in zip(flat.split(self._sizes, -1), self._params)]

    def member_state(self) -> tuple[torch.Tensor, ...]:
        """The tensors that hold each member's own optimiser state, each ``[P, ...]``: Adam's flat moments and step
        counts, the rates and the update counts (what a population's member takes from, and gives back to, its solo
        run's updater)."""
        return self._exp_avg_flat, self._exp_avg_sq_flat, self._adam_steps, self.lr, self.updates

    @property
    def iteration(self) -> int:
        """A solo run's updates run (a host read of :attr:`updates`)."""
        return int(self.updates)

    def stop(self, member: int) -> None:
        """Stop population member ``member`` for good: its steps move nothing from now on (no recompile)."""
        self.stopped[member] = True
        self._stopped[member] = True

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
        """A solo run's update: ``n_epochs`` over seeded minibatches of ``data`` (``[T, N]`` samples), one
        :attr:`train_step` each (:meth:`run_members`).

        With ``stop_kl`` the epochs stop after one whose last minibatch's ``approx_kl`` exceeds it (CleanRL's rule:
        that KL is measured in the last minibatch's forward pass, after every earlier step of the epoch; an
        epoch's mean would count the first minibatch's KL, 0 before any step, and lag); it is the one option that
        reads the host once per epoch. ``weight`` (float, ``data``'s batch shape, or None) weights the samples of
        the adaptive schedule's ``update_kl`` (:meth:`update_kl`).

        Returns:
            the mean of every reported term over the minibatches run (plus ``grad_norm``, and ``update_kl`` under
            the adaptive schedule), and the number of epochs run.

        Raises:
            NonFiniteError: the first non-finite loss or gradient norm of the update, else a non-finite reported
                term, else a non-finite parameter (named).
            ValueError: a ``stop_kl`` where the loss reports no ``approx_kl``.
        """
        samples = data if self.recurrent else data.reshape(-1)
        [(stats, epochs, error)] = self.run_members(samples, stop_kl, lambda: self.update_kl(data, weight))
        if error is not None:
            if error.metric == "parameter":
                bad = first_non_finite(dict(self.policy.named_parameters()))
                error = NonFiniteError(f"parameter {bad[0]}", bad[1], error.update)
            raise error
        return stats, int(epochs)

    def run_members(
        self,
        samples: Any,
        stop_kl: float | torch.Tensor | None,
        update_kl: Callable[[], torch.Tensor],
    ) -> list[tuple[dict[str, float], float, NonFiniteError | None]]:
        """One update of every member not stopped: the schedule, ``n_epochs`` of each member's own seeded
        minibatches (a stopped member's generator stays where it stopped, as its solo run's does), one
        :attr:`step` each, the KL stop at ``stop_kl`` (a float, or ``[P]``) per member, under the adaptive schedule
        each member's rate from its ``update_kl()`` (``[P]``); then one host read.

        Args:
            samples: a solo run's ``[B]`` TensorDict (a recurrent policy's ``[T, N]``); a population's dict of
                ``[P, B, ...]`` tensors, keys flat (``obs.<group>``).

        Returns:
            per member: the means of its terms over the minibatches it ran and ``grad_norm`` (and ``update_kl``
            under the adaptive schedule), its epochs run, and its :class:`NonFiniteError` (a ``parameter`` one not
            named) or None.
        """
        if stop_kl is not None and "approx_kl" not in self.term_names:
            raise ValueError(f"a KL stop needs each minibatch's approx_kl; this loss reports {self.term_names}")
        self._schedule_before_update()
        for buffer in (self._totals, self._counts, self._epochs_run, self._fault, self._fault_value):
            buffer.zero_()
        active = ~self.stopped
        self._running.copy_(active)
        going = [not stopped for stopped in self._stopped]
        if not self.recurrent:
            self._stage(samples)
        for epoch in range(self.cfg.n_epochs):
            if stop_kl is not None and epoch:
                going = self._running.reshape(-1).tolist()  # the KL stop's one read per epoch
            if not any(going):
                break
            if self.recurrent:
                for batch in self.minibatches(samples):
                    self.train_step(batch)
            else:  # fixed buffers: each order written in place, the step takes its minibatch on the device
                for row, generator, go in zip(self._order_buffer, self.generators, going):
                    if go:
                        minibatch_order(self._samples, self.cfg.batch_size, generator, out=row)
                self._position.zero_()
                for _ in range(self._order.shape[-2]):
                    self.step()
            self._epochs_run += self._running.double()
            if stop_kl is not None:
                kl = world().mean(self._last_kl, "the all-reduce of the KL stop")
                self._running &= ~(kl > stop_kl)
        if self.cfg.lr_schedule == "adaptive":
            kl = update_kl()
            self._adapt_lr(kl, active & (self._fault == 0))
        else:
            kl = None
        self.updates.add_(1)
        return self._finish(kl)

    def _train_step(self, batch: Any) -> torch.Tensor:
        """One minibatch's optimiser step of every member whose ``_running`` is set, the one function an update
        runs per minibatch: the loss (:attr:`loss`), its gradients, their mean over the ranks (a multi-process
        run), each member's clip by its own norm to its ``max_grad_norm``, under ``adaptive_minibatch`` its rate
        from this minibatch's ``approx_kl``, and Adam's step with the rate :attr:`lr`.

        No host read and no Python branch on a tensor: a non-finite loss or gradient norm is recorded on the
        device (``_fault``) and, from that minibatch on, that member moves no parameter; :meth:`_finish` reads the
        record once per update.

        Returns:
            float64 ``[P, K + 1]``: the minibatch's :attr:`term_names` and ``grad_norm`` (before clipping), also
            added to the update's sums.
        """
        shape, running = self._shape, self._running
        terms = self.loss(batch)
        if self.members is None:  # a solo run's 0-d terms, as a population of one's
            terms = {name: value.reshape(shape) for name, value in terms.items()}
        loss = terms["loss"]
        grads = torch.autograd.grad(loss.sum(), self._params, allow_unused=True)
        # [P, D]; a reshape reads each gradient in its logical order, whatever its layout (a convolution of a
        # channels-last image gives channels-last weight gradients).
        flat = torch.cat(
            [
                p.new_zeros(*shape, n) if g is None else g.reshape(*shape, n)
                for p, g, n in zip(self._params, grads, self._sizes)
            ],
            -1,
        )
        world().average_([flat], "the all-reduce of the gradients")  # every rank steps with the ranks' mean
        grad_norm = torch.linalg.vector_norm(flat, dim=-1)
        scale = (self._setting("max_grad_norm") / (grad_norm + 1e-6)).clamp_max(1.0)
        loss = loss.detach()
        code = torch.where(~torch.isfinite(loss), 1, torch.where(~torch.isfinite(grad_norm), 2, 0))
        code = torch.where(running, code, 0)
        fault, fault_value = self._fault, self._fault_value
        first = (fault == 0) & (code != 0)
        fault_value.copy_(torch.where(first, torch.where(code == 1, loss, grad_norm), fault_value))
        fault.copy_(torch.where(fault == 0, code, fault))
        ok = running & (fault == 0)
        kl = terms["approx_kl"].detach() if "approx_kl" in terms else None  # an algorithm may report none
        if self.cfg.lr_schedule == "adaptive_minibatch":  # rsl_rl's rule: this step's rate from this minibatch's KL
            self._adapt_lr(world().mean(kl, "the all-reduce of the minibatch KL"), ok)
        self._adam_step(flat, scale, ok)
        row = torch.stack([*(terms[name].detach() for name in self.term_names), grad_norm], -1).double()
        self._totals.add_(torch.where(running[..., None], row, 0.0))
        self._counts.add_(running.double())
        if kl is not None:
            self._last_kl.copy_(kl)
        return row

    @torch.no_grad()
    def _adam_step(self, grads: torch.Tensor, scale: torch.Tensor, ok: torch.Tensor) -> None:
        """Adam (Kingma and Ba 2015; ``torch.optim.Adam``'s formula with :data:`ADAM_BETAS` and :data:`ADAM_EPS`)
        of each member whose ``ok`` is set, on its flat gradient ``grads`` (``[P, D]``) times its clip ``scale``,
        with its rate :attr:`lr`; the others' weights and moments stay. One set of ops on the flat moments for
        every parameter, then the subtraction from each parameter (one ``foreach`` op eager, one op each
        compiled: a foreach op in a compiled step is what inductor's Triton backend failed to generate; see
        :mod:`rlchain.core.compiling`)."""
        (beta1, beta2), eps = ADAM_BETAS, ADAM_EPS
        on = ok.float()
        self._adam_steps.add_(on)
        bias1 = 1 - beta1**self._adam_steps
        bias2_sqrt = (1 - beta2**self._adam_steps).sqrt()
        # Per member: the moments' weights and the step are 0 where it does not step (its state stays as it is).
        w1, w2 = ((1 - beta1) * on)[..., None], ((1 - beta2) * on)[..., None]
        step_size = torch.where(ok, self.lr.float() / bias1.clamp_min(1e-30), 0.0)[..., None]
        g = torch.where(ok[..., None], grads * scale[..., None], 0.0)  # a stopped member's NaN stays out
        m, v = self._exp_avg_flat, self._exp_avg_sq_flat
        m.lerp_(g, w1)
        v.mul_(1 - w2).addcmul_(g, g * w2)
        denom = (v.sqrt() / bias2_sqrt[..., None]).add_(eps)
        steps = self._per_parameter(step_size * m / denom)
        if torch.compiler.is_compiling():
            for param, step in zip(self._params, steps):
                param.sub_(step)
        else:
            torch._foreach_sub_(self._params, steps)

    def _stage(self, samples: Any) -> None:
        """Copy the update's samples (a solo run's ``[B]`` TensorDict, a population's dict of ``[P, B, ...]``)
        into :attr:`_staged`, whose addresses stay from update to update (new buffers, with the minibatch order's,
        only where the keys or shapes change)."""
        staged = self._staged
        if self.members is None:
            fresh = (
                staged is None
                or staged.batch_size != samples.batch_size
                or set(staged.keys(True, True)) != set(samples.keys(True, True))
            )
            count = samples.batch_size[0]
        else:
            fresh = (
                staged is None
                or staged.keys() != samples.keys()
                or any(staged[k].shape != v.shape for k, v in samples.items())
            )
            count = next(iter(samples.values())).shape[1]
        if not fresh:
            if self.members is None:
                staged.update_(samples)
            else:
                for key, value in samples.items():
                    staged[key].copy_(value)
            return
        self._staged = samples.clone() if self.members is None else {k: v.clone() for k, v in samples.items()}
        self._samples = count
        size = min(self.cfg.batch_size, count)
        self._order_buffer = torch.zeros(*self._shape, count, dtype=torch.int64, device=self.lr.device)
        self._order = self._order_buffer[..., : count // size * size].unflatten(-1, (-1, size))

    def _indexed_step(self) -> torch.Tensor:
        """:attr:`train_step` on the epoch's next minibatch of the staged samples (each member's at
        :attr:`_position` of its order), the position moved on, on the device: the same call every minibatch,
        so that it compiles once and replays as one CUDA graph."""
        # A copy of the position: the joint graph's backward must not see the position it moves on.
        indices = self._order.index_select(1, self._position.clone()).squeeze(1)  # [P, size]
        if self.members is None:
            batch = self._staged[indices[0]]
        else:
            batch = {k: v[self._rows, indices] for k, v in self._staged.items()}
        row = self.train_step(batch)
        self._position.add_(1)
        return row

    def _finish(self, update_kl: torch.Tensor | None) -> list[tuple[dict[str, float], float, NonFiniteError | None]]:
        """Read the update once: each member's means of its terms over its minibatches (and the ranks), its epochs,
        its fault record, whether its parameters are finite and its count; see :meth:`run_members`."""
        shape = self._shape
        finite = torch.stack([torch.isfinite(p.reshape(*shape, -1)).all(-1) for p in self._params]).all(0)
        means = world().mean(
            self._totals / self._counts.clamp_min(1.0)[..., None], "the all-reduce of the update's terms"
        )
        columns = [means, self._epochs_run[..., None], self._fault[..., None].double()]
        columns += [self._fault_value[..., None].double(), finite[..., None].double(), self.updates[..., None]]
        if update_kl is not None:
            columns.append(update_kl.double().reshape(*shape, 1))
        host = torch.cat(columns, -1).reshape(-1, means.shape[-1] + len(columns) - 1).tolist()
        names = (*self.term_names, "grad_norm")
        out = []
        for row in host:
            values, (epochs, fault, fault_value, params_finite, updates, *kl) = row[: len(names)], row[len(names) :]
            stats = dict(zip(names, values))
            update, error = int(updates), None
            if fault:
                error = NonFiniteError("loss" if fault == 1 else "grad_norm", fault_value, update)
            elif not all(math.isfinite(v) for v in values):
                name = next(n for n, v in stats.items() if not math.isfinite(v))
                error = NonFiniteError(name, stats[name], update)
            elif not params_finite:
                error = NonFiniteError("parameter", math.nan, update)
            if kl:
                stats["update_kl"] = kl[0]
            out.append((stats, epochs, error))
        return out

    # ------------------------------------------------------------ minibatches
    def seq_len(self, rollout_steps: int) -> int:
        """Steps per training sequence of a recurrent policy: ``seq_len``, or the whole rollout."""
        return self.cfg.seq_len if self.cfg.seq_len is not None else rollout_steps

    def minibatches(self, data: TensorDict, shuffled: bool = True) -> Iterable[TensorDict]:
        """A solo run's minibatches of a ``[T, N]`` rollout, every sample at most once: for a feed-forward policy
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
        """A solo run's mean KL(rollout policy || current policy) over ``data``'s samples, weighted by ``weight``:
        a float32 0-d tensor (no host read).

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
        """A solo run's learning rate in use (a host read of :attr:`lr`)."""
        return float(self.lr)

    def _schedule_before_update(self) -> None:
        """The rate of the update about to run under ``constant`` and ``linear`` (decay to 0 over
        ``total_iterations`` updates); the adaptive schedules keep theirs."""
        if self.cfg.lr_schedule in ADAPTIVE:
            return
        base = self._setting("learning_rate")
        if self.cfg.lr_schedule == "linear":
            base = base * (1.0 - self.updates / self._setting("total_iterations")).clamp_min(0.0)
        if isinstance(base, torch.Tensor):
            self.lr.copy_(base)
        else:
            self.lr.fill_(base)

    def _adapt_lr(self, kl: torch.Tensor, mask: torch.Tensor) -> None:
        """:func:`adapted_lr` of :attr:`lr` on ``kl`` (``[P]``: an update's ``update_kl`` or a minibatch's
        ``approx_kl``) and ``target_kl``, written into :attr:`lr` where ``mask`` is set (no host read)."""
        new = adapted_lr(self.lr, kl, self._setting("target_kl"))
        self.lr.copy_(torch.where(mask, new, self.lr))

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """A solo run's optimiser (``torch.optim.Adam``'s format), schedule (the configured ``learning_rate``
        too) and minibatch generator state."""
        self.optimizer.param_groups[0]["lr"] = self.current_lr  # the checkpoint's record of the rate in use
        optimizer = self.optimizer.state_dict()
        # torch's format: a step count per parameter (here one tensor for all, which a plain torch.optim.Adam that
        # loaded the file would count once per parameter at each step).
        optimizer["state"] = {i: {**state, "step": state["step"].clone()} for i, state in optimizer["state"].items()}
        return {
            "optimizer": optimizer,
            "iteration": self.iteration,
            "generator": self.generator.get_state(),
            "learning_rate": self.cfg.learning_rate,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output into the same tensors. The rate: the config's under ``constant`` and
        ``linear``, the checkpoint's under the adaptive ones, with one line where the two differ."""
        self.optimizer.load_state_dict(state["optimizer"])
        _reinstall_adam_state(self.optimizer, self._params, (self._exp_avg, self._exp_avg_sq, self._adam_steps[0]))
        self.lr.fill_(self.optimizer.param_groups[0]["lr"])
        self.updates.fill_(state["iteration"])
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
        self._schedule_before_update()
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


def _reinstall_adam_state(
    optimizer: torch.optim.Adam,
    params: list[torch.Tensor],
    state: tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor],
) -> None:
    """After ``optimizer.load_state_dict``: copy the loaded state into the tensors of ``state`` (the views of the
    flat moments, per parameter, and the one step count) and put those back in the optimiser, so that their
    addresses stay those the step was compiled or captured with. The step count is the largest of the loaded
    parameters' (an older checkpoint may hold no state for a parameter that had no gradient yet: its moments
    start at 0); 0 where none has state."""
    exp_avgs, exp_avg_sqs, step = state
    with torch.no_grad():
        loaded_steps = [optimizer.state[p]["step"] for p in params if "step" in optimizer.state[p]]
        if loaded_steps:
            step.copy_(torch.stack([s.reshape(()).float() for s in loaded_steps]).max())
        else:
            step.zero_()
        for p, exp_avg, exp_avg_sq in zip(params, exp_avgs, exp_avg_sqs):
            loaded = optimizer.state[p]
            for key, mine in (("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
                if key in loaded:
                    mine.copy_(loaded[key])
                else:
                    mine.zero_()
            optimizer.state[p].update(step=step, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq)
