"""``python -m rlchain``: the ``rlchain-train`` command (see :mod:`_rlchain_cli` and :mod:`rlchain.commands.train`)."""

if __name__ == "__main__":  # not when multiprocessing's spawn imports this module as the workers' __mp_main__
    from _rlchain_cli import train

    train()
