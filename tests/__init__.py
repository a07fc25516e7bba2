"""rlchain's test suite: one module per topic, mirroring ``src/``; shared helpers in :mod:`tests.helpers`."""
