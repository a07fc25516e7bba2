"""rlchain's PPO against rsl_rl's PPO on PushCube, with the push_cube_ppo preset's settings on both sides.

Usage::

    pip install -e ".[bench]"                                  # rsl-rl-lib, pinned
    python benchmarks/vs_rsl_rl.py [--seeds 0 1] [--iterations 400] [--device cpu] [--num-envs N] [--compile] [--out DIR]
    python benchmarks/vs_rsl_rl.py --side rsl_rl --seed S --out DIR [--iterations N] [--device D] [--num-envs N]

The default mode is the benchmark (issue 14's speed bar); ``--side rsl_rl``
is one rsl_rl run, which the benchmark starts as a subprocess.

What runs. Both sides read one configuration: the composed
``experiment=push_cube_ppo`` of ``rlchain-train`` with ``seed``, ``device``
and (when given) ``trainer.iterations`` and ``env.num_envs``:

* rlchain: ``rlchain-train experiment=push_cube_ppo seed=S device=D
  trainer.output_dir=DIR hydra.run.dir=DIR trainer.progress=false [...]`` as a
  subprocess (``+experiment=push_cube_ppo`` with an rlchain whose train.yaml
  has no ``experiment`` slot yet); its ``metrics.jsonl`` (one row per iteration) gives
  ``time/collect_s``, ``time/update_s`` and, every ``eval_freq`` iterations,
  ``eval/success_rate`` at ``eval/global_step``.
* rsl_rl: this file with ``--side rsl_rl``. It builds the env as
  ``rlchain.commands.train.build`` does (``instantiate(cfg.env)``: ``PushCubeEnv`` with
  ``num_envs`` 512 and ``seed=S``), seeds torch's global RNG with S before
  building and again before training (as rlchain's ``train`` and ``Trainer``
  do), wraps the env in rsl_rl's ``VecEnv`` (observations a TensorDict with
  one group ``"policy"`` for actor and critic, ``dones = terminated |
  truncated``, ``extras["time_outs"] = truncated``) and runs rsl_rl's own
  ``OnPolicyRunner.learn`` unmodified, with a log directory (TensorBoard, as
  in any rsl_rl run; rlchain writes TensorBoard too). The runner hands each
  iteration's ``collect_time`` and ``learn_time`` to its logger; a wrapper
  around ``logger.log`` records them and evaluates every ``eval_freq``
  iterations (and after the last), with rlchain's own deterministic
  ``evaluate(env, policy, num_episodes=256, seed=S + 1)`` on a separate
  ``PushCubeEnv(num_envs=256, seed=S + 1)`` (rlchain's evaluation env and
  protocol), through a small adapter module (the actor's mean as the
  deterministic action). It writes the same per-iteration rows as rlchain's
  ``metrics.jsonl`` (same key names) to ``DIR/metrics.jsonl``.

How it measures. For each seed both sides run at the same time, each with
one thread (``OMP_NUM_THREADS=1 MKL_NUM_THREADS=1``; the rsl_rl side also
calls ``torch.set_num_threads(1)``), pinned with ``taskset -c`` to separate
cores; the cores are swapped between seeds (seed index 0: rlchain on core 0,
rsl_rl on core 1; index 1 the other way round), so a faster core favours
neither side over a pair of seeds. On CUDA (``--device cuda``) the two sides
run one after the other instead: two processes on one GPU would time-slice
it and measure each other. Both sides time an iteration the same way: the
wall time of the collection phase (rlchain ``time/collect_s``: the rollout,
episode statistics and the bootstrap values of the last and final
observations; rsl_rl ``collect_time``: the rollout with its per-step
transition copies, NaN checks and episode bookkeeping) and of the update
phase (rlchain ``time/update_s``: GAE, the epochs and the observation
normaliser's update; rsl_rl ``learn_time``: the last-value forward, GAE,
the epochs and the normalisers' update). Evaluation, logging and
checkpoints fall outside both. Reported per seed and as the mean over the
seeds (ratios of the means):

* training SPS = env steps / (sum of collect + update seconds), and the ratio
  rlchain / rsl_rl (above 1: rlchain trains faster);
* collection and update seconds per iteration (mean), and their ratios
  rlchain / rsl_rl (below 1: rlchain is faster);
* env steps to the first evaluation with success rate >= 0.9 on each side.

With ``--compile`` the rlchain side runs with ``trainer.compile=true`` (with
``--cudagraphs``, ``trainer.cudagraphs=true`` too), each run with an empty
inductor cache of its own (``TORCHINDUCTOR_CACHE_DIR`` in its run directory),
so that it compiles from nothing, as a first run on a machine does, unless
``--inductor-cache`` names a cache to share (``benchmarks/gpu_check.py`` fills
one first). Its compilation time (``time/compile_s``) is counted in its SPS;
``SPS_without_compile`` leaves it out.

It prints a markdown table and writes ``DIR/results.json`` (``--out``; a
temporary directory by default), next to each side's run directory and log.

Settings as matched (rlchain's name -> rsl_rl's):

* policy: actor and critic MLPs hidden_sizes [128, 128] ELU -> ``MLPModel``
  hidden_dims [128, 128] "elu"; Gaussian with a state-independent learnable
  log-std, init_log_std -0.5 -> ``GaussianDistribution(std_type="log",
  init_std=exp(-0.5))``; log_std bounds [-5, 2] -> ``std_range=(exp(-5),
  exp(2))``; obs_normalization -> ``obs_normalization=True`` on actor and critic;
* rollout_steps 32 -> num_steps_per_env 32; n_epochs 5 -> num_learning_epochs
  5; batch_size 2048 -> num_mini_batches = num_envs * rollout_steps / 2048
  (8 at 512 envs); learning_rate 1e-3 with lr_schedule constant -> schedule
  "fixed" (desired_kl None); gamma 0.99, gae_lambda 0.95 -> lam 0.95;
  clip_coef 0.2 -> clip_param 0.2; clip_vloss -> use_clipped_value_loss;
  ent_coef 0.01 -> entropy_coef 0.01; max_grad_norm 1.0; norm_adv (over the
  whole rollout) -> normalize_advantage_per_mini_batch=False (rsl_rl then
  normalises over the rollout, as rlchain: (A - mean) / (std + 1e-8));
* vf_coef 0.5 -> value_loss_coef 0.25: rlchain's value loss is
  ``vf_coef * 0.5 * mean(max(sq, clipped sq))``, rsl_rl's is
  ``value_loss_coef * mean(max(sq, clipped sq))`` without the 0.5, so 0.25
  gives the same loss and gradient (0.5 would weigh the value loss twice);
* both store the unclipped Gaussian sample and its log-probability; the env
  clips the action to [-1, 1]. No mixed precision; no ``torch.compile`` but
  rlchain's with ``--compile``.

Settings that cannot be matched exactly (what each side does):

* time-out bootstrap: rlchain bootstraps a truncated transition with
  ``gamma * V(final_obs)``, the value of the state the episode was cut in
  (the env's ``info["final_obs"]``; one critic forward over the done rows per
  rollout), and a terminated one with 0. rsl_rl adds ``gamma * V(s_t)``, the
  value of the state the last action was taken in, to the reward of a
  time-out step and then treats it as terminal; it never sees ``final_obs``.
* when the observation normaliser learns: rlchain once per rollout, after the
  update, with the rollout's observations; rsl-rl-lib 5.4.2 (the release the
  bench extra pins, mjlab's) at every step while acting, in
  ``process_env_step`` (5.5 moved it to the end of ``PPO.update``, as
  rlchain; the numbers in benchmarks/README.md up to the mjlab extra were
  measured with 5.5.1);
* observation normalisation formula: rlchain ``clamp((x - mean) / sqrt(var +
  1e-8), -10, 10)``, one normaliser shared by actor and critic; rsl_rl ``(x -
  mean) / (sqrt(var) + 1e-2)``, not clipped, one normaliser in each of actor
  and critic (fed the same data, so with the same statistics).
* gradient clipping: rlchain clips the global norm of all parameters (actor,
  log-std and critic together) to 1.0; rsl_rl clips the actor's (log-std
  included) and the critic's separately, each to 1.0.
* Adam: rlchain eps 1e-5; rsl_rl torch's default 1e-8 (its config names only
  the optimiser). One Adam over all parameters on both sides.
* weight initialisation: rlchain orthogonal (gain sqrt(2) in hidden layers,
  0.01 for the actor head, 1 for the critic head), zero biases; rsl_rl
  torch's default ``nn.Linear`` initialisation (Kaiming-uniform weights,
  uniform biases).
* log-std bounds: both clamp the log-std to [-5, 2]; rlchain's clamp passes
  the gradient that moves a log-std back into range, rsl_rl's plain clamp has
  zero gradient outside it (the same while it stays inside, as here).
* minibatches: rlchain draws a new permutation for every epoch from its own
  generator seeded with the seed; rsl_rl draws one permutation per update
  (torch's global RNG) and reuses the same 8 minibatches, in the same order,
  for all 5 epochs.
* random streams: rlchain samples actions from torch's global RNG and
  permutes from a separate generator; rsl_rl uses the global RNG for both
  (and for its weight initialisation, like rlchain). Same seed, different
  streams: the runs are not the same run.
* per-step checks: rsl_rl's runner checks observations, rewards and dones for
  NaN at every step (``check_for_nan``, its default, in collection time);
  rlchain checks only what the env checks (the action, on both sides).
* clocks: rlchain times with ``time.perf_counter``, rsl_rl with ``time.time``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

PRESET = "push_cube_ppo"
BAR = 0.9
#: rlchain's activation names -> rsl_rl's (``rsl_rl.utils.resolve_nn_activation``).
ACTIVATIONS = {"relu": "relu", "elu": "elu", "tanh": "tanh", "gelu": "gelu", "silu": "swish", "leaky_relu": "lrelu"}


def experiment_override() -> str:
    """``experiment=push_cube_ppo``, or ``+experiment=push_cube_ppo`` for an rlchain whose train.yaml has no experiment slot."""
    from hydra.errors import ConfigCompositionException

    try:
        compose_config([f"experiment={PRESET}"])
    except ConfigCompositionException:  # rlchain before the slot: the preset is appended
        return f"+experiment={PRESET}"
    return f"experiment={PRESET}"


def overrides(experiment: str, seed: int, device: str, iterations: int | None, num_envs: int | None) -> list[str]:
    """The Hydra overrides that both sides compose their configuration from."""
    out = [experiment, f"seed={seed}", f"device={device}"]
    if iterations is not None:
        out.append(f"trainer.iterations={iterations}")
    if num_envs is not None:
        out.append(f"env.num_envs={num_envs}")
    return out


def compose_config(hydra_overrides: list[str]):
    """The configuration ``rlchain-train`` would compose from ``hydra_overrides``."""
    from hydra import compose, initialize_config_module

    import rlchain.commands.config  # noqa: F401  (registers the schemas the YAML options extend, as rlchain.commands.train does)

    with initialize_config_module("rlchain.conf", version_base="1.3"):
        return compose("train", overrides=hydra_overrides)


# ------------------------------------------------------------------ rsl_rl side
def rsl_rl_train_cfg(cfg) -> dict[str, Any]:
    """rsl_rl's ``OnPolicyRunner`` configuration for rlchain's composed ``cfg`` (see the module docstring).

    Raises:
        ValueError: an rlchain setting this translation does not match (layer
            norm, a learning-rate schedule other than constant, a KL stop, no
            advantage normalisation, a minibatch size that does not divide the
            rollout).
    """
    from omegaconf import OmegaConf

    algo = OmegaConf.to_container(cfg.algorithm, resolve=True)
    policy = OmegaConf.to_container(cfg.policy, resolve=True)
    num_envs, steps = int(cfg.env.num_envs), int(cfg.trainer.rollout_steps)
    if policy["layer_norm"]:
        raise ValueError("policy.layer_norm=true has no rsl_rl MLPModel counterpart")
    if not algo["norm_adv"]:
        raise ValueError("algorithm.norm_adv=false has no rsl_rl counterpart (rsl_rl always normalises advantages)")
    if algo["lr_schedule"] != "constant" or algo.get("stop_at_target_kl"):
        # rsl_rl's adaptive rule adapts after every minibatch, rlchain's after every update; it has no KL stop.
        raise ValueError("only algorithm.lr_schedule=constant without stop_at_target_kl is matched (rsl_rl's 'fixed')")
    if (num_envs * steps) % algo["batch_size"]:
        raise ValueError(f"batch_size={algo['batch_size']} does not divide the rollout's {num_envs * steps} samples")
    mlp = {
        "class_name": "MLPModel",
        "hidden_dims": list(policy["hidden_sizes"]),
        "activation": ACTIVATIONS[policy["activation"]],
        "obs_normalization": bool(policy["obs_normalization"]),
    }
    actor = dict(
        mlp,
        distribution_cfg={
            "class_name": "GaussianDistribution",
            "init_std": math.exp(policy["init_log_std"]),
            "std_type": "log",
            "std_range": (math.exp(policy["log_std_min"]), math.exp(policy["log_std_max"])),
        },
    )
    return {
        "num_steps_per_env": steps,
        "save_interval": int(cfg.trainer.iterations) + 1,  # model_0.pt and the final model only
        "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
        "actor": actor,
        "critic": dict(mlp),
        "algorithm": {
            "class_name": "PPO",
            "num_learning_epochs": algo["n_epochs"],
            "num_mini_batches": num_envs * steps // algo["batch_size"],
            "clip_param": algo["clip_coef"],
            "gamma": algo["gamma"],
            "lam": algo["gae_lambda"],
            "value_loss_coef": 0.5 * algo["vf_coef"],  # rlchain's value loss carries a factor 0.5, rsl_rl's does not
            "entropy_coef": algo["ent_coef"],
            "learning_rate": algo["learning_rate"],
            "max_grad_norm": algo["max_grad_norm"],
            "optimizer": "adam",
            "use_clipped_value_loss": algo["clip_vloss"],
            "schedule": "fixed",
            "desired_kl": None,
            "normalize_advantage_per_mini_batch": False,
        },
    }


def _rsl_rl_classes():
    """rsl_rl's VecEnv and the two classes built on it here (imported only on the rsl_rl side)."""
    import torch
    from rsl_rl.env import VecEnv
    from tensordict import TensorDict

    class RslRlVecEnv(VecEnv):
        """An rlchain ``VecEnv`` (same-step auto-reset) behind rsl_rl's ``VecEnv`` interface.

        Observations: TensorDict ``{"policy": [N, obs_dim]}``. ``step`` returns
        ``(obs, reward [N], dones [N] long, extras)`` with ``dones = terminated |
        truncated`` and ``extras["time_outs"] = truncated`` (bool ``[N]``), which
        rsl_rl's PPO bootstraps with ``gamma * V(s_t)``.
        """

        def __init__(self, env: Any) -> None:
            self.env = env
            self.num_envs = env.num_envs
            self.num_actions = int(env.single_action_space.shape[0])
            self.max_episode_length = int(env.max_episode_steps)
            self.device = env.device
            self.cfg = {"env": type(env).__name__, "num_envs": env.num_envs}
            obs, _ = env.reset()  # as rlchain's collector: no seed, the env's own generator
            self._obs = self._group(obs)

        @property
        def episode_length_buf(self) -> torch.Tensor:
            return self.env.elapsed_steps

        @episode_length_buf.setter
        def episode_length_buf(self, value: torch.Tensor) -> None:
            raise NotImplementedError("init_at_random_ep_len is not supported")

        def _group(self, obs: torch.Tensor) -> TensorDict:
            return TensorDict({"policy": obs}, batch_size=[self.num_envs], device=self.device)

        def get_observations(self) -> TensorDict:
            return self._obs

        def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict]:
            obs, reward, terminated, truncated, _ = self.env.step(actions)
            self._obs = self._group(obs)
            return self._obs, reward, (terminated | truncated).long(), {"time_outs": truncated}

    class RslRlPolicy(torch.nn.Module):
        """rsl_rl's actor and critic behind rlchain's TensorDict policy interface (for ``evaluate``)."""

        def __init__(self, actor: torch.nn.Module, critic: torch.nn.Module, group: str | None = "policy") -> None:
            super().__init__()
            self.actor, self.critic, self.group = actor, critic, group

        def get_action(self, td: TensorDict, deterministic: bool = False) -> TensorDict:
            """Write ``action`` (the actor's mean when ``deterministic``), ``sample_log_prob`` and ``value`` ``[B]``.

            ``td["obs"]`` is one flat observation, given to rsl_rl as its group ``group``, or (``group`` None) a
            TensorDict of groups already named as the runner's ``obs_groups`` name them.
            """
            obs = td["obs"] if self.group is None else TensorDict({self.group: td["obs"]}, batch_size=td.batch_size)
            if deterministic:
                action = self.actor(obs)  # the mean; draws nothing from the RNG
                self.actor.distribution.update(action)
            else:
                action = self.actor(obs, stochastic_output=True)
            td["action"] = action
            td["sample_log_prob"] = self.actor.get_output_log_prob(action)
            td["value"] = self.critic(obs).squeeze(-1)
            return td

    return RslRlVecEnv, RslRlPolicy


