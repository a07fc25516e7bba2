"""Tests of rlchain.core.algorithms: GAE and PPO, GRPO, and what they share."""
