"""Tests of rlchain.algorithms: GAE and PPO, GRPO, and what they share."""
