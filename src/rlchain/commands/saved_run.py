"""A trained run read back as data: its checkpoint, its composed config, and the env and policy rebuilt from them.

``rlchain-eval`` and ``rlchain-export`` read run directories that someone
else may have written, so nothing in one is run as code:

* the checkpoint loads with ``torch.load(weights_only=True)``
  (:func:`rlchain.run.checkpoint.load_checkpoint`);
* the config is the one the run composed: the checkpoint's own (resolved),
  else the run directory's ``.hydra/config.yaml``;
* of that config only the ``env`` and ``policy`` nodes are instantiated, each
  as one object: its ``_target_`` must name a class defined under
  ``rlchain.`` or under a module the user allows (``--allow-target MODULE``;
  the rule Hydra 1.4 brings as ``_target_whitelist_``), a
  :class:`~rlchain.core.envs.base.VecEnv` for ``env`` and a
  :class:`~rlchain.core.policies.Policy` for ``policy``. Nothing below them is
  instantiated: a nested ``_target_``, Hydra's ``_args_``, ``_partial_``,
  ``_recursive_`` and ``_convert_``, and ``${...}`` interpolations are
  refused. The check looks only at the target's dotted name before it
  imports anything, then at the class it names. What ``env=gym`` imports
  to register its id counts as a target too: each module of ``env.imports``
  and the module of an id of the form ``module:Name-v0``.

Every refusal is a :class:`SavedRunError`: one line that names the file, the
key and the value.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlchain.run.checkpoint import check_state_matches, load_checkpoint
from rlchain.settings import SettingError, rejection, renamed

__all__ = ["CHECKPOINT_CHOICES", "SavedRun", "SavedRunError", "allowed_target", "open_run"]

#: ``checkpoint=`` names of a run directory's checkpoints (any other value is a path).
CHECKPOINT_CHOICES = ("best", "latest")
#: The package whose targets a saved config may always name.
TRUSTED = "rlchain"


class SavedRunError(ValueError):
    """A run, checkpoint, config or override that cannot be used, said in one line (whitespace runs collapsed)."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


#: Hydra's instantiation keys, each of which would run more than the one constructor a saved node may name.
_HYDRA_KEYS = ("_args_", "_partial_", "_recursive_", "_convert_")


def allowed_target(target: str, allowed: Sequence[str]) -> bool:
    """Whether the dotted name ``target`` lies under ``rlchain`` or under one of the ``allowed`` modules."""
    return any(target == module or target.startswith(module + ".") for module in (TRUSTED, *allowed))


