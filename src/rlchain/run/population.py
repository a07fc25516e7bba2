"""A population's training: ``P`` runs built as ``rlchain-train`` builds each, trained side by side as one batch.

Each member is an ordinary :class:`~rlchain.run.trainer.Trainer`, built and started (resumed, or afresh) in its
own run directory by :func:`rlchain.commands.train.build`; :class:`PopulationRun` trains them together. One
task of ``P * N`` envs (``N`` each member's ``num_envs``; :meth:`~rlchain.core.envs.base.TorchVecEnv.split_into_members`)
and one :class:`~rlchain.core.population.Population` collect and learn for every member at once; after each
iteration, member ``p``'s state (weights, Adam, rate, its envs, its episodes in progress, its action stream) is
written back into its own trainer's parts, and its :class:`~rlchain.run.trainer.Session` logs, evaluates and
saves exactly as its solo run does: its ``metrics.jsonl``, TensorBoard, ``checkpoints/latest.pt`` and ``best.pt``
(ordinary single-run checkpoints) and ``summary.json``. A resumed population resumes each member from what its
trainer loaded.

Faults stay per member: a member whose loss or gradient norm goes non-finite, whose actions its envs reject, or
whose iteration fails, ends alone with today's one line and status (its update masked from then on; its envs
step on, seen by no other member); a pruned member stops the same way;
Ctrl-C or SIGTERM stops every member after the iteration, each saving its ``latest.pt``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate

from rlchain.console import notice
from rlchain.core.collector import SyncCollector
from rlchain.core.envs.base import TorchVecEnv
from rlchain.core.evaluation import Evaluation, evaluate
from rlchain.core.networks import CNNEncoder
from rlchain.core.population import Population
from rlchain.core.stepping import rejected_action
from rlchain.run.starting import compile_steps
from rlchain.run.stopping import Abort, StopSignals
from rlchain.run.trainer import Session, Step, Trainer
from rlchain.settings import SettingError

__all__ = ["PopulationRun", "as_member", "member_logs"]

#: The member whose own work (its iteration's logs, evaluation, checkpoint, end) runs now in this process; None
#: while the population's shared step runs.
_member: ContextVar[int | None] = ContextVar("rlchain_population_member", default=None)

#: Trainer settings that may differ between members (where each writes, what it is called, its eval seed).
MEMBER_TRAINER_SETTINGS = ("output_dir", "seed", "exp_name", "wandb_name", "wandb_group", "wandb_tags", "resume_from")


class PopulationRun:
    """Trains the started trainers ``trainers`` (one per member) as one population.

    Args:
        trainers: ``P`` started trainers (:meth:`~rlchain.run.trainer.Trainer.start`) of one shape: one env
            class and settings but the seed (a torch-native task), one ``num_envs``, one policy, one algorithm
            class and shape, one trainer's settings but those of :data:`MEMBER_TRAINER_SETTINGS`.
        free_bytes: the device memory the population may take; None: what the device has free now
            (:func:`check_memory`).

    Raises:
        SettingError: members that cannot train as one population, naming the setting: see
            :class:`~rlchain.core.population.Population` and :class:`~rlchain.core.population.PopulationPolicy`;
            an env that is not a torch-native task; a population that does not fit in ``free_bytes``
            (:func:`check_memory`);
            ``trainer.cudagraphs`` where capture cannot apply (as for a solo run), all before any step.
        CompileFailure: ``trainer.compile=true`` where compiling the population's steps failed: one line, the
            traceback in the first member's ``compile_error.txt``.
    """

    def __init__(self, trainers: Sequence[Trainer], free_bytes: int | None = None) -> None:
        self.trainers = list(trainers)
        first = self.trainers[0]
        _check_members(self.trainers)
        check_memory(self.trainers, free_bytes)
        self.members, self.envs_per_member = len(self.trainers), first.env.num_envs
        cfg = first.cfg
        # The members' env, built from the run's own config (its _target_ and settings) with every member's envs.
        self.env = instantiate(first.config["env"], num_envs=self.members * self.envs_per_member, _convert_="all")
        self.env.split_into_members([t.env.cfg.seed for t in self.trainers])
        seeds = [t.cfg.seed for t in self.trainers]
        self.engine = Population([t.algorithm for t in self.trainers], seeds, self.envs_per_member)
        self.collector = SyncCollector(
            self.env,
            self.engine.policy,
            cfg.rollout_steps,
            first.algorithm.reset_options,
            spread_episode_starts=cfg.spread_episode_starts,
        )
        self._sync_in()
        self._compile()
        #: The members' evaluation env, every member's evaluation envs as one task split into members (their
        #: evaluations during training run at once: :meth:`_evaluate`); None without evaluation, or with videos
        #: (each member then evaluates alone, as its solo run does).
        self.eval_env: TorchVecEnv | None = None
        evaluator = first.evaluator
        if evaluator.env is not None and not evaluator.video_episodes:
            count = self.members * evaluator.env.num_envs
            self.eval_env = instantiate(first.config["env"], num_envs=count, _convert_="all")
            self.eval_env.split_into_members([t.evaluator.seed for t in self.trainers])

    def _compile(self) -> None:
        """Under ``trainer.compile``, compile the population's two steps, its collection step and its minibatch
        update, as a solo run compiles its own (:func:`rlchain.run.starting.compile_steps`; each member's was not
        compiled when it started), and under ``trainer.cudagraphs`` capture them; each member's first row logs the
        seconds it took (``time/compile_s``)."""
        first = self.trainers[0]
        cfg = first.cfg
        if not cfg.compile and not cfg.cudagraphs:
            return
        steps = (self.collector.step, self.engine.update_step(self.collector.buffer.data))
        seconds = compile_steps(steps, self.env.device, cfg.compile, cfg.cudagraphs, first.output_dir)
        for trainer in self.trainers:
            trainer.state = dataclasses.replace(trainer.state, compile_s=seconds)

    # --------------------------------------------------------------- state
    def _block(self, p: int) -> slice:
        return slice(p * self.envs_per_member, (p + 1) * self.envs_per_member)

    @torch.no_grad()
    def _sync_in(self) -> None:
        """Take each member's state as its trainer started it (afresh, or resumed): its envs and episodes in
        progress, its Adam state, rate and update count (its weights and action stream the engine took when built).
        Where some members resume and others start afresh, the fresh members' envs take their first reset here, as
        their first rollout would (the whole task resets, then the resumed members' envs take back their own
        state), so that every member starts where its solo run would; where every rollout starts with a reset
        (GRPO), the first rollout resets them all, and nothing but the envs' streams is taken."""
        engine = self.engine
        env_states = [t.env.state_dict() for t in self.trainers]
        self.env.set_state({name: torch.cat([s[name] for s in env_states]) for name in self.env.get_state()})
        self.env._rng.state.copy_(torch.stack([s["rng"] for s in env_states]))
        states = [t.collector.state_dict() for t in self.trainers]
        resumed = [p for p, s in enumerate(states) if s["obs"] is not None]
        if resumed and len(resumed) < self.members and self.collector.reset_options is not None:
            resumed = []  # every rollout starts with a reset of every env (GRPO): no episode carries, none to load
        if resumed and len(resumed) < self.members:
            self.collector._start_rollout()  # the fresh members' first reset (and spread episode starts)
            task = {name: value.clone() for name, value in self.env.get_state().items()}
            for p in resumed:
                block = self._block(p)
                for name, value in task.items():
                    value[block] = env_states[p][name]
                self.env._rng.state[p].copy_(env_states[p]["rng"])
            self.env.set_state(task)
            now = self.collector.state_dict()  # the fresh members' episodes, after their reset
            states = [
                states[p] if p in resumed else {key: _block_of(now[key], self._block(p)) for key in _EPISODES}
                for p in range(self.members)
            ]
        if resumed:
            self.collector.load_state_dict({key: _joined([s[key] for s in states]) for key in _EPISODES})
        for p, trainer in enumerate(self.trainers):  # its Adam state, rate and count, in the same flat layout
            for shared, own in zip(engine.updater.member_state(), trainer.algorithm.updater.member_state()):
                shared[p].copy_(own[0])

    @torch.no_grad()
    def _sync_out(self, p: int) -> None:
        """Write member ``p``'s state into its trainer's parts: what its logs, evaluations and checkpoints read."""
        engine, trainer = self.engine, self.trainers[p]
        engine.write_back(p)
        for shared, own in zip(engine.updater.member_state(), trainer.algorithm.updater.member_state()):
            own[0].copy_(shared[p])
        block = self._block(p)
        trainer.env.set_state({name: value[block] for name, value in self.env.get_state().items()})
        trainer.env._rng.state.copy_(self.env._rng.state[p])
        trainer.policy.action_rng.state.copy_(engine.policy.action_rng.state[p])
        state = self.collector.state_dict()
        if state["obs"] is not None:
            trainer.collector.load_state_dict({key: _block_of(state[key], block) for key in _EPISODES})

    def _stop_invalid_actions(self, data: Any) -> None:
        """Stop each member whose actions of this rollout ``data`` (``[T, P * N]``) its envs rejected, alone, before
        the update: its run ends with the error its solo run's collection raises (the env's, or one naming a
        non-finite observation where that came first: :func:`~rlchain.core.stepping.rejected_action`)."""
        members, message = self.env.take_invalid_members()
        for p in members:
            if p in self.engine.faults:
                continue
            block = self._block(p)
            error = rejected_action(self.env, data["obs"][:, block], ValueError(message), data["action"][:, block])
            self.engine.stop(p, error)

    def _iterate(
        self,
        p: int,
        session: Session,
        members: Sequence[Any],
        stats: Sequence[dict],
        evaluations: Sequence[tuple[Evaluation | Exception, float] | None],
        collect_s: float,
        update_s: float,
    ) -> None:
        """Member ``p``'s state into its trainer's parts, then its session's iteration on its rollout
        (``members[p]``, :meth:`~rlchain.core.collector.SyncCollector.member_rollouts`), update (``stats[p]``)
        and evaluation, where one is due (``evaluations[p]``, :meth:`_evaluate`)."""
        self._sync_out(p)
        data = members[p]
        session.iteration(
            Step(data.episodes, data.term_means, stats[p], data.data.numel(), collect_s, update_s, evaluations[p])
        )

    @torch.no_grad()
    def _evaluate(self, sessions: Sequence[Session]) -> list[tuple[Evaluation | Exception, float] | None]:
        """Every member's evaluation of this iteration, where its loop evaluates after it
        (:meth:`~rlchain.run.trainer.Trainer.evaluation_due`), as one evaluation of the population's policy on
        :attr:`eval_env` (each member's envs reset with its own evaluation seed): per member, its own
        :class:`~rlchain.core.evaluation.Evaluation` (its episodes those its solo run's evaluation runs, to float
        rounding) and the seconds of the whole, or the error its evaluation raises; None where none is due.

        Where the shared evaluation itself raises (an env's error on some member's states, a batch too large for
        the device), it is left for the rest of the run: one notice names the error, and from then on each due
        member's loop evaluates alone with its own evaluator (its ``Step.evaluation`` None), as its solo run
        would, so that what fails one member's evaluation fails that member only."""
        due = [
            s.running and p not in self.engine.faults and s.trainer.evaluation_due(s.trainer.state.iteration + 1)
            for p, s in enumerate(sessions)
        ]
        if self.eval_env is None or not any(due):
            return [None] * self.members
        evaluator = self.trainers[0].evaluator
        seeds = [t.evaluator.seed for t in self.trainers]
        began = time.perf_counter()
        try:
            episodes = self.members * evaluator.num_episodes  # each member's num_eval_episodes
            results: list[Evaluation | Exception] = evaluate(
                self.eval_env, self.engine.policy, episodes, seed=seeds
            ).split_into_members(self.members, seeds)
        except Exception as err:  # noqa: BLE001 - each due member evaluates alone instead, from now on
            self.engine.policy.train()  # as evaluate leaves it when it ends
            self.eval_env = None
            notice(
                f"the members' shared evaluation failed ({type(err).__name__}: {err}); from now on each member "
                "evaluates alone"
            )
            return [None] * self.members
        invalid, message = self.eval_env.take_invalid_members()
        for p in invalid:
            results[p] = ValueError(message)
        seconds = time.perf_counter() - began
        return [(result, seconds) if d else None for result, d in zip(results, due)]

    # ---------------------------------------------------------------- loop
    def train(self) -> list[Session]:
        """Train every member to its end; each one's session (its ``summary``, and its ``failure`` if it failed)."""
        clock = time.perf_counter
        with StopSignals(abort_on_repeat=True) as stop:
            sessions = [Session(t, stop, lead=p == 0) for p, t in enumerate(self.trainers)]
            for p, session in enumerate(sessions):
                _alone(p, session, session.open)
            try:
                while any(s.running for s in sessions):
                    for p, session in enumerate(sessions):
                        if not session.running and p not in self.engine.faults:
                            self.engine.stop(p, "ended")  # its envs ride along; its update is masked
                    t0 = clock()
                    rollout = self.collector.collect()
                    self._stop_invalid_actions(rollout.data)
                    t1 = clock()
                    stats = self.engine.update(rollout.data)
                    t2 = clock()
                    members = self.collector.member_rollouts(rollout, self.members)
                    evaluations = self._evaluate(sessions)
                    for p, session in enumerate(sessions):
                        if not session.running:
                            continue
                        fault = self.engine.faults.get(p)
                        if isinstance(fault, Exception):
                            with as_member(p):
                                session.fail(fault)
                            continue
                        iterate = functools.partial(
                            self._iterate, p, session, members, stats, evaluations, t1 - t0, t2 - t1
                        )
                        failure = _alone(p, session, iterate)
                        if failure is not None:
                            self.engine.stop(p, failure)
                        if session.trainer.state.pruned:
                            self.engine.stop(p, "pruned")
                for p, session in enumerate(sessions):
                    if not session.ended:
                        _alone(p, session, session.finish)
            except Abort:
                for p, session in enumerate(sessions):
                    if not session.ended:
                        with as_member(p):
                            session.abort()
            except Exception as err:  # noqa: BLE001 - a fault of the shared step ends every member still going
                for p, session in enumerate(sessions):
                    if not session.ended:
                        with as_member(p):
                            session.fail(err)
            for p, session in enumerate(sessions):
                with as_member(p):
                    session.close()
        return sessions