def run_rsl_rl(seed: int, out: Path, device: str, iterations: int | None, num_envs: int | None) -> None:
    """Train rsl_rl's PPO on rlchain's PushCube and write ``out/metrics.jsonl`` (keys as rlchain's)."""
    import torch
    from hydra.utils import instantiate
    from rsl_rl.runners import OnPolicyRunner

    try:
        from rlchain.core.evaluation import evaluate
    except ImportError:
        from rlchain.run.trainer import evaluate

    torch.set_num_threads(1)
    cfg = compose_config(overrides(experiment_override(), seed, device, iterations, num_envs))
    train_cfg = rsl_rl_train_cfg(cfg)
    total = int(cfg.trainer.iterations)
    eval_freq, episodes = int(cfg.trainer.eval_freq), int(cfg.trainer.num_eval_episodes)
    out.mkdir(parents=True, exist_ok=True)

    RslRlVecEnv, RslRlPolicy = _rsl_rl_classes()
    torch.manual_seed(cfg.seed)  # as rlchain.commands.train.train, before anything is built
    env = instantiate(cfg.env, _convert_="all")  # as rlchain.commands.train.build: seed=cfg.seed
    eval_env = instantiate(cfg.env, _partial_=True, _convert_="all")(
        num_envs=int(cfg.trainer.num_eval_envs), seed=seed + 1
    )
    runner = OnPolicyRunner(RslRlVecEnv(env), train_cfg, log_dir=str(out / "log"), device=str(env.device))
    policy = RslRlPolicy(runner.alg.actor, runner.alg.critic)
    steps_per_iteration = env.num_envs * train_cfg["num_steps_per_env"]
    metrics = record_iterations(
        runner,
        out / "metrics.jsonl",
        steps_per_iteration,
        total,
        eval_freq,
        lambda: evaluate(eval_env, policy, num_episodes=episodes, seed=seed + 1),
    )
    torch.manual_seed(cfg.seed)  # as rlchain's Trainer, before the first rollout
    runner.learn(num_learning_iterations=total)
    metrics.close()