@dataclass
class SavedRun:
    """A checkpoint of a run and the run's composed config.

    Attributes:
        checkpoint: the checkpoint file.
        state: its contents (tensors and plain data; see :meth:`rlchain.run.trainer.Trainer.state_dict`).
        config: the run's composed config as plain data (resolved ``env``, ``policy``, ``trainer``, ... nodes).
        run_dir: the run directory (the checkpoint's ``checkpoints/`` parent), or None for a loose checkpoint.
        allowed: modules whose ``_target_`` s the config may instantiate besides rlchain's.
    """

    checkpoint: Path
    state: dict[str, Any]
    config: dict[str, Any]
    run_dir: Path | None
    allowed: tuple[str, ...] = ()

    @property
    def global_step(self) -> int:
        """Env steps the checkpoint's policy was trained for."""
        return int(self.state["global_step"])

    def trainer_setting(self, name: str, default: Any) -> Any:
        """A setting of the run's trainer (``seed``, ``num_eval_envs``, ...), or ``default`` when it has none."""
        value = (self.config.get("trainer") or {}).get(name)
        return default if value is None else value

    def env_config(self, overrides: Sequence[str] = (), **settings: Any) -> DictConfig:
        """The ``env`` node with ``settings`` (e.g. ``num_envs``) and then ``overrides`` (``env.key=value``) applied.

        Raises:
            SavedRunError: an override that is not ``env.<key>=<value>`` of a key
                the env has (naming it and the keys there are); a node that may
                not be instantiated (see the module docstring).
        """
        env = OmegaConf.create({**renamed(self.config["env"]), **settings})  # a config of an earlier release too
        OmegaConf.set_struct(env, True)
        for override in OverridesParser.create().parse_overrides(list(overrides)):
            key = override.key_or_group
            if override.is_add() or override.is_force_add() or override.is_delete():
                raise SavedRunError(
                    f"{override.input_line}: overrides set keys of the saved config; they cannot add or delete one"
                )
            if override.is_sweep_override():
                raise SavedRunError(f"{override.input_line}: one value per key (an evaluation is no sweep)")
            if not key.startswith("env."):
                raise SavedRunError(_foreign_key(key))
            name = key.removeprefix("env.")
            if OmegaConf.select(env, name, default=_MISSING) is _MISSING:
                keys = [str(k) for k in env if k != "_target_"]
                close = difflib.get_close_matches(name.split(".")[0], keys, n=1)
                hint = f" (did you mean env.{close[0]}?)" if close else ""
                raise SavedRunError(
                    f"{override.input_line}: the env of {self.checkpoint} has no key {name!r}{hint}; "
                    f"its keys: {', '.join(keys)}"
                )
            try:
                OmegaConf.update(env, name, override.value(), merge=True)
            except OmegaConfBaseException as err:
                raise SavedRunError(f"{override.input_line}: {err}") from None
        self._check_node(OmegaConf.to_container(env), "env")
        return env

    def build_env(self, overrides: Sequence[str] = (), **settings: Any) -> Any:
        """Instantiate the env of :meth:`env_config` (a :class:`~rlchain.core.envs.base.VecEnv`).

        Raises:
            SavedRunError: see :meth:`env_config`; a value the env rejects
                (naming ``env.<key>``, the value and what is allowed).
        """
        from hydra.utils import instantiate

        from rlchain.core.envs.base import VecEnv

        config = self.env_config(overrides, **settings)
        with _component_errors("env"):
            env = instantiate(config, _convert_="all")
        if not isinstance(env, VecEnv):  # a class's __new__ may return anything
            raise SavedRunError(f"env._target_={config._target_!r} built a {type(env).__name__}, not a VecEnv")
        return env

    def build_policy(self, env: Any) -> Any:
        """Instantiate the run's policy for ``env``'s spaces, on ``env.device``, with the checkpoint's weights.

        Raises:
            SavedRunError: a node that may not be instantiated (see the module
                docstring); a checkpoint whose policy does not fit the config
                (naming the parameters and shapes).
        """
        from hydra.utils import instantiate

        from rlchain.core.policies import Policy

        config = self.config["policy"]
        self._check_node(config, "policy")
        with _component_errors("policy"):
            policy = instantiate(
                OmegaConf.create(config),
                observation_space=env.single_observation_space,
                action_space=env.single_action_space,
                _convert_="all",
            )
        if not isinstance(policy, Policy):
            raise SavedRunError(f"policy._target_={config['_target_']!r} built a {type(policy).__name__}, not a Policy")
        policy = policy.to(env.device)
        try:
            check_state_matches(policy, self.state["policy"], "checkpoint", self.checkpoint)
        except SettingError as err:
            raise SavedRunError(str(err)) from None
        policy.load_state_dict(self.state["policy"])
        policy.eval()
        return policy

    def _check_node(self, node: dict[str, Any], group: str) -> None:
        """Refuse ``node`` (the ``env`` or ``policy`` config) unless it instantiates one allowed class and nothing else.

        Raises:
            SavedRunError: naming the key and value (see the module docstring for the rules).
        """
        from rlchain.core.envs.base import VecEnv
        from rlchain.core.policies import Policy

        base = VecEnv if group == "env" else Policy
        hint = "a saved config instantiates only classes under rlchain. and under modules allowed with --allow-target"
        for key, value in _walk(node, group):
            leaf = key.rsplit(".", 1)[-1]
            if leaf in _HYDRA_KEYS or (leaf == "_target_" and key != f"{group}._target_"):
                raise SavedRunError(
                    f"{key}={value!r} in the config of {self.checkpoint} is not allowed: {hint}, "
                    f"one per node, with no {', '.join(_HYDRA_KEYS)} and nothing nested"
                )
            if isinstance(value, str) and "${" in value:
                raise SavedRunError(
                    f"{key}={value!r} in the config of {self.checkpoint} is not allowed: "
                    "a saved config is resolved data, without ${...} interpolations"
                )
            # What env=gym imports to register its id: each module of env.imports, the module of an id module:Name.
            for i, module in enumerate(value if key == "env.imports" and isinstance(value, list) else ()):
                if not isinstance(module, str) or not allowed_target(module, self.allowed):
                    raise SavedRunError(
                        _refused_import(f"{key}[{i}]", module, module, self.checkpoint, "the env would import it")
                    )
            if (
                leaf == "id"
                and isinstance(value, str)
                and ":" in value
                and not allowed_target(value.partition(":")[0], self.allowed)
            ):
                module = value.partition(":")[0]
                raise SavedRunError(
                    _refused_import(
                        key, value, module, self.checkpoint, f"gymnasium would import its module {module!r}"
                    )
                )
        target = node.get("_target_")
        if not isinstance(target, str):
            raise SavedRunError(
                f"{group} in the config of {self.checkpoint} has no _target_: expected the class to build"
            )
        if not allowed_target(target, self.allowed):
            raise SavedRunError(
                f"{group}._target_={target!r} in the config of {self.checkpoint} is not allowed: {hint} "
                f"(e.g. --allow-target {target.split('.')[0]})"
            )
        module, _, name = target.rpartition(".")
        try:  # <module>.<Class>, the module under an allowed prefix (checked above) is imported, nothing else
            cls = getattr(importlib.import_module(module), name)
        except Exception as err:  # noqa: BLE001 - an import error of the user's module, or no such name: one line
            raise SavedRunError(
                f"{group}._target_={target!r} in the config of {self.checkpoint} is not allowed: it is no "
                f"<module>.<class> that imports ({type(err).__name__}: {err})"
            ) from None
        if not isinstance(cls, type) or not allowed_target(cls.__module__, self.allowed) or not issubclass(cls, base):
            what = f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else f"a {type(cls).__name__}"
            raise SavedRunError(
                f"{group}._target_={target!r} in the config of {self.checkpoint} is not allowed: it names "
                f"{what}, expected a {base.__name__} class defined under rlchain. or an allowed module"
            )


