"""Populations: ``P`` runs of one shape trained as one batched computation, each member still a run of its own.

A population takes ``P`` ordinary runs' parts that differ only in numbers (seeds, learning rates, loss
coefficients, ``gamma``, ...): their policies (one architecture), their algorithms (one class, one shape) and one
torch-native task of ``P * N`` envs (:meth:`~rlchain.core.envs.base.TorchVecEnv.split_into_members`: member ``p``
owns envs ``[p * N, (p + 1) * N)`` and draws their episodes from its own seed's stream). The members' weights
are stacked (:func:`torch.func.stack_module_state`: ``[P, out, in]`` per layer) and every forward pass is the
members' own policy code under :func:`torch.vmap`, so a collection step or a minibatch update is one set of
kernels whatever ``P`` (batched matrix products: Shazeer-style ensembles, PureJaxRL's vmapped training).

What makes member ``p`` exactly the run it would be alone:

* its initial weights are its own policy's (built from its seed, as a solo run builds them);
* its env episodes come from its seed's stream (:class:`~rlchain.core.envs.rng.CounterRng`), its action noise
  from its policy's stream (:meth:`~rlchain.core.policies.ActorCritic.seed_actions`);
* its advantages and its minibatch loss are its algorithm's own code, run on its ``[T, N]`` slice of the rollout
  with its own numbers (:class:`Scalars`: the settings that differ become ``[P]`` tensors, vmapped);
* its minibatch order comes from its algorithm's own seeded generator; its gradients are clipped by its own norm;
  its Adam state, step count and learning rate are its own (Kingma and Ba 2015, as ``torch.optim.Adam``); its
  observation normaliser is its own;
* what stops one member (a KL stop, a non-finite loss or gradient norm) is a mask on its steps, not a ``break``:
  the others go on.

:class:`Population` is the engine: :attr:`Population.policy` is what the collector acts with
(:class:`~rlchain.core.collector.SyncCollector` unchanged, on the ``P * N`` envs), :meth:`Population.update`
learns from its ``[T, P * N]`` rollout through a solo run's own update mechanics
(:class:`~rlchain.core.algorithms.update.MinibatchUpdate` with ``P`` members: a solo run is its population of
one), and :meth:`Population.write_back` puts member ``p``'s weights into its own
policy module, whose ``state_dict`` is an ordinary single-policy checkpoint. Its minibatch step
(:attr:`Population.step`) and the collector's collection step are each a :class:`~rlchain.core.compiling.Step` over
fixed buffers: ``trainer.compile`` compiles each whole, as a solo run's, and a member's stop stays a mask (no
recompile).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from rlchain.core.algorithms.functional import compute_gae
from rlchain.core.algorithms.update import MinibatchUpdate
from rlchain.core.compiling import Step
from rlchain.core.envs.rng import CounterRng
from rlchain.core.observations import leaves
from rlchain.core.policies import ACTION_STREAM
from rlchain.settings import SettingError

if TYPE_CHECKING:
    from tensordict import TensorDict

    from rlchain.core.algorithms.base import Algorithm
    from rlchain.core.policies import Policy

__all__ = ["SHAPE_SETTINGS", "Population", "PopulationPolicy", "Scalars"]

#: Algorithm settings that change shapes or code: every member must have the same value. (``seed`` differs: it
#: seeds each member's own minibatch generator.)
SHAPE_SETTINGS = ("batch_size", "n_epochs", "group_size", "seq_len", "lr_schedule")


def _batch(flat: dict[str, torch.Tensor]) -> TensorDict:
    """One member's minibatch (flat keys, an observation's groups as ``obs.<group>``:
    :meth:`Population._member_rollout`) as the TensorDict an algorithm's loss reads, its groups nested back."""
    from tensordict import TensorDict

    return TensorDict(flat, batch_size=[flat["action"].shape[0]]).unflatten_keys(".")


