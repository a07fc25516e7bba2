"""Shared fixtures: compose rlchain's real Hydra config the way the command does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))  # user components (toy_env, user_components) importable by _target_

#: Shrinks any run to a couple of seconds on the CPU (conf/debug/tiny.yaml).
TINY = ["debug=tiny"]


def run_cli(args: list[str], cwd: Path, module: str = "rlchain.train", timeout: float = 300,
            **env_extra: str) -> subprocess.CompletedProcess:  # fmt: skip
    """Run ``python -m <module> *args`` in ``cwd`` the way a user's shell would (W&B off)."""
    env = {**os.environ, "PYTHONPATH": str(TESTS), "WANDB_MODE": "disabled"}
    env.pop("HYDRA_FULL_ERROR", None)
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def rows(run_dir: Path) -> list[dict]:
    """The rows of ``<run_dir>/metrics.jsonl`` (none when it does not exist)."""
    metrics = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []


@pytest.fixture
def compose_cfg(tmp_path):
    """``compose_cfg(overrides) -> DictConfig`` with ``trainer.output_dir`` in ``tmp_path``."""

    def _compose(overrides: list[str] = ()) -> DictConfig:
        GlobalHydra.instance().clear()
        with initialize_config_module("rlchain.conf", version_base="1.3"):
            cfg = compose("train", overrides=[f"trainer.output_dir={tmp_path}", *overrides], return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)  # ${hydra:...} interpolations resolve as in a real run
        with open_dict(cfg):
            del cfg.hydra
        return cfg

    yield _compose
    GlobalHydra.instance().clear()