_MISSING = object()


def _walk(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    """``(key path, value)`` of every entry under ``node`` (plain dicts and lists), depth first."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield f"{path}.{key}", value
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield f"{path}[{i}]", value
            yield from _walk(value, f"{path}[{i}]")


def _refused_import(key: str, value: Any, module: Any, checkpoint: Path, what: str) -> str:
    """The message of a ``module`` that ``key=value`` of a saved config would import and that no --allow-target allows."""
    return (
        f"{key}={value!r} in the config of {checkpoint} is not allowed: {what}, and a saved config imports "
        "only modules under rlchain. and those allowed with --allow-target: "
        f"pass --allow-target {module} if you trust it"
    )


def _foreign_key(key: str) -> str:
    group = key.split(".")[0]
    if group == "policy":
        return f"{key}: overrides change the evaluation, not the policy: the policy is the checkpoint's"
    if group in ("algorithm", "trainer"):
        return (
            f"{key}: {group} settings play no part here: only env.<key>=<value> overrides and the command's own options"
        )
    return f"{key}: no such key: overrides are env.<key>=<value> or the command's own options"


@contextlib.contextmanager
def _component_errors(group: str) -> Iterator[None]:
    """A setting the ``group``'s component rejects (or a target that cannot be imported) as one :class:`SavedRunError`."""
    try:
        yield
    except SavedRunError:
        raise
    except (HydraException, ValueError) as err:  # Hydra's InstantiationException is a HydraException
        message = rejection(err, group) or f"{group}: {err.__cause__ or err}"
        raise SavedRunError(message) from None


def open_run(source: str | Path, checkpoint: str = "best", allowed: Sequence[str] = ()) -> SavedRun:
    """Read the checkpoint and config of ``source``: a run directory or a checkpoint file.

    Args:
        source: a run directory (``checkpoint`` picks ``checkpoints/best.pt`` or
            ``checkpoints/latest.pt``) or a checkpoint file.
        checkpoint: ``best``, ``latest`` or the path of another checkpoint
            (whose own config applies; the run directory's ``.hydra/`` when it has none).
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
                hint = (
                    f" (it has {', '.join(f'{p}.pt' for p in there)}: checkpoint={there[0]})"
                    if there
                    else (" and no other checkpoint: is it an rlchain run directory?")
                )
                raise SavedRunError(f"{source} has no checkpoints/{checkpoint}.pt{hint}")
        else:
            path = Path(checkpoint)
    else:
        if checkpoint != "best":
            raise SavedRunError(
                f"checkpoint={checkpoint} is not allowed with a checkpoint file ({source}): "
                "it names a checkpoint of a run directory"
            )
        path = source
        run_dir = source.parent.parent if source.parent.name == "checkpoints" else None
    try:
        state = load_checkpoint(path, map_location="cpu", name="checkpoint")
    except FileNotFoundError:
        raise SavedRunError(f"checkpoint {path} does not exist") from None
    except SettingError as err:
        raise SavedRunError(str(err)) from None
    policy = state["policy"]
    if not isinstance(policy, dict) or not all(isinstance(v, torch.Tensor) for v in policy.values()):
        raise SavedRunError(f"{path} is not an rlchain checkpoint: its policy is not a state dict of tensors")
    if isinstance(state["global_step"], bool) or not isinstance(state["global_step"], int):
        raise SavedRunError(f"{path} is not an rlchain checkpoint: its global_step is {state['global_step']!r}")
    return SavedRun(path, state, _config_of(state, path, run_dir), run_dir, tuple(allowed))


def _config_of(state: dict[str, Any], path: Path, run_dir: Path | None) -> dict[str, Any]:
    """The run's composed config as plain data: the checkpoint's, else ``<run dir>/.hydra/config.yaml`` (its
    ``env`` and ``policy`` resolved, and the trainer settings an evaluation uses).

    Raises:
        SavedRunError: none there, one without ``env`` and ``policy``, or one that cannot be read or resolved.
    """
    config = state.get("config") or None
    origin = str(path)
    if config is None and run_dir is not None and (run_dir / ".hydra" / "config.yaml").is_file():
        origin = str(run_dir / ".hydra" / "config.yaml")
        try:
            loaded = OmegaConf.load(origin)
            config = {
                key: OmegaConf.to_container(loaded[key], resolve=True) for key in ("env", "policy") if key in loaded
            }
            config["trainer"] = {
                name: OmegaConf.select(loaded, f"trainer.{name}", default=None)
                for name in ("seed", "num_eval_envs", "num_eval_episodes")
            }
        except Exception as err:  # noqa: BLE001 - YAML, OmegaConf or OS errors of a file from elsewhere: one line
            raise SavedRunError(f"{origin} cannot be read as a config: {err}") from None
    if config is None:
        where = (
            f"nor {run_dir / '.hydra' / 'config.yaml'}" if run_dir is not None else "and it lies in no run directory"
        )
        raise SavedRunError(f"{path} holds no config {where}: the env and policy to rebuild are unknown")
    if not isinstance(config, dict):
        raise SavedRunError(f"{origin}: its config is a {type(config).__name__}, not a mapping")
    missing = [key for key in ("env", "policy") if not isinstance(config.get(key), dict)]
    if missing:
        raise SavedRunError(f"the config of {origin} has no {' or '.join(missing)}: not an rlchain-train config")
    return config
