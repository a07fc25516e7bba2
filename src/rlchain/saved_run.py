"""A trained run read back as data: its checkpoint, its composed config, and the env and policy rebuilt from them.

``rlchain-eval`` and ``rlchain-export`` read run directories that someone
else may have written, so nothing in one is run as code:

* the checkpoint loads with ``torch.load(weights_only=True)``
  (:func:`rlchain.checkpoint.load_checkpoint`);
* the config is the one the run composed: the checkpoint's own (resolved),
  else the run directory's ``.hydra/config.yaml``;
* of that config only the ``env`` and ``policy`` nodes are instantiated, and
  only when every ``_target_`` in them names something under ``rlchain.`` or
  under a module the user allows (``--allow-target MODULE``; the rule Hydra
  1.4 brings as ``_target_whitelist_``). A gymnasium id of the form
  ``module:Name-v0`` (``env=gym``), whose module ``gymnasium.make`` imports,
  counts as a target too.

Every refusal is a :class:`SavedRunError`: one line that names the file, the
key and the value.
"""

from __future__ import annotations

import contextlib
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, InstantiationException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlchain.checkpoint import check_state_matches, load_checkpoint
from rlchain.settings import SettingError

__all__ = ["CHECKPOINT_CHOICES", "SavedRun", "SavedRunError", "allowed_target", "open_run"]

#: ``checkpoint=`` names of a run directory's checkpoints (any other value is a path).
CHECKPOINT_CHOICES = ("best", "latest")
#: The package whose targets a saved config may always name.
TRUSTED = "rlchain"


class SavedRunError(ValueError):
    """A run, checkpoint, config or override that cannot be used, said in one line."""


def allowed_target(target: str, allowed: Sequence[str]) -> bool:
    """Whether ``target`` (a dotted path) lies under ``rlchain`` or under one of the ``allowed`` modules."""
    return any(target == module or target.startswith(module + ".") for module in (TRUSTED, *allowed))


