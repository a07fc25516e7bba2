"""Deterministic evaluation of a policy: whole episodes from seeded start states, each episode's outcome kept.

:func:`evaluate` runs the episodes and returns an :class:`Evaluation`: the
return, length, success and task metrics of every episode, their means (what
training logs under ``eval/``) and their 95% confidence intervals
(:meth:`Evaluation.intervals`, what ``rlchain-eval`` prints and
``summary.json``'s ``best_fresh`` records), and optionally the frames of the
first episodes (a video).

Seeds: the evaluations during training all start from the start states of
``trainer.seed + 1``; :func:`fresh_seed` names start states that none of them
used, for the final score of ``best.pt`` and ``rlchain-eval``'s default.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from rlchain.console import error_line
from rlchain.core.envs.base import VecEnv
from rlchain.core.policies import Policy
from rlchain.core.stepping import EnvStepper, check_actions
from rlchain.settings import SettingError
from rlchain.utils import MAX_SEED

__all__ = ["FRESH_SEED_OFFSET", "Evaluation", "Interval", "check_renders", "evaluate", "fresh_seed"]

#: :func:`fresh_seed` adds this to a run's seed: far from ``seed + 1 .. seed + num_envs``, the reset seeds of the
#: evaluations during training (env ``i`` of ``env=gym`` is seeded with base + i).
FRESH_SEED_OFFSET = 2**31
#: z of a two-sided 95% normal interval.
_Z95 = statistics.NormalDist().inv_cdf(0.975)


def fresh_seed(run_seed: int) -> int:
    """The evaluation seed whose start states no evaluation during the run of ``run_seed`` used.

    Those used ``run_seed + 1`` (for ``env=gym``: the envs' seeds ``run_seed + 1 ..
    run_seed + num_eval_envs``); this is ``run_seed + 2**31`` modulo ``2**32``.
    """
    return (int(run_seed) + FRESH_SEED_OFFSET) % (MAX_SEED + 1)


@dataclass
class Interval:
    """A metric over ``n`` episodes: ``mean``, sample ``std`` (n - 1; 0 for one episode) and a 95% confidence
    interval ``[ci95_low, ci95_high]`` of the mean (None for one episode: nothing to estimate a spread from).

    The interval is Student's t, ``mean ± t(0.975, n - 1) std / sqrt(n)``; for
    a success rate (0/1 outcomes) it is the Wilson score interval (Wilson
    1927), which stays inside [0, 1] and keeps a width when every episode
    succeeded or failed.
    """

    mean: float
    std: float
    ci95_low: float | None
    ci95_high: float | None
    n: int

    @classmethod
    def of(cls, values: np.ndarray, binary: bool = False) -> Interval:
        """The interval of ``values`` (float ``[n]``, n >= 1); ``binary``: 0/1 outcomes (Wilson interval)."""
        values = np.asarray(values, dtype=np.float64)
        n = int(values.size)
        mean = float(values.mean())
        std = float(values.std(ddof=1)) if n > 1 else 0.0
        if binary:
            z2 = _Z95**2
            centre = (mean + z2 / (2 * n)) / (1 + z2 / n)
            half = _Z95 * math.sqrt(mean * (1 - mean) / n + z2 / (4 * n * n)) / (1 + z2 / n)
            return cls(mean, std, max(0.0, centre - half), min(1.0, centre + half), n)
        if n < 2:
            return cls(mean, std, None, None, n)
        from scipy.special import stdtrit  # the t quantile; scipy.stats would take three times as long to import

        half = float(stdtrit(n - 1, 0.975)) * std / math.sqrt(n)
        return cls(mean, std, mean - half, mean + half, n)


@dataclass
class Evaluation:
    """The outcome of every episode of one :func:`evaluate` call (numpy arrays on the host, ``[episodes]`` each).

    Attributes:
        returns: undiscounted episode returns, float64.
        lengths: episode lengths in steps, float64.
        successes: whether each episode's last step reported success, bool;
            None for an env whose ``reports_success`` is false.
        metrics: each task metric's value at each episode's last step
            (e.g. the final ``distance_to_goal``, m), float64.
        seed: the reset seed of the evaluation (a list: each member's, of a task split into members).
        deterministic: whether actions were the policy's deterministic ones.
        frames: the video, uint8 ``[T, H, W, 3]``: the first episode of
            each of the first ``video_episodes`` envs, one after another, one
            frame per action (the state the policy acted in); None unless
            requested.
        fps: frames per second of ``frames`` (the env's ``render_fps``).
        video_lengths: the number of frames of each recorded episode.
    """

    returns: np.ndarray
    lengths: np.ndarray
    successes: np.ndarray | None
    metrics: dict[str, np.ndarray]
    seed: int | list[int]
    deterministic: bool = True
    frames: np.ndarray | None = None
    fps: float = 30.0
    video_lengths: list[int] = field(default_factory=list)
    env_count: int = 0
    """The envs the episodes ran on (episode ``k`` of env ``i`` is episode ``k * env_count + i``)."""

    @property
    def episodes(self) -> int:
        """Number of episodes."""
        return int(self.returns.size)

    def means(self) -> dict[str, float]:
        """The means training logs (as ``eval/<key>``): ``avg_reward``, ``avg_length``, ``success_rate`` (for an
        env that reports success), ``episodes`` and every task metric."""
        out = {"avg_reward": float(self.returns.mean()), "avg_length": float(self.lengths.mean())}
        if self.successes is not None:
            out["success_rate"] = float(self.successes.mean())
        out["episodes"] = float(self.episodes)
        out.update({name: float(values.mean()) for name, values in self.metrics.items()})
        return out

    def intervals(self) -> dict[str, Interval]:
        """:class:`Interval` of ``avg_reward`` (return), ``avg_length``, ``success_rate`` and every task metric,
        keyed as :meth:`means`."""
        out = {"avg_reward": Interval.of(self.returns), "avg_length": Interval.of(self.lengths)}
        if self.successes is not None:
            out["success_rate"] = Interval.of(self.successes, binary=True)
        out.update({name: Interval.of(values) for name, values in self.metrics.items()})
        return out

    def split_into_members(self, members: int, seeds: list[int]) -> list[Evaluation]:
        """The evaluation of a task split into ``members`` (:meth:`~rlchain.core.envs.base.TorchVecEnv.split_into_members`:
        member ``p`` owns envs ``[p * n, (p + 1) * n)`` of the ``members * n``) as each member's own, its episodes
        in the order its own evaluation of ``n`` envs lists them, and its reset seed ``seeds[p]`` (no video).

        Raises:
            ValueError: an evaluation with a video, or whose envs do not split into ``members`` equal parts.
        """
        if self.frames is not None:
            raise ValueError("an evaluation with a video does not split into members")
        total, envs = self.episodes, self.env_count
        if not envs or envs % members:
            raise ValueError(f"an evaluation of {envs} envs does not split into {members} members")
        n = envs // members
        # Episode k of env i is row k * envs + i; member p's own episode k of its env j is row k * n + j.
        rows = np.arange(total).reshape(total // envs, members, n).transpose(1, 0, 2).reshape(members, -1)
        return [
            Evaluation(
                returns=self.returns[r],
                lengths=self.lengths[r],
                successes=None if self.successes is None else self.successes[r],
                metrics={name: values[r] for name, values in self.metrics.items()},
                seed=seeds[p],
                deterministic=self.deterministic,
                fps=self.fps,
                env_count=n,
            )
            for p, r in enumerate(rows)
        ]

    def to_json(self) -> dict[str, Any]:
        """``{"seed", "episodes", "deterministic", "metrics": {key: Interval fields}}`` (plain JSON data)."""
        return {
            "seed": self.seed,
            "episodes": self.episodes,
            "deterministic": self.deterministic,
            "metrics": {key: asdict(value) for key, value in self.intervals().items()},
        }


@torch.no_grad()
def evaluate(
    env: VecEnv,
    policy: Policy,
    num_episodes: int,
    seed: int | list[int],
    deterministic: bool = True,
    video_episodes: int = 0,
) -> Evaluation:
    """Run whole episodes and keep each one's outcome.

    Every env of ``env`` runs ``ceil(num_episodes / num_envs)`` complete
    episodes from a reset with ``seed`` (the same seed, the same start
    states); all of them count, so there is no bias towards short episodes.
    The done counters are read once per ``max_episode_steps`` steps (on the
    CPU also every step while a video is recorded).

    Args:
        env: the evaluation env (``N = env.num_envs``).
        policy: acts with ``get_action(..., deterministic=deterministic)``;
            ``deterministic=False`` samples from torch's global RNG. A recurrent
            policy acts from each env's state, fresh (zeros) at every episode's start.
        num_episodes: episodes wanted (rounded up to a multiple of ``N``).
        seed: the reset seed (a list: each member's, for a task split into members).
        video_episodes: record the first episode of envs ``0 .. video_episodes - 1``
            with ``env.render`` (at most ``N``; 0 records nothing).

    Returns:
        an :class:`Evaluation` of ``N * ceil(num_episodes / N)`` episodes.

    Raises:
        RuntimeError: an env that does not end its episodes within
            ``max_episode_steps`` steps.
        ValueError: ``video_episodes`` above ``N``.
    """
    n, dev = env.num_envs, env.device
    if video_episodes > n:
        raise ValueError(
            f"video_episodes={video_episodes} is not allowed with {n} evaluation envs: expected at most {n}"
        )
    was_training = policy.training
    policy.eval()
    per_env = math.ceil(num_episodes / n)
    stepper = EnvStepper(env, policy, deterministic=deterministic)
    stepper.reset(seed=seed)
    finished = torch.zeros(n, dtype=torch.int64, device=dev)
    # One row per episode: episode k of env i is row k * n + i.
    ep_ret = torch.zeros(per_env * n, dtype=torch.float64, device=dev)
    ep_len, ep_succ = (torch.zeros(per_env * n, device=dev) for _ in range(2))
    ep_metrics: dict[str, torch.Tensor] = {}
    columns = torch.arange(n, device=dev)
    video = _Recorder(env, video_episodes)
    episode_limit = int(env.max_episode_steps)
    max_steps = per_env * episode_limit  # every env ends an episode at least every max_episode_steps steps
    for step in range(1, max_steps + 1):
        video.capture()
        transition = stepper.step()
        done = transition.done
        video.ended(done)
        counts = done & (finished < per_env)
        row = finished.clamp(max=per_env - 1) * n + columns
        _put(ep_ret, row, counts, transition.episode_return)
        _put(ep_len, row, counts, transition.episode_length.float())
        _put(ep_succ, row, counts, transition.info["success"].float())
        names, values = stepper.terms(transition.info, "metrics")
        for name, value in zip(names, values.unbind(-1)):
            if name not in ep_metrics:
                ep_metrics[name] = torch.zeros(per_env * n, device=dev)
            _put(ep_metrics[name], row, counts, value.float())
        stepper.advance(transition)
        finished += done.long()
        if step % episode_limit == 0:
            check_actions(env, stepper.obs)  # an env's deferred action check, read with the episodes' count
            if bool((finished >= per_env).all()):
                break
    else:
        if not bool((finished >= per_env).all()):
            raise RuntimeError(
                f"evaluation: some envs did not finish {per_env} episodes in {max_steps} steps; "
                f"does the env truncate at max_episode_steps={episode_limit}?"
            )
    if was_training:
        policy.train()
    host = lambda t: t.double().cpu().numpy()  # noqa: E731
    frames, lengths = video.result()
    return Evaluation(
        returns=host(ep_ret),
        lengths=host(ep_len),
        successes=ep_succ.cpu().numpy() > 0.5 if env.reports_success else None,
        metrics={name: host(values) for name, values in ep_metrics.items()},
        seed=[int(x) for x in seed] if isinstance(seed, list) else int(seed),
        deterministic=deterministic,
        frames=frames,
        fps=float(env.metadata.get("render_fps", 30)),
        video_lengths=lengths,
        env_count=n,
    )


def check_renders(env: VecEnv | None) -> None:
    """Render one frame of ``env``'s env 0, so that a video (``trainer.video``, ``rlchain-eval video=true``)
    fails before any step if it cannot: ``render`` must work and return uint8 ``[K, H, W, 3]``.

    Raises:
        SettingError: no evaluation env, or one whose ``render`` fails (naming
            the env and the error; for MuJoCo, what headless rendering needs).
    """
    if env is None:
        raise SettingError("video", True, " needs an evaluation env: the trainer has none")
    try:
        frames = env.render([0])
    except Exception as err:  # noqa: BLE001 - any failure to render is this setting's, said in one line
        text = repr(err).lower()
        hint = (
            "; headless MuJoCo renders with MUJOCO_GL=egl (or osmesa)" if "mujoco" in text or "opengl" in text else ""
        )
        raise SettingError(
            "video", True, f" needs an env that renders: {type(env).__name__}.render failed: {error_line(err)}{hint}"
        ) from None
    if not (
        isinstance(frames, torch.Tensor) and frames.dtype == torch.uint8 and frames.ndim == 4 and frames.shape[-1] == 3
    ):
        got = f"{getattr(frames, 'dtype', type(frames).__name__)} {tuple(getattr(frames, 'shape', ()))}"
        raise SettingError(
            "video", True, f" needs frames of uint8 [K, H, W, 3]: {type(env).__name__}.render returned {got}"
        )


def _put(target: torch.Tensor, row: torch.Tensor, mask: torch.Tensor, value: torch.Tensor) -> None:
    """``target[row[i]] = value[i]`` where ``mask[i]`` (rows of distinct envs never collide)."""
    target[row] = torch.where(mask, value, target[row])


class _Recorder:
    """The frames of the first episode of envs ``0 .. k - 1``: rendered before each step until those episodes end.

    Frames stay where ``render`` puts them until :meth:`result`. An env on the
    CPU, or one that renders on the host (``env=gym``, which steps there too),
    stops recording as soon as every recorded episode has ended; an env that
    renders on a GPU records to ``max_episode_steps`` (reading its flags would
    sync every step).
    """

    def __init__(self, env: VecEnv, k: int) -> None:
        self.env, self.k = env, k
        self.ids = list(range(k))
        self.frames: list[torch.Tensor] = []
        self.dones: list[torch.Tensor] = []
        self.seen = torch.zeros(k, dtype=torch.bool, device=env.device)
        self.active = k > 0

    def capture(self) -> None:
        if self.active:
            self.frames.append(self.env.render(self.ids))

    def ended(self, done: torch.Tensor) -> None:
        if not self.active:
            return
        self.dones.append(done[: self.k].clone())
        self.seen |= done[: self.k]
        on_host = self.env.device.type == "cpu" or self.frames[-1].device.type == "cpu"  # env=gym renders on the host
        if len(self.dones) >= self.env.max_episode_steps or (on_host and bool(self.seen.all())):
            self.active = False

    def result(self) -> tuple[np.ndarray | None, list[int]]:
        """``(frames uint8 [T, H, W, 3], frames per episode)``, or ``(None, [])`` when nothing was recorded."""
        if not self.frames:
            return None, []
        frames = torch.stack(self.frames).cpu().numpy()  # [T, k, H, W, 3]
        dones = torch.stack(self.dones).cpu().numpy()  # [T, k]
        episodes, lengths = [], []
        for j in range(self.k):
            ends = np.flatnonzero(dones[:, j])
            length = int(ends[0]) + 1 if ends.size else len(dones)
            episodes.append(frames[:length, j])
            lengths.append(length)
        return np.concatenate(episodes), lengths