#: What a collector's state holds of the episodes in progress (a feed-forward policy's), each ``[N, ...]``.
_EPISODES = ("obs", "episode_return", "episode_length")


def _joined(values: Sequence[Any]) -> Any:
    """The members' saved values (each a tensor, or a dict of a saved observation's groups:
    ``observations.to_state``) as one, member after member along dim 0."""
    if isinstance(values[0], torch.Tensor):
        return torch.cat(list(values))
    return {group: torch.cat([v[group] for v in values]) for group in values[0]}


def _block_of(value: Any, block: slice) -> Any:
    """A member's envs' ``block`` (dim 0) of a saved value (a tensor, or a dict of a saved observation's groups)."""
    if isinstance(value, torch.Tensor):
        return value[block]
    return {group: v[block] for group, v in value.items()}


def _alone(p: int, session: Session, work: Callable[[], Any]) -> Exception | None:
    """``work()`` as member ``p``'s own work (:func:`as_member`); an error ends that member's run alone
    (``session.fail``) and is returned; None when ``work`` succeeded."""
    with as_member(p):
        try:
            work()
        except Exception as err:  # noqa: BLE001 - that member's run fails alone
            session.fail(err)
            return err
    return None


@contextlib.contextmanager
def as_member(p: int) -> Iterator[None]:
    """Run the block as member ``p``'s own work: its log lines go to its own log file (:func:`member_logs`)."""
    token = _member.set(p)
    try:
        yield
    finally:
        _member.reset(token)


