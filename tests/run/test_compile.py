"""trainer.compile: the compiled minibatch step against the eager one, a compiled run, and a run that cannot compile."""

from __future__ import annotations

import json

import pytest
import torch

from rlchain.core.algorithms import PPO
from rlchain.core.buffer import minibatch_order
from rlchain.core.envs import PushCubeEnv
from rlchain.core.policies import ActorCritic
from rlchain.run.trainer import Trainer
from tests.helpers.runs import TINY, run_cli


@pytest.mark.slow
def test_a_compiled_run_trains_with_the_eager_step_and_logs_its_compile_time_once(tmp_path):
    """The minibatch step compiled whole (loss, gradients, clip, Adam) gives the eager step's terms and parameters
    on a real minibatch, from the same state.

    Tolerance: inductor fuses the elementwise ops and sums the float32 means over the minibatch in another order,
    which moves them by a few ulp (measured: ~1e-7 relative); rtol 1e-5 leaves room, and a wrong graph (a term
    dropped, a clip misplaced, a missed Adam step) would be off by far more.
    """
    torch.manual_seed(0)
    env = PushCubeEnv(num_envs=16, seed=0)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[32, 32])
    ppo = PPO(policy, batch_size=64, n_epochs=2)
    trainer = Trainer(
        env,
        policy,
        ppo,
        iterations=3,
        rollout_steps=8,
        output_dir=str(tmp_path),
        progress=False,
        fresh_eval=False,
        compile=True,
    )
    trainer.start()
    updater = ppo.updater
    assert updater.step.mode == "compiled"
    rollout = trainer.collector.collect().data.reshape(-1)[:64].select("obs", "action", "sample_log_prob", "value")
    rollout.set("advantages", torch.randn(64))
    rollout.set("returns", torch.randn(64) * 3)
    updater._stage(rollout)
    minibatch_order(64, 64, torch.Generator().manual_seed(1), out=updater._order_buffer[0])
    kept = [*policy.parameters(), updater._exp_avg_flat, updater._exp_avg_sq_flat, updater._adam_steps]
    start = [t.detach().clone() for t in kept]
    results = []
    for step in (updater.step, updater._indexed_step):  # compiled, then eager
        with torch.no_grad():
            for t, s in zip(kept, start):
                t.copy_(s)
        updater._position.zero_()
        row = step()
        results.append((row, [t.detach().clone() for t in kept]))
    (compiled_row, compiled_after), (eager_row, eager_after) = results
    torch.testing.assert_close(compiled_row, eager_row, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(a, b) for a, b in zip(eager_after, start))  # the step moved the policy
    for compiled, eager in zip(compiled_after, eager_after):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        for t, s in zip(kept, start):
            t.copy_(s)
    updater._totals.zero_()

    before = [p.detach().clone() for p in policy.parameters()]
    assert trainer.train().status == "completed"
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [("time/compile_s" in row) for row in rows] == [True, False, False] and rows[0]["time/compile_s"] > 0


@pytest.mark.slow
def test_a_run_that_cannot_compile_says_so_in_one_line_before_any_step(tmp_path):
    """No C++ compiler for the CPU backend (CXX names none): one line naming trainer.compile, the machine as the
    cause, and the file with the full traceback; exit 1, no step."""
    proc = run_cli([*TINY, "trainer.compile=true", "hydra.run.dir=run"], tmp_path, CXX="/nonexistent/g++")
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    trace = tmp_path / "run" / "compile_error.txt"
    assert line == (
        "trainer.compile=true: cannot run here: no working C++ compiler for inductor's CPU backend "
        "(InvalidCxxCompiler: No working C++ compiler found in torch._inductor.config.cpp.cxx: "
        f"(None, '/nonexistent/g++')); run with trainer.compile=false (full traceback: {trace})"
    ), proc.stderr
    assert "Traceback" not in proc.stderr
    assert "InvalidCxxCompiler" in trace.read_text() and "Traceback (most recent call last)" in trace.read_text()
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