@dataclass
class SavedRun:
    """A checkpoint of a run and the run's composed config.

    Attributes:
        checkpoint: the checkpoint file.
        state: its contents (tensors and plain data; see :meth:`rlchain.trainer.Trainer.state_dict`).
        config: the run's composed config (resolved ``env``, ``policy``, ``trainer``, ... nodes).
        run_dir: the run directory (the checkpoint's ``checkpoints/`` parent), or None for a loose checkpoint.
        allowed: modules whose ``_target_`` s the config may instantiate besides rlchain's.
    """

    checkpoint: Path
    state: dict[str, Any]
    config: DictConfig
    run_dir: Path | None
    allowed: tuple[str, ...] = ()

    @property
    def global_step(self) -> int:
        """Env steps the checkpoint's policy was trained for."""
        return int(self.state["global_step"])

    def env_config(self, overrides: Sequence[str] = (), **settings: Any) -> DictConfig:
        """The ``env`` node with ``settings`` (e.g. ``num_envs``) and then ``overrides`` (``env.key=value``) applied.

        Raises:
            SavedRunError: an override that is not ``env.<key>=<value>`` of a key
                the env has (naming it and the keys there are), or a target that is not allowed.
        """
        env = OmegaConf.create(OmegaConf.to_container(self.config.env))
        for key, value in settings.items():
            env[key] = value
        OmegaConf.set_struct(env, True)
        for override in OverridesParser.create().parse_overrides(list(overrides)):
            key = override.key_or_group
            if override.is_add() or override.is_force_add() or override.is_delete():
                raise SavedRunError(f"{override.input_line}: overrides set keys of the saved config; "
                                    "they cannot add or delete one")  # fmt: skip
            if not key.startswith("env."):
                raise SavedRunError(_foreign_key(key))
            try:
                OmegaConf.update(env, key.removeprefix("env."), override.value(), merge=True)
            except OmegaConfBaseException:
                name, keys = key.removeprefix("env."), [str(k) for k in env if k != "_target_"]
                close = difflib.get_close_matches(name.split(".")[0], keys, n=1)
                hint = f" (did you mean env.{close[0]}?)" if close else ""
                raise SavedRunError(f"{key}={override.value()!r}: the env of {self.checkpoint} has no key {name!r}{hint}; "
                                    f"its keys: {', '.join(keys)}") from None
        self._check_targets(env, "env")
        return env

    def build_env(self, overrides: Sequence[str] = (), **settings: Any) -> Any:
        """Instantiate the env of :meth:`env_config` (a :class:`~rlchain.envs.base.VecEnv`).

        Raises:
            SavedRunError: see :meth:`env_config`; a value the env rejects
                (naming ``env.<key>``, the value and what is allowed).
        """
        from hydra.utils import instantiate

        with _component_errors("env"):
            return instantiate(self.env_config(overrides, **settings), _convert_="all")

    def build_policy(self, env: Any) -> Any:
        """Instantiate the run's policy for ``env``'s spaces, on ``env.device``, with the checkpoint's weights.

        Raises:
            SavedRunError: a target that is not allowed; a checkpoint whose
                policy does not fit the config (naming the parameters and shapes).
        """
        from hydra.utils import instantiate

        policy_cfg = OmegaConf.create(OmegaConf.to_container(self.config.policy))
        self._check_targets(policy_cfg, "policy")
        with _component_errors("policy"):
            policy = instantiate(policy_cfg, observation_space=env.single_observation_space,
                                 action_space=env.single_action_space, _convert_="all").to(env.device)  # fmt: skip
            check_state_matches(policy, self.state["policy"], "checkpoint", self.checkpoint)
        policy.load_state_dict(self.state["policy"])
        policy.eval()
        return policy

    def _check_targets(self, node: Any, path: str) -> None:
        """Refuse any ``_target_`` under ``node`` (and an ``env=gym`` id's module) that is not allowed.

        Raises:
            SavedRunError: ``<path>._target_='x.y' is not allowed: ...``.
        """
        for key, target in _targets(node, path):
            module = target.partition(":")[0] if key.endswith(".id") else target
            if not allowed_target(module, self.allowed):
                top = module.split(".")[0]
                raise SavedRunError(
                    f"{key}={target!r} in the config of {self.checkpoint} is not allowed: a saved config instantiates "
                    f"only targets under {TRUSTED}. and modules allowed with --allow-target (e.g. --allow-target {top})"
                )


def _targets(node: Any, path: str) -> Iterator[tuple[str, str]]:
    """``(key path, value)`` of every ``_target_`` under ``node``, and of a gymnasium ``id`` that names a module."""
    if OmegaConf.is_dict(node):
        for key, value in node.items():
            if key == "_target_" and isinstance(value, str):
                yield f"{path}._target_", value
            elif key == "id" and isinstance(value, str) and ":" in value:
                yield f"{path}.id", value
            else:
                yield from _targets(value, f"{path}.{key}")
    elif OmegaConf.is_list(node):
        for i, value in enumerate(node):
            yield from _targets(value, f"{path}[{i}]")


def _foreign_key(key: str) -> str:
    group = key.split(".")[0]
    if group == "policy":
        return f"{key}: overrides change the evaluation, not the policy: the policy is the checkpoint's"
    if group in ("algorithm", "trainer"):
        return f"{key}: {group} settings play no part here: only env.<key>=<value> overrides and the command's own options"
    return f"{key}: no such key: overrides are env.<key>=<value> or the command's own options"


@contextlib.contextmanager
def _component_errors(group: str) -> Iterator[None]:
    """A setting the ``group``'s component rejects (or a target that cannot be imported) as one :class:`SavedRunError`."""
    try:
        yield
    except SavedRunError:
        raise
    except SettingError as err:
        raise SavedRunError(err.qualified("" if err.name == "checkpoint" else group)) from None
    except (InstantiationException, HydraException) as err:
        cause = err.__cause__
        if isinstance(cause, SettingError):
            raise SavedRunError(cause.qualified(group)) from None
        raise SavedRunError(f"{group}: {cause if cause is not None else err}") from None
    except ValueError as err:
        raise SavedRunError(f"{group}: {err}") from None


