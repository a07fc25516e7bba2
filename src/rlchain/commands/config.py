"""Structured config schemas, registered in Hydra's ConfigStore, and the check of a composed config's top level.

Each component's schema is the dataclass that also holds its defaults
(:class:`rlchain.core.envs.PushCubeConfig`, :class:`rlchain.core.policies.ActorCriticConfig`,
:class:`rlchain.core.algorithms.PPOConfig`, ...), so every default lives in exactly
one place. They are stored as ``<group>/<name>_schema``; the YAML options under
``rlchain/conf/`` extend them (``defaults: [push_cube_schema, _self_]``), so a
misspelt key or a value of the wrong type fails at composition (a key on
``rlchain-train``'s command line in one line with a close match:
:mod:`rlchain.commands.command_line`). :class:`TrainConfig` is the top-level schema.
Importing this module registers the schemas and the ``${rlchain_id:}``
resolver.

Importing it, and so starting ``rlchain-train``, loads no tensordict: the
modules of the schemas import tensordict where they build a TensorDict,
because importing tensordict loads torch's compiler (``torch._dynamo``, half
of rlchain-train's start-up), which ``--help``, ``--cfg`` and a rejected
config never use. (A training run loads it all the same: building a
``torch.optim`` optimiser imports ``torch._dynamo``.)
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import MISSING, DictConfig, OmegaConf

from rlchain.core.algorithms import GRPOConfig, PPOConfig
from rlchain.core.envs import CartPoleConfig, GymEnvConfig, ManiSkillEnvConfig, MjlabEnvConfig, PushCubeConfig
from rlchain.core.policies import ActorCriticConfig, ActorOnlyConfig
from rlchain.run.run_dir import register_resolver
from rlchain.run.trainer import TrainerConfig
from rlchain.settings import Settings, setting
from rlchain.utils import MAX_SEED

__all__ = [
    "SCHEMAS",
    "RunConfig",
    "TrainConfig",
    "TopLevelKeyError",
    "check_top_level_keys",
    "register_configs",
    "register_schema",
]


@dataclass
class RunConfig(Settings):
    """The run-wide settings of ``rlchain-train``, their defaults and ranges (checked by :func:`rlchain.commands.train.build`)."""

    seed: int = setting(0, ge=0, le=MAX_SEED)
    """The run's seed: seeds torch's global RNG before anything is built, and reaches every component by
    interpolation."""
    device: str = "auto"
    """'auto' (CUDA when available, else CPU), 'cpu', 'cuda' or 'cuda:N'; reaches every component."""
    exp_name: str = "${hydra:runtime.choices.algorithm}_${hydra:runtime.choices.env}"
    """Name of the experiment (the W&B run name): <algorithm>_<env> by default."""


@dataclass
class TrainConfig(RunConfig):
    """The top-level schema of ``rlchain-train``: one node per component, and the run-wide settings."""

    env: Any = MISSING
    """The training env (group ``env``); the eval env is built from the same node."""
    policy: Any = MISSING
    """The policy (group ``policy``); built with the env's spaces."""
    algorithm: Any = MISSING
    """The algorithm (group ``algorithm``); built with the policy."""
    trainer: Any = MISSING
    """The trainer (group ``trainer``)."""


#: ``(group, option name, schema)`` of every built-in component.
SCHEMAS: list[tuple[str, str, type]] = [
    ("env", "push_cube", PushCubeConfig),
    ("env", "cart_pole", CartPoleConfig),
    ("env", "gym", GymEnvConfig),
    ("env", "mjlab", MjlabEnvConfig),
    ("env", "maniskill", ManiSkillEnvConfig),
    ("policy", "actor_critic", ActorCriticConfig),
    ("policy", "actor_only", ActorOnlyConfig),
    ("algorithm", "ppo", PPOConfig),
    ("algorithm", "grpo", GRPOConfig),
    ("trainer", "default", TrainerConfig),
]


def register_configs() -> None:
    """Store the top-level schema as ``rlchain_config`` and each component schema as ``<group>/<name>_schema``."""
    cs = ConfigStore.instance()
    cs.store(name="rlchain_config", node=TrainConfig)
    for group, name, schema in SCHEMAS:
        cs.store(group=group, name=f"{name}_schema", node=schema)