class _Run(nn.Module):
    """Runs a function while ``policy``'s parameters and buffers are those handed to
    :func:`torch.func.functional_call` (one member's, under :func:`torch.vmap`)."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


class Scalars:
    """The algorithm settings that differ between the members, as float32 ``[P]`` tensors; the others as in
    member 0's settings.

    Args:
        configs: the members' algorithm settings (one class).
        device: where the tensors live.

    Raises:
        SettingError: a setting that changes shapes or code (:data:`SHAPE_SETTINGS`; a bool, a string, None
            against a number) differing between members, naming it and its values.
    """

    def __init__(self, configs: Sequence[Any], device: torch.device) -> None:
        first = configs[0]
        self.base = first
        self.varying: dict[str, torch.Tensor] = {}
        for field in dataclasses.fields(first):
            values = [getattr(c, field.name) for c in configs]
            if all(v == values[0] for v in values) or field.name == "seed":
                continue
            numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
            if field.name in SHAPE_SETTINGS or not numeric:
                raise SettingError(
                    f"algorithm.{field.name}",
                    values,
                    " differs between the members of a population: it changes shapes or code; expected one value "
                    "(a sweep over it runs as several populations)",
                )
            self.varying[field.name] = torch.tensor(values, dtype=torch.float32, device=device)

    def get(self, name: str) -> torch.Tensor | Any:
        """``name``'s ``[P]`` tensor where the members differ, else member 0's value."""
        return self.varying.get(name, getattr(self.base, name))

    def tensor(self, name: str, members: int, device: torch.device) -> torch.Tensor:
        """``name`` as a float32 ``[P]`` tensor whether or not it differs."""
        value = self.get(name)
        if isinstance(value, torch.Tensor):
            return value
        return torch.full((members,), float(value), dtype=torch.float32, device=device)

    def view(self, values: dict[str, torch.Tensor]) -> Any:
        """A copy of member 0's settings with ``values`` (one member's, 0-d tensors under :func:`torch.vmap`) in
        place of the varying fields: what a member's own algorithm code reads as ``self.cfg``."""
        view = copy.copy(self.base)
        for name, value in values.items():
            object.__setattr__(view, name, value)
        return view