def open_run(source: str | Path, checkpoint: str = "best", allowed: Sequence[str] = ()) -> SavedRun:
    """Read the checkpoint and config of ``source``: a run directory or a checkpoint file.

    Args:
        source: a run directory (``checkpoint`` picks ``checkpoints/best.pt`` or
            ``checkpoints/latest.pt``) or a checkpoint file.
        checkpoint: ``best``, ``latest`` or a checkpoint path (with a run
            directory whose config applies).
        allowed: modules whose ``_target_`` s a saved config may name besides rlchain's.

    Raises:
        SavedRunError: ``source`` or the checkpoint does not exist, is not an
            rlchain checkpoint, or no config can be found (neither in the
            checkpoint nor in ``.hydra/config.yaml``), or one that cannot be
            resolved.
    """
    source = Path(source)
    if not source.exists():
        raise SavedRunError(f"{source} does not exist: expected a run directory or a checkpoint file")
    if source.is_dir():
        run_dir = source
        if checkpoint in CHECKPOINT_CHOICES:
            path = source / "checkpoints" / f"{checkpoint}.pt"
            if not path.is_file():
                there = sorted(p.stem for p in (source / "checkpoints").glob("*.pt"))
                hint = f" (it has {', '.join(f'{p}.pt' for p in there)}: checkpoint={there[0]})" if there else (
                    " and no other checkpoint: is it an rlchain run directory?")  # fmt: skip
                raise SavedRunError(f"{source} has no checkpoints/{checkpoint}.pt{hint}")
        else:
            path = Path(checkpoint)
    else:
        if checkpoint != "best":
            raise SavedRunError(f"checkpoint={checkpoint} is not allowed with a checkpoint file ({source}): "
                                "it names a checkpoint of a run directory")  # fmt: skip
        path = source
        run_dir = source.parent.parent if source.parent.name == "checkpoints" else None
    try:
        state = load_checkpoint(path, map_location="cpu", name="checkpoint")
    except FileNotFoundError:
        raise SavedRunError(f"checkpoint {path} does not exist") from None
    except SettingError as err:
        raise SavedRunError(str(err)) from None
    return SavedRun(path, state, _config_of(state, path, run_dir), run_dir, tuple(allowed))


def _config_of(state: dict[str, Any], path: Path, run_dir: Path | None) -> DictConfig:
    """The run's composed config: the checkpoint's, else ``<run dir>/.hydra/config.yaml`` (env and policy resolved).

    Raises:
        SavedRunError: none there, or one without ``env`` and ``policy``, or whose interpolations do not resolve.
    """
    config = state.get("config") or None
    origin = str(path)
    if config is None and run_dir is not None and (run_dir / ".hydra" / "config.yaml").is_file():
        origin = str(run_dir / ".hydra" / "config.yaml")
        loaded = OmegaConf.load(origin)
        try:
            config = {key: OmegaConf.to_container(loaded[key], resolve=True) for key in ("env", "policy", "trainer")
                      if key in loaded}  # fmt: skip
        except OmegaConfBaseException as err:
            raise SavedRunError(f"{origin}: the config does not resolve: {' '.join(str(err).split())}") from None
    if config is None:
        where = f"nor {run_dir / '.hydra' / 'config.yaml'}" if run_dir is not None else "and it lies in no run directory"
        raise SavedRunError(f"{path} holds no config {where}: the env and policy to rebuild are unknown")
    missing = [key for key in ("env", "policy") if not isinstance(config.get(key), dict)]
    if missing:
        raise SavedRunError(f"the config of {origin} has no {' or '.join(missing)}: not an rlchain-train config")
    return OmegaConf.create(config)