class _MemberFilter(logging.Filter):
    """Passes the log lines of member ``member``'s own work and those of the shared step."""

    def __init__(self, member: int) -> None:
        super().__init__()
        self.member = member

    def filter(self, record: logging.LogRecord) -> bool:
        current = _member.get()
        return current is None or current == self.member


@contextlib.contextmanager
def member_logs(files: Sequence[str | os.PathLike | None]) -> Iterator[None]:
    """While the block runs, each member's log lines go to its own log file: the lines logged while member ``p``'s
    own work runs (:meth:`PopulationRun.train`: its iteration's logs, evaluation, checkpoint, end) to ``files[p]``
    alone, and those of the shared step (collection, update) to every file (None: that member has none).

    The root logger's file handlers that write to one of ``files`` (Hydra's job logging leaves the last-built
    member's) are set aside meanwhile; the new handlers take their format and level.
    """
    root = logging.getLogger()
    paths = [None if f is None else os.path.abspath(f) for f in files]
    aside = [h for h in root.handlers if isinstance(h, logging.FileHandler) and h.baseFilename in paths]
    added = []
    for p, path in enumerate(paths):
        if path is None:
            continue
        handler = logging.FileHandler(path, mode="a")
        if aside:
            handler.setFormatter(aside[0].formatter)
            handler.setLevel(aside[0].level)
        handler.addFilter(_MemberFilter(p))
        added.append(handler)
    for handler in aside:
        root.removeHandler(handler)
    for handler in added:
        root.addHandler(handler)
    try:
        yield
    finally:
        for handler in added:
            root.removeHandler(handler)
            handler.close()
        for handler in aside:
            root.addHandler(handler)