def record_iterations(
    runner: Any, path: Path, steps_per_iteration: int, total: int, eval_freq: int, evaluate_policy: Any
) -> Any:
    """Make an rsl_rl runner write rlchain's ``metrics.jsonl`` rows to ``path``; returns the open file (close it
    after ``learn``).

    A wrapper around the runner's ``logger.log``, which it calls after ``learn_time`` was measured and before the
    next iteration's clock starts, writes each iteration's ``time/collect_s`` and ``time/update_s`` and, every
    ``eval_freq`` iterations and after the last (``total``), the ``eval/`` means of ``evaluate_policy()`` (an
    rlchain ``evaluate`` result). The runner stores no git diff: rsl_rl is an installed package, not a checkout.
    """
    log = runner.logger.log
    metrics = path.open("w")

    def log_and_evaluate(**kwargs: Any) -> None:
        log(**kwargs)
        iteration = kwargs["it"] + 1
        row: dict[str, Any] = {
            "global_step": iteration * steps_per_iteration,
            "charts/iteration": iteration,
            "time/collect_s": kwargs["collect_time"],
            "time/update_s": kwargs["learn_time"],
        }
        if iteration % eval_freq == 0 or iteration == total:
            start = time.perf_counter()
            row.update({f"eval/{k}": v for k, v in evaluate_policy().means().items()})
            row["eval/global_step"] = row["global_step"]
            row["time/eval_s"] = time.perf_counter() - start
        metrics.write(json.dumps(row) + "\n")
        metrics.flush()

    runner.logger.log = log_and_evaluate
    runner.logger.git_status_repos.clear()
    return metrics


