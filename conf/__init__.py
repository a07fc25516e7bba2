"""rlchain's Hydra configs, installed as the package ``rlchain.conf``."""
