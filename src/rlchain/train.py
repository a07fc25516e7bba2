"""``rlchain-train``: compose one configuration with Hydra and train.

Usage::

    rlchain-train algorithm=grpo env=push_cube                  # one run -> outputs/<date>/<time>/
    rlchain-train env.num_envs=1024 algorithm.learning_rate=1e-3 # override any field
    rlchain-train -m algorithm=ppo,grpo seed=0,1                 # a sweep -> multirun/<date>/<time>/<job>/
    rlchain-train --help | --cfg job                             # groups and options | the composed config

The run builds env, policy (given the env's spaces), algorithm (given the
policy) and trainer with ``hydra.utils.instantiate``, trains, writes
``summary.json`` and returns the objective (``trainer.objective``, the final
eval success rate by default) for Hydra sweepers.
"""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path
from typing import Any, Iterator

import hydra
import torch
from hydra.errors import CompactHydraException, InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

import rlchain.config  # noqa: F401  (registers the schemas)
from rlchain.checkpoint import atomic_write_json
from rlchain.trainer import Trainer, run_placement
from rlchain.utils import resolve_device

__all__ = ["ConfigError", "build", "main", "train"]


class ConfigError(CompactHydraException):
    """A config value a component rejected; Hydra prints just this message (no traceback)."""


@contextlib.contextmanager
def _component(group: str) -> Iterator[None]:
    """Turn a component's ValueError into a :class:`ConfigError` naming ``group.key``."""
    try:
        yield
    except (InstantiationException, ValueError) as err:
        cause = err if isinstance(err, ValueError) else err.__cause__
        if not isinstance(cause, ValueError):
            raise
        message = str(cause)
        if group and re.match(r"^[A-Za-z_][\w\[\]]*=", message):
            message = f"{group}.{message}"
        elif group:
            message = f"{group}: {message}"
        raise ConfigError(f"Invalid config: {message}") from cause


def build(cfg: DictConfig) -> Trainer:
    """Instantiate env, policy, algorithm and trainer from a composed config.

    Raises:
        ConfigError: a value a component rejects, naming ``group.key``, the
            value and what is allowed; raised before any env step is taken.
    """
    with _component(""):
        resolve_device(cfg.device, name="device")
    with _component("env"):
        env = instantiate(cfg.env, _convert_="all")
    eval_env = instantiate(cfg.env, _partial_=True, _convert_="all")
    with _component("policy"):
        policy = instantiate(
            cfg.policy,
            observation_space=env.single_observation_space,
            action_space=env.single_action_space,
            _convert_="all",
        ).to(env.device)
    with _component("algorithm"):
        algorithm = instantiate(cfg.algorithm, policy=policy, _convert_="all")
        algorithm.check_env(env)
    config = OmegaConf.to_container(cfg, resolve=True)
    with _component("trainer"):
        return instantiate(
            cfg.trainer, env=env, policy=policy, algorithm=algorithm, eval_env=eval_env, run_config=config,
            _convert_="all", _recursive_=False,  # run_config holds _target_ keys: keep it data
        )


def train(cfg: DictConfig) -> dict[str, Any]:
    """Seed, build and train; print and return the run summary (``summary.json``).

    A run that fails before training starts (a rejected config, an env that
    cannot be built) still leaves ``summary.json`` in ``trainer.output_dir``
    with ``status="failed"`` and the error, so sweep tables list it.

    Raises:
        ConfigError: see :func:`build`; other errors of the components as raised.
    """
    torch.manual_seed(cfg.seed)
    start_time = time.time()
    try:
        trainer = build(cfg)
    except Exception as err:
        summary = {
            "status": "failed",
            "error": str(err) if isinstance(err, ConfigError) else f"{type(err).__name__}: {err}",
            "exp_name": cfg.get("exp_name"),
            **run_placement(cfg.device),
            "global_step": 0,
            "objective_name": cfg.trainer.objective,
            "objective": None,
            "start_time": start_time,
            "end_time": time.time(),
        }
        atomic_write_json(Path(cfg.trainer.output_dir) / "summary.json", summary)
        raise
    summary = trainer.train()
    success = summary["final"].get("eval/success_rate")
    shown = "n/a" if success is None else f"{success:.3f}"
    objective = ""
    if summary["objective_name"] != "eval/success_rate" and isinstance(summary["objective"], (int, float)):
        objective = f" | {summary['objective_name']} {summary['objective']:.4g}"
    print(
        f"rlchain: {summary['status']} {summary['global_step']:,} env steps in {summary['elapsed_s']:.0f} s "
        f"| final eval success rate {shown}{objective} | {trainer.output_dir}",
        flush=True,
    )
    return summary


@hydra.main(version_base="1.3", config_path="pkg://rlchain.conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    """Hydra entry point: returns the run objective for sweepers."""
    return train(cfg)["objective"]


if __name__ == "__main__":
    main()