# ------------------------------------------------------------------ benchmark
def read_run(path: Path) -> dict[str, Any]:
    """Totals of one side's ``metrics.jsonl``: env steps, collect/update seconds, SPS, steps to eval success 0.9."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        raise RuntimeError(f"{path} has no rows")
    collect = sum(r["time/collect_s"] for r in rows)
    update = sum(r["time/update_s"] for r in rows)
    compile_s = sum(r.get("time/compile_s", 0.0) for r in rows)  # trainer.compile: logged once
    steps = rows[-1]["global_step"]
    evals = [r for r in rows if "eval/success_rate" in r]
    reached = next((r for r in evals if r["eval/success_rate"] >= BAR), None)
    return {
        "iterations": len(rows),
        "env_steps": steps,
        "collect_s": collect,
        "update_s": update,
        "compile_s": compile_s,
        "SPS": steps / (collect + update + compile_s),
        "SPS_without_compile": steps / (collect + update),
        "collect_s_per_iter": collect / len(rows),
        "update_s_per_iter": update / len(rows),
        f"steps_to_{BAR}": reached.get("eval/global_step", reached["global_step"]) if reached else None,
        "final_eval_success": evals[-1]["eval/success_rate"] if evals else None,
        "best_eval_success": max(r["eval/success_rate"] for r in evals) if evals else None,
    }


def ratios(rl: dict[str, Any], rsl: dict[str, Any]) -> dict[str, float]:
    """rlchain / rsl_rl of SPS (with and without rlchain's compile time) and of the per-iteration collect and update
    seconds."""
    keys = ("SPS", "SPS_without_compile", "collect_s_per_iter", "update_s_per_iter")
    return {key: rl[key] / rsl[key] for key in keys}


def launch(cmd: list[str], core: int, log_path: Path, **environ: str) -> subprocess.Popen:
    """Start ``cmd`` with one thread and ``environ``, pinned to ``core``, its output to ``log_path``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **environ)
    full = ["taskset", "-c", str(core), *cmd] if shutil.which("taskset") else cmd
    print(f"  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 {shlex.join(full)}  > {log_path}", flush=True)
    log = log_path.open("w")
    proc = subprocess.Popen(full, env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    proc.log_path = log_path  # type: ignore[attr-defined]
    return proc


def finish(proc: subprocess.Popen, name: str) -> None:
    """Wait for ``proc``; raise with the tail of its log if it failed."""
    if proc.wait() != 0:
        log_path: Path = proc.log_path  # type: ignore[attr-defined]
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-30:])
        raise RuntimeError(f"{name} exited with {proc.returncode}; last lines of {log_path}:\n{tail}")


