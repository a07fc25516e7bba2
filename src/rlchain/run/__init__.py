"""A run's life: the training loop (:mod:`.trainer`) and what happens around it, from its start
(:mod:`.starting`: afresh, resumed, from another run's policy) to its end: checkpoints (:mod:`.checkpoint`), the
evaluations during training (:mod:`.evaluator`), the objective and the best (:mod:`.objective`), signals
(:mod:`.stopping`), ``summary.json`` (:mod:`.summary`), logs (:mod:`.writer`), videos (:mod:`.video`), the run
directory (:mod:`.run_dir`) and the Optuna trial it reports to (:mod:`.tuning`).

The middle wing: it imports :mod:`rlchain.core` and the shared ground, never :mod:`rlchain.commands`.
"""
