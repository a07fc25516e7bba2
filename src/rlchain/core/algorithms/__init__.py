"""RL algorithms: PPO (Schulman et al. 2017) and GRPO (Shao et al. 2024)."""

from rlchain.core.algorithms.base import Algorithm, AlgorithmConfig, NonFiniteError
from rlchain.core.algorithms.grpo import GRPO, GRPOConfig
from rlchain.core.algorithms.ppo import PPO, PPOConfig

__all__ = ["Algorithm", "AlgorithmConfig", "GRPO", "GRPOConfig", "NonFiniteError", "PPO", "PPOConfig"]
