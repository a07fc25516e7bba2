"""``rlchain-train``: compose one configuration with Hydra and train.

Usage::

    rlchain-train algorithm=grpo env=push_cube                  # one run -> outputs/<date>/<time>/
    rlchain-train experiment=push_cube_ppo                      # a tuned preset (debug=tiny: the smallest run)
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
import dataclasses
import difflib
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.errors import CompactHydraException, InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from rlchain.config import TrainConfig  # importing rlchain.config registers the schemas
from rlchain.checkpoint import atomic_write_json
from rlchain.trainer import Trainer, requeue_signal, run_placement
from rlchain.utils import check_seed, resolve_device

__all__ = ["PRESET_SLOTS", "ConfigError", "RunFailed", "build", "check_top_level_keys", "cli", "exit_code", "main",
           "preset_overrides", "train"]


class ConfigError(CompactHydraException):
    """A config value a component rejected; Hydra prints just this message (no traceback)."""


#: The config nodes of the components: a message that starts with one names its field in full.
_GROUP_PREFIXES = ("env.", "policy.", "algorithm.", "trainer.")


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
        if message.startswith(_GROUP_PREFIXES):
            pass  # it names its field already (e.g. the trainer's check of algorithm.group_size)
        elif group and re.match(r"^[A-Za-z_][\w\[\].]*=", message):
            message = f"{group}.{message}"
        elif group:
            message = f"{group}: {message}"
        raise ConfigError(f"Invalid config: {message}") from cause


def _package_header(group: str, option: str) -> str | None:
    """The ``# @package`` header of option ``option`` of config group ``group``, None without one.

    Read from the config sources of the current Hydra run
    (``HydraConfig.get().runtime.config_sources``), so it also finds a
    user's ``--config-dir`` options.
    """
    # Hydra has no public API for a config's header; these two classes are
    # the ones Hydra itself composes with (stable since Hydra 1.1). Should they
    # move, the option counts at its group's own key.
    try:
        from hydra._internal.config_repository import ConfigRepository
        from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
    except ImportError:  # pragma: no cover - a future Hydra
        return None

    search_path = ConfigSearchPathImpl()
    for source in HydraConfig.get().runtime.config_sources:
        search_path.append(source.provider, f"{source.schema}://{source.path}")
    loaded = ConfigRepository(search_path).load_config(f"{group}/{option}")
    return None if loaded is None else loaded.header.get("package")


def _group_keys(candidates: set[str]) -> set[str]:
    """Those of ``candidates`` that are the top-level key of a config group Hydra selected.

    Hydra records every selected group in ``HydraConfig.get().runtime.choices``
    as ``group`` (its option lands at the group's path, or where the option's
    ``# @package`` header says) or ``group@package`` (placed by a defaults
    list). An option at ``_global_`` (the presets: ``+experiment=...``) sets
    keys that exist already and adds none. Without a Hydra run (a config
    composed with ``return_hydra_config=False``) no group is known.
    """
    if not candidates or not HydraConfig.initialized():
        return set()
    found = set()
    for choice, options in HydraConfig.get().runtime.choices.items():
        group, _, package = choice.partition("@")
        if options is None or group == "hydra" or group.startswith("hydra/"):
            continue
        if package:
            packages = [package]
        elif group.split("/")[0] not in candidates:
            continue  # whatever its header says, it cannot account for a candidate
        else:
            options = list(options) if OmegaConf.is_list(options) else [options]
            packages = [_package_header(group, str(option)) or group.replace("/", ".") for option in options]
        for package in packages:
            top = package.removeprefix("_global_").lstrip(".").split(".")[0]
            if top in candidates:
                found.add(top)
    return found


def check_top_level_keys(cfg: DictConfig) -> None:
    """Reject a top-level key that neither the schema nor a selected config group accounts for.

    Hydra's ``+key=value`` adds a key even to a struct config, so a misspelt
    ``+sed=3`` would otherwise train with seed 0 and exit 0. The allowed
    top-level keys are the fields of :class:`rlchain.config.TrainConfig` and
    the top-level key of the package of every config group Hydra selected
    (e.g. a user's own group ``robot`` from ``--config-dir`` at key ``robot``);
    an option with ``# @package _global_`` adds none.

    Raises:
        ConfigError: naming the unknown key(s) (with a close match when there
            is one) and every allowed top-level key.
    """
    fields = {field.name for field in dataclasses.fields(TrainConfig)}
    candidates = {str(key) for key in cfg.keys()} - fields - {"hydra"}
    unknown = sorted(candidates - _group_keys(candidates))
    if not unknown:
        return
    allowed = sorted(fields | (candidates - set(unknown)))
    close = [match for key in unknown for match in difflib.get_close_matches(key, allowed, n=1)]
    hint = f" (did you mean {', '.join(repr(m) for m in close)}?)" if close else ""
    keys = ", ".join(repr(key) for key in unknown)
    raise ConfigError(
        f"Invalid config: unknown top-level key{'s' if len(unknown) > 1 else ''} {keys}{hint}: "
        f"expected one of {', '.join(allowed)}"
    )


def build(cfg: DictConfig) -> Trainer:
    """Instantiate env, policy, algorithm and trainer from a composed config.

    Raises:
        ConfigError: a top-level key no schema field or selected config group
            accounts for (see :func:`check_top_level_keys`); a value a component
            rejects, naming ``group.key``, the value and what is allowed; both
            raised before any env step is taken.
    """
    check_top_level_keys(cfg)
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
    with ``status="failed"`` and the error, so sweep tables list it (where
    that directory can be written).

    Raises:
        ConfigError: see :func:`build`, and a ``seed`` out of range.
        RunFailed: training failed (a non-finite loss, an env error, a full
            disk, ...): one line naming what went wrong; ``summary.json`` has
            the traceback. With ``HYDRA_FULL_ERROR=1`` the original error is
            raised instead.
        Exception: other errors of the components while they are built, as raised.
    """
    start_time = time.time()
    try:
        with _component(""):
            check_seed("seed", cfg.seed)
        torch.manual_seed(cfg.seed)
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
        path = Path(cfg.trainer.output_dir) / "summary.json"
        if not path.exists():  # a run refused or failing to resume leaves the summary of the run it found
            with contextlib.suppress(OSError):  # an unwritable run directory: the error itself is what matters
                atomic_write_json(path, summary)
        raise
    try:
        summary = trainer.train()
    except Exception as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        error = trainer.summary.get("error") or f"{type(err).__name__}: {err}"
        where = "the traceback is in its summary.json" if trainer.summary else "no summary.json could be written"
        raise RunFailed(f"rlchain: failed: {error} | {trainer.output_dir} ({where})") from err
    print(_result_line(summary, trainer), flush=True)
    return summary


def _result_line(summary: dict[str, Any], trainer: Trainer) -> str:
    """The one line a run ends with: what happened, how far it got, its results and where it is."""
    steps = f"{summary['global_step']:,} env steps in {summary['elapsed_s']:.0f} s"
    if summary["status"] == "completed":
        parts = [f"rlchain: completed {steps}"]
    else:  # stopped by a signal: interrupted or aborted
        parts = [f"rlchain: {summary['status']} by {summary['signal']} at {steps}"]
    success = summary["final"].get("eval/success_rate")  # absent for a task without success
    if success is not None:
        parts.append(f"final eval success rate {success:.3f}")
    if summary["objective_name"] != "eval/success_rate" and isinstance(summary["objective"], (int, float)):
        parts.append(f"{summary['objective_name']} {summary['objective']:.4g}")
    parts.append(str(trainer.output_dir))
    if summary["status"] in ("interrupted", "aborted"):
        latest = trainer.checkpoint_dir / "latest.pt"
        parts.append(f"resume with trainer.resume_from={latest}" if latest.exists() else "no checkpoint was written")
    return " | ".join(parts)


class RunFailed(CompactHydraException):
    """A run that failed while training; Hydra prints just this one line (``HYDRA_FULL_ERROR=1`` for the traceback)."""


def exit_code(summary: dict[str, Any]) -> int:
    """The process exit status of a run: 0 completed, 128 + the signal's number when stopped by one, else 1."""
    if summary.get("signal") and summary["status"] in ("interrupted", "aborted"):
        return 128 + signal.Signals[summary["signal"]].value
    return 0 if summary["status"] == "completed" else 1


@hydra.main(version_base="1.3", config_path="pkg://rlchain.conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    """Hydra entry point: returns the run objective for sweepers.

    A single run stopped by a signal exits with 128 + its number (130 for
    Ctrl-C, 143 for SIGTERM), so a shell or a scheduler can tell it from a
    completed run, and a rejected config or a failed training prints its
    one line and exits 1; inside a multirun the launcher reports both instead
    (``hydra/launcher=basic`` runs jobs in this process: a stopped job ends
    the sweep with the same exit code).

    In a submitit job (``hydra/launcher=slurm``) a run stopped by submitit's
    time-limit or preemption signal is then handed to submitit's handler,
    which requeues the job and exits; the requeued job goes on from its
    ``latest.pt`` (``trainer.resume_from=auto``, which the presets set).
    """
    single = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.RUN
    try:
        summary = train(cfg)
    except (ConfigError, RunFailed) as err:
        if not single or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise  # a launcher records it with the job
        print(err, file=sys.stderr, flush=True)  # the one line, without Hydra's wrapping
        raise SystemExit(1) from None
    requeue = requeue_signal()
    if requeue is not None and summary.get("signal") == requeue.name:
        # The trainer held the signal back until latest.pt and summary.json were
        # written; its handler, submitit's again, requeues the job and exits.
        signal.raise_signal(requeue)
    code = exit_code(summary)
    # A stopped run ends its process: a single run, and the sweep of an
    # in-process launcher (hydra/launcher=basic), which would otherwise start
    # its next job. The devices and submitit launchers report the job instead.
    in_process = single or (
        HydraConfig.initialized() and HydraConfig.get().runtime.choices.get("hydra/launcher") == "basic"
    )
    if code and in_process:
        raise SystemExit(code)
    return summary["objective"]


#: Config groups with a slot in ``train.yaml``'s defaults list (``experiment: null``, ...).
PRESET_SLOTS = ("experiment", "study", "sweep", "hparams_search", "debug")


def preset_overrides(args: list[str]) -> list[str]:
    """``args`` with ``+experiment=x`` written as ``experiment=x`` (likewise every group of :data:`PRESET_SLOTS`).

    These groups have a slot in the defaults list, so ``experiment=x`` selects
    one; Hydra refuses ``+`` (add) for a group the list already has, which
    was the way to select a preset before the slots existed.
    """
    return [arg[1:] if arg.startswith(tuple(f"+{slot}=" for slot in PRESET_SLOTS)) else arg for arg in args]


def cli() -> None:
    """The ``rlchain-train`` command: :func:`main` (see :func:`preset_overrides` for its arguments), and a
    Ctrl-C before training starts (while Hydra composes, or the env is built) ends with one line and exit
    status 130."""
    sys.argv[1:] = preset_overrides(sys.argv[1:])
    try:
        main()
    except KeyboardInterrupt:
        print("\nrlchain: interrupted by SIGINT before training started", file=sys.stderr, flush=True)
        sys.exit(128 + signal.SIGINT.value)


if __name__ == "__main__":
    cli()
