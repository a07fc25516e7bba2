"""What the tests share: toy envs and a user's own components (built by ``_target_``, as a user's would be),
a user's config directory (``user_conf/``), and the helpers that run ``rlchain-train`` in a subprocess (:mod:`.runs`).

The tests import them as ``tests.helpers.<module>``; a subprocess that builds them by ``_target_`` gets
the checkout's root on its ``PYTHONPATH`` (:func:`tests.helpers.runs.subprocess_env`).
"""
