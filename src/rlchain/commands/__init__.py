"""The commands: ``rlchain-train`` (:mod:`.train`), ``rlchain-eval`` (:mod:`.eval`), ``rlchain-export``
(:mod:`.export`) and ``rlchain-report`` (:mod:`.report`), with what they share: the composed configuration
(:mod:`.config`), the command line checked before Hydra runs (:mod:`.command_line`), and a trained run read back
as data (:mod:`.saved_run`).

The top wing: it imports :mod:`rlchain.run` and :mod:`rlchain.core`, and nothing imports it but the entry points.
"""
