"""Tests of rlchain.core.envs: the built-in tasks, the gymnasium adapter and the contract checker."""