def member_bytes(trainer: Trainer) -> int:
    """An estimate of the device memory one member of a population takes, bytes: its share of the rollout storage
    (and of the update's staged copy of it), of the env's state and the evaluation env's, its weights, gradients
    and Adam's two moments (and GRPO's reference weights), and the activations of a minibatch's forward and
    backward passes (every hidden layer of both networks and every image encoder's maps, kept for the backward,
    and their gradients)."""

    def tensor_bytes(tensors: Any) -> int:
        return sum(t.numel() * t.element_size() for t in tensors)

    storage = tensor_bytes(trainer.collector.buffer.data.values(True, True))
    env = tensor_bytes(trainer.env.get_state().values())
    eval_env = trainer.evaluator.env
    if (
        isinstance(eval_env, TorchVecEnv) and not trainer.evaluator.video_episodes
    ):  # its share of PopulationRun.eval_env
        env += tensor_bytes(eval_env.get_state().values())
    weights = tensor_bytes(trainer.policy.parameters())
    reference = getattr(trainer.algorithm, "ref_policy", None)  # GRPO's kl_coef > 0: its frozen copy, stacked
    reference_bytes = 0 if reference is None else tensor_bytes(reference.parameters())
    hidden = sum(getattr(getattr(trainer.policy, "cfg", None), "hidden_sizes", [256, 256]))
    maps = sum(m.activation_floats for m in trainer.policy.modules() if isinstance(m, CNNEncoder))
    per_sample = 2 * hidden + maps  # the actor's and the critic's hidden layers, and every image encoder's maps
    activations = trainer.algorithm.cfg.batch_size * per_sample * 4 * 4  # float32, kept and grads x 2
    return 2 * storage + env + 4 * weights + reference_bytes + activations