class PopulationPolicy(nn.Module):
    """``P`` policies of one architecture as one module: stacked weights, each member's own code under
    :func:`torch.vmap`. The collector acts with it as with one policy of ``P * N`` envs.

    Args:
        members: ``P`` policies of one class and settings (feed-forward :class:`~rlchain.core.policies.ActorCritic`
            or :class:`~rlchain.core.policies.ActorOnly`; vector observations, images through their CNN encoders,
            or groups of both), each built from its member's seed.
        seeds: the members' run seeds: member ``p``'s action noise is the stream of
            ``seeds[p] + ACTION_STREAM``, as its policy alone would draw it
            (:meth:`~rlchain.core.policies.ActorCritic.seed_actions`), from where the member's own stream stands
            when every member has one (a resumed member's).
        envs_per_member: ``N``: the envs of member ``p`` are ``[p * N, (p + 1) * N)`` of each step.

    Attributes:
        params: name -> ``[P, ...]`` stacked trainable parameters (leaves; the update's).
        buffers: name -> ``[P, ...]`` stacked buffers (the observation normalisers).

    Raises:
        SettingError: a recurrent policy, a policy without the tensor core (``seed_actions``), or members of
            different classes or settings, naming ``policy``.
    """

    is_recurrent = False

    def __init__(self, members: Sequence[Policy], seeds: Sequence[int], envs_per_member: int) -> None:
        super().__init__()
        self.envs = envs_per_member
        first = members[0]
        if getattr(first, "is_recurrent", False):
            raise SettingError(
                "policy.rnn_type",
                first.cfg.rnn_type,
                " is not taken by a population yet (torch.vmap cannot batch torch.nn.GRU's or LSTM's kernels): "
                "expected None (a feed-forward policy)",
            )
        if not hasattr(first, "seed_actions"):
            raise SettingError(
                "policy",
                type(first).__name__,
                " cannot join a population: its members are batched through ActorCritic's tensor core; expected "
                "policy=actor_critic or actor_only",
            )
        for other in members[1:]:
            if type(other) is not type(first) or other.cfg != first.cfg:
                raise SettingError("policy", type(other).__name__, " differs between members: expected one policy")
        self.members = len(members)
        self.template = copy.deepcopy(first)
        self.template.action_rng = None
        self._run = _Run(self.template)
        params, buffers = torch.func.stack_module_state(list(members))
        self.params = {name: nn.Parameter(t) for name, t in params.items()}
        for i, p in enumerate(self.params.values()):
            self.register_parameter(f"member_param_{i}", p)
        self.buffers_ = buffers
        # What a policy's state_dict holds: not the constants a module keeps out of it (a spatial softmax's pixel
        # coordinates, persistent=False), which are stacked with the buffers for the vmapped calls.
        self._saved = set(first.state_dict())
        for i, b in enumerate(buffers.values()):
            self.register_buffer(f"member_buffer_{i}", b)
        device = next(iter(self.params.values())).device
        self.action_rng = CounterRng([int(s) + ACTION_STREAM for s in seeds], device)
        streams = [getattr(m, "action_rng", None) for m in members]
        if all(stream is not None for stream in streams):  # where each member's stream stands (a resumed run's)
            self.action_rng.state.copy_(torch.stack([stream.state for stream in streams]))
        self.has_critic = first.has_critic
        self.observation_space, self.action_space = first.observation_space, first.action_space
        self.discrete = first.discrete
        self.critic_groups = getattr(first, "critic_groups", None)

    # ------------------------------------------------------------ vmapped calls
    def _state(self) -> dict[str, torch.Tensor]:
        return {
            **{f"policy.{k}": v for k, v in self.params.items()},
            **{f"policy.{k}": v for k, v in self.buffers_.items()},
        }

    def vmap(self, fn: Callable[..., Any], *args: Any, in_dims: Any = 0) -> Any:
        """``fn(*args)`` for every member at once: ``fn`` calls :attr:`template` (the members' code), which reads
        member ``p``'s weights, on member ``p``'s slice (dim 0) of each argument of ``in_dims``."""
        state = self._state()

        def one(member_state: dict[str, torch.Tensor], *member_args: Any) -> Any:
            return torch.func.functional_call(self._run, member_state, (fn, *member_args), strict=False)

        dims = (0, *((in_dims,) * len(args) if not isinstance(in_dims, tuple) else in_dims))
        return torch.vmap(one, in_dims=dims, randomness="error")(state, *args)

    def _split(self, x: torch.Tensor, envs: int | None = None) -> torch.Tensor:
        """A batch of ``k`` whole steps of the ``P * N`` envs, ``[k * P * N, ...]`` (env-minor, as the collector
        flattens its ``[T, P * N]`` storage) -> each member's ``[P, k * N, ...]``; ``N`` is ``envs``, or the
        training envs' :attr:`envs` (None)."""
        n = envs or self.envs
        k = x.shape[0] // (self.members * n)
        return x.view(k, self.members, n, *x.shape[1:]).transpose(0, 1).reshape(self.members, -1, *x.shape[1:])

    def _split_obs(self, obs: Any, envs: int | None = None) -> Any:
        """:meth:`_split` of an observation: a tensor, or each group of a mapping (a dict of the groups)."""
        if isinstance(obs, torch.Tensor):
            return self._split(obs, envs)
        return {group: self._split(obs[group], envs) for group in obs.keys()}

    def _merge(self, y: torch.Tensor, envs: int | None = None) -> torch.Tensor:
        """The inverse of :meth:`_split`: ``[P, k * N, ...]`` -> ``[k * P * N, ...]``."""
        n = envs or self.envs
        k = y.shape[1] // n
        return y.view(self.members, k, n, *y.shape[2:]).transpose(0, 1).reshape(-1, *y.shape[2:])

    def act(
        self, obs: torch.Tensor, state: Any = None, deterministic: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        """Every member's :meth:`~rlchain.core.policies.ActorCritic.act` on its envs' ``obs`` (one step, ``[P * N,
        obs_dim]``, ``N`` the training's envs per member or an evaluation's): ``(action, log_prob, value, None)``,
        ``[P * N, ...]``, the noise from each member's stream."""
        envs = leaves(obs)[0].shape[0]  # P * N: one step of the training's envs, or an evaluation's
        noise = None if deterministic else self.template_noise(envs)
        template = self.template

        def act(o: torch.Tensor, z: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
            action, log_prob, value, _ = template._core_act(o, None, deterministic, z)
            return action, log_prob, value

        n = envs // self.members  # one step's envs per member
        if noise is None:
            out = self.vmap(lambda o: act(o, None), self._split_obs(obs, n))
        else:
            out = self.vmap(act, self._split_obs(obs, n), self._split(noise, n))
        action, log_prob, value = (self._merge(x, n) for x in out)
        return action, log_prob, value, None

    def template_noise(self, batch: int) -> torch.Tensor:
        """One step's action noise of every member, ``[P * N, width]`` (member ``p``'s rows from its stream)."""
        width = int(self.action_space.n) if self.discrete else int(self.action_space.shape[0])
        draw = self.action_rng.uniform if self.discrete else self.action_rng.normal
        return draw(batch, width, env_axis=0)

    def value(self, obs: torch.Tensor, state: Any = None) -> torch.Tensor:
        """Every member's critic value of its envs' ``obs`` ``[P * N, ...]``: float32 ``[P * N]``."""
        template = self.template
        return self._merge(self.vmap(lambda o: template._core_value(o, None), self._split_obs(obs)))

    def initial_state(self, batch: int, device: Any = None) -> None:
        """None: a population's policies are feed-forward."""
        return None

    @torch.no_grad()
    def update_obs_normalizer(self, obs: Any) -> None:
        """Fold each member's observations of a ``[T, P * N, ...]`` rollout (a tensor, or groups) into its own
        normaliser."""

        def members(x: torch.Tensor) -> torch.Tensor:
            return x.view(x.shape[0], self.members, -1, *x.shape[2:]).transpose(0, 1)

        member_obs = members(obs) if isinstance(obs, torch.Tensor) else {g: members(obs[g]) for g in obs.keys()}
        template = self.template

        def update(o: Any) -> torch.Tensor:
            template.update_obs_normalizer(o)  # in place, into each member's slice of the stacked buffers
            return leaves(o)[0].new_zeros(())

        self.vmap(update, member_obs)

    def member_state_dict(self, p: int) -> dict[str, torch.Tensor]:
        """Member ``p``'s weights and buffers as an ordinary policy ``state_dict`` (copies)."""
        state = {name: t[p].detach().clone() for name, t in self.params.items()}
        state.update({name: t[p].clone() for name, t in self.buffers_.items() if name in self._saved})
        return state


class Population:
    """``P`` algorithms of one class and shape, their policies batched (:class:`PopulationPolicy`), learning as
    one: the engine of the module docstring.

    Args:
        algorithms: the members' algorithms (:class:`~rlchain.core.algorithms.PPO` or
            :class:`~rlchain.core.algorithms.GRPO`), each built on its member's policy from its seed.
        seeds: the members' run seeds (their action noise; see :class:`PopulationPolicy`).
        envs_per_member: ``N``, each member's envs.

    Attributes:
        policy: the :class:`PopulationPolicy` the collector acts with.
        scalars: the members' settings (:class:`Scalars`).
        updater: the update's mechanics (:class:`~rlchain.core.algorithms.update.MinibatchUpdate`, ``P`` members).
        lr: float64 ``[P]``, each member's learning rate in use.
        stopped: bool ``[P]``: members stopped for good (a non-finite loss or gradient norm, a pruned trial, a
            run that ended or failed, actions its envs rejected); their steps move nothing.
        faults: per stopped member, its :class:`~rlchain.core.algorithms.update.NonFiniteError` (or why, a string).

    Raises:
        SettingError: settings a population cannot vary or take yet, naming them: see :class:`Scalars`; an
            algorithm other than PPO or GRPO.
    """

    def __init__(self, algorithms: Sequence[Algorithm], seeds: Sequence[int], envs_per_member: int) -> None:
        from rlchain.core.algorithms.grpo import GRPO
        from rlchain.core.algorithms.ppo import PPO

        first = algorithms[0]
        if not isinstance(first, PPO | GRPO) or any(type(a) is not type(first) for a in algorithms):
            raise SettingError("algorithm", type(first).__name__, " cannot form a population: expected PPO or GRPO")
        self.kind = "ppo" if isinstance(first, PPO) else "grpo"
        self.algorithms = list(algorithms)
        self.members, self.envs_per_member = len(algorithms), envs_per_member
        self.policy = PopulationPolicy([a.policy for a in algorithms], seeds, envs_per_member)
        device = next(iter(self.policy.params.values())).device
        self.device = device
        self.scalars = Scalars([a.cfg for a in algorithms], device)
        self.template = copy.copy(first)
        self.template.policy = self.policy.template
        #: PPO's reward_norm: each member's own scaler (its algorithm's: its statistics, saved and resumed with it).
        self.reward_scalers = [getattr(a, "reward_scaler", None) for a in algorithms]
        #: GRPO's kl_coef > 0: the members' frozen references, stacked (a member of kl_coef 0 stands in with a copy
        #: of its policy, whose log-probabilities are replaced: its loss adds 0 times its term, which it reports as
        #: 0, as its solo run does).
        self.reference: PopulationPolicy | None = None
        self._no_reference: torch.Tensor | None = None
        refs = [getattr(a, "ref_policy", None) for a in algorithms]
        if any(r is not None for r in refs):
            self.reference = PopulationPolicy(
                [
                    r if r is not None else copy.deepcopy(a.policy).requires_grad_(False).eval()
                    for r, a in zip(refs, algorithms)
                ],
                seeds,
                envs_per_member,
            ).requires_grad_(False)
            self.template.ref_policy = self.reference.template
            self._no_reference = torch.tensor([r is None for r in refs], device=device)
        self._params = list(self.policy.params.values())
        #: The update's mechanics, a solo run's own (:class:`~rlchain.core.algorithms.update.MinibatchUpdate`) with
        #: the member shape ``(P,)``: Adam, the schedule, the minibatches, the train step, the faults.
        self.updater = MinibatchUpdate(
            self.policy,
            self.scalars.base,
            self._loss,
            first.term_names,
            False,
            members=self.members,
            params=self._params,
            # The rates in float64, as each member's solo run holds its own: a member's checkpoint records its rate
            # to the last bit (float32, 3e-4 would come back as 3.0000001e-4).
            varying={**self.scalars.varying, **self._exact_rates(algorithms)},
            generators=[a.updater.generator for a in algorithms],
        )
        self.faults: dict[int, Exception | str] = {}
        #: The minibatch step (:meth:`update_step` gives it its warm-up): what ``trainer.compile`` compiles.
        self.step = self.updater.step

    def _exact_rates(self, algorithms: Sequence[Algorithm]) -> dict[str, torch.Tensor]:
        """``learning_rate`` as a float64 ``[P]`` tensor where the members' rates differ, else nothing."""
        if "learning_rate" not in self.scalars.varying:
            return {}
        rates = [a.cfg.learning_rate for a in algorithms]
        return {"learning_rate": torch.tensor(rates, dtype=torch.float64, device=self.device)}

    @property
    def lr(self) -> torch.Tensor:
        """float64 ``[P]``: each member's learning rate in use."""
        return self.updater.lr

    @property
    def stopped(self) -> torch.Tensor:
        """bool ``[P]``: the members stopped for good (:meth:`stop`)."""
        return self.updater.stopped

    @property
    def updates(self) -> torch.Tensor:
        """float64 ``[P]``: each member's update count (its linear schedule's position; in its
        :class:`~rlchain.core.algorithms.update.NonFiniteError`): its own, as members may join having run different
        numbers of updates (resumed and fresh members)."""
        return self.updater.updates

    # ---------------------------------------------------------------- the step
    def update_step(self, rollout: TensorDict) -> Step:
        """The minibatch step as the :class:`~rlchain.core.compiling.Step` that ``trainer.compile`` compiles and
        ``trainer.cudagraphs`` captures, warmed up by one :meth:`update` of ``rollout`` (the collector's
        ``[T, P * N]`` storage; its zeros before the first rollout do), installed as :attr:`step`."""
        self.step = self.updater.make_step(lambda: self.update(rollout), self._snapshot, self._restore)
        return self.step

    def _updated_tensors(self) -> list[torch.Tensor]:
        """The tensors an update writes: weights, observation statistics, Adam's moments and steps, rates, stops,
        update counts."""
        return [*self._params, *self.policy.buffers_.values(), *self.updater.member_state(), self.updater.stopped]

    def _snapshot(self) -> tuple[Any, ...]:
        """What an update changes: :meth:`_updated_tensors`, the stops' reasons, the members' minibatch generators
        and reward scalers."""
        scalers = [None if s is None else (s.state_dict(), s.rank_state_dict()) for s in self.reward_scalers]
        generators = [a.updater.generator.get_state() for a in self.algorithms]
        tensors = [t.detach().clone() for t in self._updated_tensors()]
        return tensors, dict(self.faults), list(self.updater._stopped), generators, copy.deepcopy(scalers)

    @torch.no_grad()
    def _restore(self, saved: tuple[Any, ...]) -> None:
        """Put :meth:`_snapshot`'s state back, into the same tensors."""
        values, faults, stopped, generators, scalers = saved
        for tensor, value in zip(self._updated_tensors(), values):
            tensor.copy_(value)
        self.faults, self.updater._stopped = faults, stopped
        for algorithm, state in zip(self.algorithms, generators):
            algorithm.updater.generator.set_state(state)
        for scaler, state in zip(self.reward_scalers, scalers):
            if scaler is not None:
                scaler.load_state_dict(state[0])
                scaler.load_rank_state_dict(state[1])

    # ---------------------------------------------------------------- samples
    def _member_rollout(self, rollout: TensorDict, keys: Sequence[str]) -> dict[str, torch.Tensor]:
        """``keys`` of the ``[T, P * N]`` rollout as ``[P, T, N, ...]`` tensors (member-major); an observation's
        groups each under ``obs.<group>`` (tensordict's ``flatten_keys``; :func:`_batch` nests them back)."""
        t = rollout.batch_size[0]
        flat = rollout.select(*keys).flatten_keys(".")
        return {
            key: x.view(t, self.members, self.envs_per_member, *x.shape[2:]).transpose(0, 1) for key, x in flat.items()
        }

    def _ppo_samples(self, rollout: TensorDict) -> dict[str, torch.Tensor]:
        """Each member's advantages and returns ``[P, T, N]`` (its own ``gamma``, ``gae_lambda``; its advantages
        normalised over its own samples), as :meth:`~rlchain.core.algorithms.PPO.update` computes them."""
        keys = ("reward", "value", "next_value", "terminated", "done")
        parts = self._member_rollout(rollout, keys)
        if self.reward_scalers[0] is not None:  # each member's own scaler on its own envs, as its solo run's update
            parts["reward"] = torch.stack(
                [
                    scaler(parts["reward"][p], parts["done"][p]) if p not in self.faults else parts["reward"][p]
                    for p, scaler in enumerate(self.reward_scalers)
                ]
            )
        gamma = self.scalars.tensor("gamma", self.members, self.device)
        lam = self.scalars.tensor("gae_lambda", self.members, self.device)
        norm_adv = self.scalars.base.norm_adv

        def samples(reward, value, next_value, terminated, done, g, lm):
            advantages, returns = compute_gae(reward, value, next_value, terminated, done, g, lm)
            if norm_adv:
                flat = advantages.reshape(-1)
                advantages = (advantages - flat.mean()) / (flat.var().sqrt() + 1e-8)
            return advantages, returns

        advantages, returns = torch.vmap(samples)(*(parts[k] for k in keys), gamma, lam)
        return {"advantages": advantages, "returns": returns}

    def _grpo_samples(self, rollout: TensorDict) -> dict[str, torch.Tensor]:
        """Each member's group-relative advantages and live mask ``[P, T, N]``, from its algorithm's own
        :meth:`~rlchain.core.algorithms.GRPO.advantages` with its own numbers."""
        from tensordict import TensorDict

        parts = self._member_rollout(rollout, ("reward", "done"))
        varying = {k: v for k, v in self.scalars.varying.items() if k in ("gamma", "eps")}
        template, scalars = self.template, self.scalars

        def samples(reward, done, values):
            view = copy.copy(template)
            view.cfg = scalars.view(values)
            td = TensorDict({"reward": reward, "done": done}, batch_size=reward.shape)
            advantages, mask = view.advantages(td)
            return advantages, mask.float()

        advantages, mask = torch.vmap(samples)(parts["reward"], parts["done"], varying)
        out = {"advantages": advantages, "mask": mask}
        if self.reference is not None:
            # A member of kl_coef 0 stands in with its rollout's own log-probabilities: its term, times 0, stays
            # finite whatever its policy does.
            own = self._member_rollout(rollout, ("sample_log_prob",))["sample_log_prob"]
            out["ref_log_prob"] = torch.where(self._no_reference.view(-1, 1, 1), own, self._reference_log_prob(rollout))
        return out

    @torch.no_grad()
    def _reference_log_prob(self, rollout: TensorDict) -> torch.Tensor:
        """Each member's reference log-probabilities of its rollout's actions ``[P, T, N]``, in forward passes of
        at most ``batch_size`` samples in order, as :meth:`~rlchain.core.algorithms.GRPO.reference_log_prob`."""
        parts = self._member_rollout(rollout, ("obs", "action"))
        t, n = rollout.batch_size[0], self.envs_per_member
        flat = {k: v.reshape(self.members, t * n, *v.shape[3:]) for k, v in parts.items()}
        template, size = self.reference.template, self.scalars.base.batch_size

        def log_prob(b: dict[str, torch.Tensor]) -> torch.Tensor:
            return template.evaluate_actions(_batch(b))["sample_log_prob"]

        chunks = [
            self.reference.vmap(log_prob, {k: v[:, i : i + size] for k, v in flat.items()})
            for i in range(0, t * n, size)
        ]
        return torch.cat(chunks, 1).view(self.members, t, n)

    # ----------------------------------------------------------------- update
    def update(self, rollout: TensorDict) -> list[dict[str, float]]:
        """One update of every member on its ``[T, N]`` slice of the ``[T, P * N]`` rollout.

        Returns:
            per member, what its algorithm's ``update`` returns (the means of its terms over the minibatches it
            ran, ``grad_norm``, ``learning_rate``, ``update_kl`` under ``lr_schedule='adaptive'``, and PPO's
            ``explained_variance`` and ``epochs``, GRPO's ``live_fraction``); ``{}`` for a stopped member.
        """
        computed = self._ppo_samples(rollout) if self.kind == "ppo" else self._grpo_samples(rollout)
        keys = ("obs", "action", "sample_log_prob") + (("value",) if self.kind == "ppo" else ())
        data = self._member_rollout(rollout, keys)
        data.update(computed)
        samples = {k: v.reshape(self.members, -1, *v.shape[3:]) for k, v in data.items()}  # [P, T * N, ...]
        cfg = self.scalars.base
        stop_kl = self.scalars.get("target_kl") if getattr(cfg, "stop_at_target_kl", False) else None
        results = self.updater.run_members(samples, stop_kl, lambda: self._update_kl(samples))
        for p, (_, _, error) in enumerate(results):
            if error is not None and p not in self.faults:
                self.stop(p, error)
        before = {name: b.clone() for name, b in self.policy.buffers_.items()}
        self.policy.update_obs_normalizer(rollout["obs"])
        with torch.no_grad():  # a stopped member's statistics stay as they were
            for name, b in self.policy.buffers_.items():
                b.copy_(torch.where(self.stopped.view(-1, *(1,) * (b.dim() - 1)), before[name], b))
        extra = self._ppo_stats(data) if self.kind == "ppo" else self._grpo_stats(data)
        lrs = self.lr.tolist()
        out = []
        for p, (stats, epochs, _) in enumerate(results):
            if p in self.faults:
                out.append({})
                continue
            if self.kind == "ppo":
                stats["epochs"] = epochs
            out.append({**stats, **{k: v[p] for k, v in extra.items()}, "learning_rate": lrs[p]})
        return out

    def _ppo_stats(self, data: dict[str, torch.Tensor]) -> dict[str, list[float]]:
        returns, value = data["returns"].flatten(1), data["value"].flatten(1)
        var_returns, var_residual = returns.var(1), (returns - value).var(1)
        constant = var_returns <= (1e-6 * returns.abs().amax(1)) ** 2
        ev = torch.where(constant, math.nan, 1 - var_residual / var_returns)
        stats = {"explained_variance": ev.tolist()}
        if self.reward_scalers[0] is not None:
            stats["return_std"] = [scaler.std for scaler in self.reward_scalers]
        return stats

    def _grpo_stats(self, data: dict[str, torch.Tensor]) -> dict[str, list[float]]:
        return {"live_fraction": data["mask"].flatten(1).mean(1).tolist()}

    def _loss(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every member's minibatch loss and terms ``[P]``: its algorithm's own ``_minibatch_loss`` with its own
        numbers and weights, vmapped."""
        template, scalars = self.template, self.scalars
        varying = scalars.varying

        def loss(b: dict[str, torch.Tensor], values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            view = copy.copy(template)
            view.cfg = scalars.view(values)
            return view._minibatch_loss(_batch(b))

        terms = self.policy.vmap(loss, batch, varying)
        if self._no_reference is not None:  # kl_coef 0: no reference, its term 0 as its solo run reports it
            terms["approx_ref_kl"] = torch.where(self._no_reference, 0.0, terms["approx_ref_kl"])
        return terms

    @torch.no_grad()
    def _update_kl(self, samples: dict[str, torch.Tensor]) -> torch.Tensor:
        """Each member's mean KL(rollout policy || updated policy) over its samples (GRPO: its live ones), ``[P]``."""
        template = self.policy.template
        weight = samples.get("mask")

        def kl(b: dict[str, torch.Tensor], w: torch.Tensor | None) -> torch.Tensor:
            new = template.evaluate_actions(_batch(b))["sample_log_prob"]
            log_ratio = new - b["sample_log_prob"]
            per = torch.expm1(log_ratio) - log_ratio
            if w is None:
                return per.mean()
            return torch.where(w.sum() > 0, (per * w).sum() / w.sum().clamp_min(1e-30), 0.0)

        b = {k: v for k, v in samples.items() if k.partition(".")[0] in ("obs", "action", "sample_log_prob")}
        return self.policy.vmap(kl, b, weight, in_dims=(0, None if weight is None else 0))

    # ------------------------------------------------------------------ faults
    def stop(self, member: int, why: Exception | str) -> None:
        """Stop ``member`` for good (masked: its steps move nothing from now on; no recompile), for ``why``: a
        non-finite update, actions its envs rejected, a failed iteration (the error), a pruned trial or a run that
        ended (a string)."""
        self.updater.stop(member)
        self.faults[member] = why

    # --------------------------------------------------------------- members
    @torch.no_grad()
    def write_back(self, member: int) -> Policy:
        """Put member ``member``'s weights and observation statistics into its own policy module (an ordinary
        policy: its ``state_dict`` is a solo run's checkpoint format) and return it."""
        policy = self.algorithms[member].policy
        policy.load_state_dict(self.policy.member_state_dict(member))
        return policy
