"""Structured config schemas, registered in Hydra's ConfigStore.

Each component's schema is the dataclass that also holds its defaults
(:class:`rlchain.envs.PushCubeConfig`, :class:`rlchain.policies.ActorCriticConfig`,
:class:`rlchain.algorithms.PPOConfig`, ...), so every default lives in exactly
one place. They are stored as ``<group>/<name>_schema``; the YAML options under
``conf/`` extend them (``defaults: [push_cube_schema, _self_]``), so a
misspelt key or a value of the wrong type fails at composition with Hydra's
message. :class:`TrainConfig` is the top-level schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from rlchain.algorithms import GRPOConfig, PPOConfig
from rlchain.envs import CartPoleConfig, GymEnvConfig, PushCubeConfig
from rlchain.policies import ActorCriticConfig, ActorOnlyConfig
from rlchain.run_dir import register_resolver
from rlchain.trainer import TrainerConfig

__all__ = ["SCHEMAS", "TrainConfig", "register_configs", "register_launcher"]


@dataclass
class TrainConfig:
    """The top-level schema of ``rlchain-train``: one node per component and the run-wide settings."""

    env: Any = MISSING
    """The training env (group ``env``); the eval env is built from the same node."""
    policy: Any = MISSING
    """The policy (group ``policy``); built with the env's spaces."""
    algorithm: Any = MISSING
    """The algorithm (group ``algorithm``); built with the policy."""
    trainer: Any = MISSING
    """The trainer (group ``trainer``)."""
    seed: int = 0
    """The run's seed; reaches every component by interpolation."""
    device: str = "auto"
    """'auto' (CUDA when available, else CPU), 'cpu', 'cuda' or 'cuda:N'."""
    exp_name: str = "rlchain"
    """Name of the experiment (W&B run name)."""


#: ``(group, option name, schema)`` of every built-in component.
SCHEMAS: list[tuple[str, str, type]] = [
    ("env", "push_cube", PushCubeConfig),
    ("env", "cart_pole", CartPoleConfig),
    ("env", "gym", GymEnvConfig),
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


def register_launcher() -> None:
    """Register rlchain's ``hydra/launcher=devices`` plugin with Hydra directly.

    Hydra finds plugins by walking the ``hydra_plugins`` namespace package,
    which an editable install cannot list; registering the class (and
    importing its config schema) makes the launcher available either way.
    """
    from hydra.core.plugins import Plugins

    import hydra_plugins.rlchain_launcher.config  # noqa: F401  (stores hydra/launcher/devices)
    from hydra_plugins.rlchain_launcher.devices_launcher import DevicesLauncher

    Plugins.instance().register(DevicesLauncher)


register_configs()
register_launcher()
register_resolver()