def free_memory(device: torch.device, sharing: int = 1) -> int:
    """The bytes a population on ``device`` may plan for: what is free there (CUDA's ``mem_get_info``; on the CPU,
    Linux's ``MemAvailable``, else unbounded), and at most its share of the whole where ``sharing`` slots share
    the device (the launcher's ``jobs_per_device``: populations that start together each see what is free at their
    start, so each plans for its share only)."""
    sharing = max(1, sharing)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return min(free, total // sharing)
    info = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("MemAvailable", "MemTotal"):
                info[name] = int(value.split()[0]) * 1024
    free = info.get("MemAvailable", 2**62)
    return min(free, info["MemTotal"] // sharing) if "MemTotal" in info else free


def check_memory(trainers: Sequence[Trainer], free_bytes: int | None = None) -> None:
    """Refuse, before its first step, a population of ``trainers`` whose estimate (:func:`member_bytes` per
    member) exceeds ``free_bytes`` (None: :func:`free_memory` of their device).

    Raises:
        SettingError: naming the members, the estimate, what is free and the largest population that fits.
    """
    first = trainers[0]
    per = member_bytes(first)
    free = free_memory(first.env.device) if free_bytes is None else free_bytes
    need = per * len(trainers)
    if need > free:
        fits = free // per
        raise SettingError(
            "hydra.launcher.max_members",
            len(trainers),
            f" members need about {need / 2**30:.2f} GiB on {first.env.device} and {free / 2**30:.2f} GiB are "
            f"free: at most {fits} fit (hydra.launcher.max_members={max(fits, 1)})",
        )


def _check_members(trainers: Sequence[Trainer]) -> None:
    """Raise :class:`~rlchain.settings.SettingError` where ``trainers`` cannot train as one population."""
    first = trainers[0]
    if not isinstance(first.env, TorchVecEnv):
        raise SettingError(
            "env",
            type(first.env).__name__,
            " cannot hold a population: its members' envs run as one torch-native task (push_cube, cart_pole)",
        )
    env_settings = _without(dataclasses.asdict(first.env.cfg), ("seed",))
    trainer_settings = _without(dataclasses.asdict(first.cfg), MEMBER_TRAINER_SETTINGS)
    for other in trainers[1:]:
        if (
            type(other.env) is not type(first.env)
            or _without(dataclasses.asdict(other.env.cfg), ("seed",)) != env_settings
        ):
            raise SettingError("env", type(other.env).__name__, " differs between members: expected one env's settings")
        mine = _without(dataclasses.asdict(other.cfg), MEMBER_TRAINER_SETTINGS)
        if mine != trainer_settings:
            key = next(k for k in mine if mine[k] != trainer_settings[k])
            raise SettingError(
                f"trainer.{key}", [trainer_settings[key], mine[key]], " differs between members: expected one value"
            )


def _without(settings: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if k not in names}