def register_schema(group: str, name: str, schema: type) -> None:
    """Register a user's component schema, as rlchain registers its own: ``<group>/<name>_schema`` in Hydra's
    ConfigStore.

    A YAML option of ``group`` in a ``--config-dir`` then extends it (``defaults: [<name>_schema, _self_]``), so
    that a misspelt key or a value of the wrong type fails at composition, naming the key, as it does for the
    built-in options. Call it before Hydra composes the config: in the module of a script that then runs
    :func:`rlchain.commands.train.main` (see the docs page "Extending rlchain"). Registering the same schema again
    changes nothing.

    Args:
        group: the config group, e.g. ``"env"`` (a nested one as ``"robot/arm"``).
        name: the option's name; the schema is stored as ``<name>_schema``.
        schema: a dataclass, best a :class:`rlchain.settings.Settings` subclass, with a ``_target_`` field
            naming the class it builds when the group is a component's.

    Raises:
        TypeError: ``schema`` is not a dataclass type.
        ValueError: an empty ``group`` or ``name``, or a built-in option's (see :data:`SCHEMAS`) with another
            schema.
    """
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
        raise TypeError(f"register_schema({group!r}, {name!r}, {schema!r}): expected a dataclass type as the schema")
    if not (isinstance(group, str) and group and isinstance(name, str) and name):
        raise ValueError(f"register_schema({group!r}, {name!r}, ...): expected a group and a name, non-empty strings")
    builtin = {(g, n): s for g, n, s in SCHEMAS}.get((group, name))
    if builtin is not None and builtin is not schema:
        raise ValueError(
            f"{group}/{name}_schema is rlchain's schema of {group}={name} ({builtin.__name__}): "
            "expected another option name"
        )
    ConfigStore.instance().store(group=group, name=f"{name}_schema", node=schema)


class TopLevelKeyError(ValueError):
    """A top-level key that neither the schema nor a selected config group accounts for."""


def _group_keys() -> set[str]:
    """The top-level key of every config group Hydra selected for this run (from ``hydra.runtime.choices``).

    A choice ``group`` lands at its group's key, ``group@package`` (placed by a
    defaults list) at its package; ``_global_`` adds no key of its own.
    """
    keys = set()
    for choice, option in HydraConfig.get().runtime.choices.items():
        group, _, package = choice.partition("@")
        if option is None or group.split("/")[0] == "hydra":
            continue
        top = (package or group.replace("/", ".")).removeprefix("_global_").lstrip(".").split(".")[0]
        if top:
            keys.add(top)
    return keys


def _added_paths() -> set[str]:
    """The config paths that this run's ``+key=value`` and ``++key=value`` overrides add (not group choices)."""
    hc = HydraConfig.get()
    overrides = OverridesParser.create().parse_overrides(list(hc.overrides.task))
    return {
        o.key_or_group
        for o in overrides
        if (o.is_add() or o.is_force_add()) and o.key_or_group not in hc.runtime.choices
    }


def _leaf_paths(node: Any, prefix: str) -> set[str]:
    if OmegaConf.is_dict(node):
        return {path for key, value in node.items_ex(resolve=False) for path in _leaf_paths(value, f"{prefix}.{key}")}
    return {prefix}


def check_top_level_keys(cfg: DictConfig) -> None:
    """Reject a top-level key that neither :class:`TrainConfig` nor a selected config group accounts for.

    Hydra's ``+key=value`` adds a key even to a struct config, so a misspelt
    ``+sed=3`` would otherwise train with seed 0 and exit 0; so would a
    misspelt top-level key in a ``# @package _global_`` preset. The allowed
    top-level keys are the fields of :class:`TrainConfig` and the key of every
    config group Hydra selected (``hydra.runtime.choices``: e.g. a user's own
    group ``robot`` from ``--config-dir``), unless all that key holds comes
    from ``+`` overrides (``+experiment.x=1`` while the ``experiment`` preset
    is ``_global_``). Only Hydra's public API is used, which does not expose
    an option's ``# @package`` header: an option whose header moves it to
    another top-level key is reported; place it with its defaults list
    (``- robot@arm: ur5``) instead. A config composed without Hydra's runtime
    config knows no group.

    Raises:
        TopLevelKeyError: naming the unknown key(s) (with a close match when
            there is one) and every allowed top-level key.
    """
    fields = {field.name for field in dataclasses.fields(TrainConfig)}
    candidates = {str(key) for key in cfg.keys()} - fields - {"hydra"}
    if not candidates:
        return
    groups, added = (_group_keys(), _added_paths()) if HydraConfig.initialized() else (set(), set())
    unknown = sorted(key for key in candidates if key not in groups or _leaf_paths(cfg[key], key) <= added)
    if not unknown:
        return
    allowed = sorted(fields | (candidates - set(unknown)))
    close = [match for key in unknown for match in difflib.get_close_matches(key, allowed, n=1)]
    hint = f" (did you mean {', '.join(repr(m) for m in close)}?)" if close else ""
    keys = ", ".join(repr(key) for key in unknown)
    raise TopLevelKeyError(
        f"unknown top-level key{'s' if len(unknown) > 1 else ''} {keys}{hint}: expected one of {', '.join(allowed)}"
    )


register_configs()
register_resolver()
