"""The RL core: batched envs and their contract (:mod:`.envs`), policies (:mod:`.policies`), the rollout
buffer (:mod:`.buffer`), the collector that steps env and policy (:mod:`.collector`), PPO and GRPO
(:mod:`.algorithms`) and deterministic evaluation (:mod:`.evaluation`).

The bottom wing: it imports only the shared ground (:mod:`rlchain.settings`, :mod:`rlchain.distributed`,
:mod:`rlchain.console`, :mod:`rlchain.utils`), so that it knows nothing of runs, files or commands.
"""
