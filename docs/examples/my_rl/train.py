"""``python -m my_rl.train --config-dir conf env=line policy=linear algorithm=vpg``: rlchain-train with my_rl's
schemas registered, so that its YAML options are checked as rlchain's own are."""

from my_rl.line_env import LineEnvConfig
from my_rl.linear_policy import LinearPolicyConfig
from my_rl.vpg import VPGConfig
from rlchain.commands.config import register_schema
from rlchain.commands.train import main

register_schema("env", "line", LineEnvConfig)
register_schema("policy", "linear", LinearPolicyConfig)
register_schema("algorithm", "vpg", VPGConfig)

if __name__ == "__main__":
    main()
