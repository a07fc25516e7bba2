"""A user's own package of rlchain components: an env, a policy and an algorithm (docs: Extending rlchain)."""
