"""Tests of rlchain.envs: the built-in tasks, the gymnasium adapter and the contract checker."""