def git_state() -> dict[str, Any]:
    """Where the rlchain that the rlchain side imports lives, its commit and whether its src/ or conf/ has changes."""
    import importlib.util

    spec = importlib.util.find_spec("rlchain")  # finds the package without importing it
    root = Path(spec.origin).resolve().parents[2] if spec and spec.origin else Path(__file__).resolve().parents[1]
    state: dict[str, Any] = {"rlchain_root": str(root)}

    def git(*cmd: str) -> str:
        return subprocess.run(["git", *cmd], cwd=root, capture_output=True, text=True, check=True).stdout.strip()

    try:
        state.update(
            commit=git("rev-parse", "HEAD"),
            src_or_conf_modified=bool(git("status", "--porcelain", "--", "src", "conf")),
        )
    except (OSError, subprocess.CalledProcessError):
        pass  # not a git checkout (an exported tree): the root says which
    return state


def mean(values: list[float | None]) -> float | None:
    """The mean, or None when a value is missing (a seed that never reached the bar)."""
    return None if not values or any(v is None for v in values) else sum(values) / len(values)  # type: ignore[arg-type]


def benchmark(args: argparse.Namespace) -> None:
    """Run both sides for every seed, print the table and write ``results.json``."""
    out = (args.out or Path(tempfile.mkdtemp(prefix="rlchain-vs-rsl-rl-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    taken = [p for s in args.seeds for p in (out / f"rlchain_seed{s}", out / f"rsl_rl_seed{s}") if p.exists()]
    if taken:
        raise SystemExit(f"{taken[0]} exists: choose a new --out")
    cpus = sorted(os.sched_getaffinity(0))
    cores = cpus[:2] if len(cpus) >= 2 else cpus * 2
    train = shutil.which("rlchain-train")
    train_cmd = [train] if train else [sys.executable, "-m", "rlchain"]
    concurrent = args.device == "cpu"
    experiment = experiment_override()
    print(
        f"rsl-rl-lib {metadata.version('rsl-rl-lib')}, runs in {out}; sides run "
        f"{'at the same time on cores ' + str(cores) if concurrent else 'one after the other'}",
        flush=True,
    )

    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    for index, seed in enumerate(args.seeds):
        rl_dir, rsl_dir = out / f"rlchain_seed{seed}", out / f"rsl_rl_seed{seed}"
        common = overrides(experiment, seed, args.device, args.iterations, args.num_envs)
        rl_cmd = [
            *train_cmd,
            *common,
            f"trainer.output_dir={rl_dir}",
            f"hydra.run.dir={rl_dir}",
            "trainer.progress=false",
        ]
        rl_environ = {}
        if args.compile or args.cudagraphs:
            rl_cmd.append("trainer.compile=true")
            # compiles from nothing, as a first run on a machine does, unless told which cache to share
            cache = args.inductor_cache or out / f"inductor_cache_seed{seed}"
            rl_environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
        if args.cudagraphs:
            rl_cmd.append("trainer.cudagraphs=true")
        rsl_cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--side",
            "rsl_rl",
            "--seed",
            str(seed),
            "--out",
            str(rsl_dir),
            "--device",
            args.device,
        ]
        if args.iterations is not None:
            rsl_cmd += ["--iterations", str(args.iterations)]
        if args.num_envs is not None:
            rsl_cmd += ["--num-envs", str(args.num_envs)]
        rl_core, rsl_core = (cores[0], cores[1]) if index % 2 == 0 else (cores[1], cores[0])
        print(f"seed {seed}:", flush=True)
        start = time.perf_counter()
        rl = launch(rl_cmd, rl_core, out / f"rlchain_seed{seed}.log", **rl_environ)
        if not concurrent:
            finish(rl, "rlchain")
        rsl = launch(rsl_cmd, rsl_core, out / f"rsl_rl_seed{seed}.log")
        finish(rl, "rlchain")
        finish(rsl, "rsl_rl")
        rl_res, rsl_res = read_run(rl_dir / "metrics.jsonl"), read_run(rsl_dir / "metrics.jsonl")
        results[str(seed)] = {
            "rlchain": dict(rl_res, core=rl_core, command=shlex.join(rl_cmd)),
            "rsl_rl": dict(rsl_res, core=rsl_core, command=shlex.join(rsl_cmd)),
            "ratio_rlchain_over_rsl_rl": ratios(rl_res, rsl_res),
        }
        print(f"  done in {time.perf_counter() - start:.0f} s", flush=True)

    keys = (
        "SPS",
        "SPS_without_compile",
        "compile_s",
        "collect_s_per_iter",
        "update_s_per_iter",
        f"steps_to_{BAR}",
        "final_eval_success",
    )
    mean_row = {
        side: {k: mean([results[str(s)][side][k] for s in args.seeds]) for k in keys} for side in ("rlchain", "rsl_rl")
    }
    mean_row["ratio_rlchain_over_rsl_rl"] = ratios(mean_row["rlchain"], mean_row["rsl_rl"])
    import torch

    report = {
        "experiment": experiment,
        "seeds": args.seeds,
        "iterations": args.iterations,
        "device": args.device,
        "num_envs": args.num_envs,
        "compile": args.compile or args.cudagraphs,
        "cudagraphs": args.cudagraphs,
        "concurrent": concurrent,
        "rsl_rl_lib": metadata.version("rsl-rl-lib"),
        "torch": torch.__version__,
        "git": git_state(),
        "load_average_before_after": [load_before, os.getloadavg()],  # 1, 5, 15 min: other work on the machine
        "per_seed": results,
        "mean": mean_row,
    }
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    print_table(results, mean_row, args.seeds)
    print(f"\nresults: {out / 'results.json'}")


def print_table(results: dict[str, Any], mean_row: dict[str, Any], seeds: list[int]) -> None:
    """The markdown table: one row per seed and the mean (a mean of steps only when every seed reached the bar)."""

    def steps(value: float | None, name: str) -> str:
        return f"{value / 1e6:.2f}M" if value is not None else "not reached" if name != "mean" else "n/a"

    print(
        "\n| seed | SPS rlchain | SPS rsl_rl | ratio | compile s rlchain | collect s/iter rlchain | rsl_rl | ratio "
        f"| update s/iter rlchain | rsl_rl | ratio | steps to {BAR} rlchain | rsl_rl |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = [(str(s), results[str(s)]) for s in seeds] + [("mean", mean_row)]
    for name, r in rows:
        rl, rsl, ratio = r["rlchain"], r["rsl_rl"], r["ratio_rlchain_over_rsl_rl"]
        print(
            f"| {name} | {rl['SPS']:,.0f} | {rsl['SPS']:,.0f} | {ratio['SPS']:.2f} | {rl['compile_s']:.1f} "
            f"| {rl['collect_s_per_iter']:.3f} | {rsl['collect_s_per_iter']:.3f} | {ratio['collect_s_per_iter']:.2f} "
            f"| {rl['update_s_per_iter']:.3f} | {rsl['update_s_per_iter']:.3f} | {ratio['update_s_per_iter']:.2f} "
            f"| {steps(rl[f'steps_to_{BAR}'], name)} | {steps(rsl[f'steps_to_{BAR}'], name)} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--side", choices=["rsl_rl"], default=None, help="run one rsl_rl training (used by the benchmark)"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--seed", type=int, default=0, help="with --side rsl_rl")
    parser.add_argument("--iterations", type=int, default=None, help="default: the preset's (400)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the sides then run one after the other)")
    parser.add_argument("--num-envs", type=int, default=None, help="default: the preset's (512); e.g. 4096 on cuda")
    parser.add_argument(
        "--compile", action="store_true", help="rlchain with trainer.compile=true, compiling from an empty cache"
    )
    parser.add_argument(
        "--cudagraphs", action="store_true", help="rlchain with trainer.compile=true trainer.cudagraphs=true (CUDA)"
    )
    parser.add_argument(
        "--inductor-cache",
        type=Path,
        default=None,
        help="with --compile or --cudagraphs: this inductor cache directory (default: an empty one per run)",
    )
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: a temp dir)")
    args = parser.parse_args()
    if args.side == "rsl_rl":
        if args.out is None:
            parser.error("--side rsl_rl needs --out")
        run_rsl_rl(args.seed, args.out, args.device, args.iterations, args.num_envs)
    else:
        benchmark(args)


if __name__ == "__main__":
    main()
