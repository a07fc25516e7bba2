"""One run over two processes (gloo on the CPU): the update's maths, torchrun, stop signals and faults.

The rank processes are real: ``torchrun`` itself for the whole run, and for
the fault tests two ``python -m rlchain.commands.train`` processes started with the
variables torchrun sets (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...), so
that the test holds each rank's pid and exit status. Nothing waits on a
clock: a held step (a marker file, :mod:`tests.helpers.fault_env`) puts a
rank where the test wants it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from rlchain import distributed
from rlchain.core.algorithms import GRPO, PPO
from rlchain.core.collector import SyncCollector
from rlchain.core.envs import PushCubeEnv
from rlchain.core.policies import ActorCritic
from rlchain.run.checkpoint import load_checkpoint
from tests.helpers.runs import TINY, USER, rows, sigint_as_in_a_terminal, subprocess_env, summary_of, wait_for

NUM_ENVS, STEPS, UPDATES = 16, 8, 3
#: One minibatch per epoch on each rank (and of the whole rollout in one process): the ranks' mean gradient is then
#: the full-batch gradient.
PPO_SETTINGS = dict(n_epochs=2, learning_rate=1e-3, ent_coef=0.01)


#: PushCube observed as the groups actor (noisy) and critic (exact).
GROUPS = {"privileged_critic": True, "obs_noise_std": 0.05}
#: A recurrent policy (an LSTM actor and critic), trained on whole rollouts of each env.
RECURRENT = {"rnn_type": "lstm", "rnn_hidden_size": 16}
ADAPTIVE = {"lr_schedule": "adaptive_minibatch", "target_kl": 1e-4}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rollout_and_policy(policy_settings=None, **env_settings):
    """The same push_cube rollout ``[STEPS, NUM_ENVS]`` and initial policy in every process (fixed seeds, one thread);
    ``env_settings``: e.g. observation groups with a privileged critic; ``policy_settings``: e.g. :data:`RECURRENT`."""
    torch.manual_seed(0)
    env = PushCubeEnv(num_envs=NUM_ENVS, seed=0, **env_settings)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, **(policy_settings or {}))
    collector = SyncCollector(env, policy, STEPS)
    collector.collect()  # a recurrent policy's second rollout starts from carried states
    return collector.collect().data.clone(), policy


def _updates(policy, data, batch_size: int, **settings) -> list[dict]:
    """``UPDATES`` PPO updates on ``data`` (:data:`PPO_SETTINGS`, then ``settings``); the parameters and buffers
    after each, and the update's terms."""
    ppo = PPO(policy, batch_size=batch_size, **{**PPO_SETTINGS, **settings})
    after = []
    for _ in range(UPDATES):
        stats = ppo.update(data)
        after.append({"state": {k: v.clone() for k, v in policy.state_dict().items()}, "stats": stats})
    return after


def _assert_one_policy(rank0: list[dict], rank1: list[dict], reference: list[dict], label: str) -> None:
    """Each update's parameters and buffers (``{name: tensor}``, one per update): the same on both ranks, and within
    1e-6 of one process's ``reference``."""
    for update, (a, b, ref) in enumerate(zip(rank0, rank1, reference)):
        for name, value in ref.items():
            assert torch.equal(a[name], b[name]), (label, update, name)
            torch.testing.assert_close(a[name], value, rtol=0, atol=1e-6, msg=f"{label} {update}: {name}")


def _states(updates: list[dict]) -> list[dict]:
    """The parameters and buffers after each update of :func:`_updates`."""
    return [update["state"] for update in updates]


def _skewed_rollout_and_policy() -> tuple[TensorDict, ActorCritic]:
    """The rollout of :func:`_rollout_and_policy` with the log-probs of rank 1's half raised by 0.5: the KL from the
    rollout policy is 0 on rank 0's half before the first step and about 0.1 on rank 1's, so rsl_rl's schedule raises
    the rate on rank 0's KL alone and lowers it on rank 1's alone or on their mean."""
    data, policy = _rollout_and_policy()
    data["sample_log_prob"][:, NUM_ENVS // 2 :] += 0.5
    return data, policy


def _grpo_rollout() -> TensorDict:
    """The rollout of :func:`_rollout_and_policy` with episodes ending at other steps in each half of the envs (rank
    0's half: envs 0-2 done at step 2, env 5 at step 4): the ranks' minibatches hold different live counts."""
    data, _ = _rollout_and_policy()
    data["done"][2, 0:3] = True
    data["done"][4, 5] = True
    return data


def _grpo_updates(data, batch_size: int) -> list[dict]:
    """Two GRPO updates (groups of 4, the live mask, the adaptive schedule) from the initial policy on ``data``;
    the parameters and buffers after each."""
    _, policy = _rollout_and_policy()
    grpo = GRPO(policy, group_size=4, batch_size=batch_size, n_epochs=2, lr_schedule="adaptive", target_kl=0.01)
    states = []
    for _ in range(2):
        grpo.update(data)
        states.append({k: v.clone() for k, v in policy.state_dict().items()})
    return states


def _rank(rank: int, port: int, out: str) -> None:
    """Rank ``rank`` of 2: its half of the envs (columns), the per-rank minibatch of half the samples."""
    torch.set_num_threads(1)
    os.environ.update(
        RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    distributed.setup("cpu", timeout_s=60)
    data, policy = _rollout_and_policy()
    half = NUM_ENVS // 2
    mine = data[:, rank * half : (rank + 1) * half].clone()
    torch.save(_updates(policy, mine, batch_size=STEPS * half), Path(out) / f"rank{rank}.pt")
    # GRPO (groups of 4 within each rank's envs, several minibatches, the live mask): one policy on both ranks.
    grpo = GRPO(policy, group_size=4, batch_size=16, n_epochs=2, lr_schedule="adaptive", target_kl=0.01)
    states = []
    for _ in range(2):
        grpo.update(mine)
        states.append({k: v.clone() for k, v in policy.state_dict().items()})
    torch.save(states, Path(out) / f"grpo{rank}.pt")
    # GRPO with one minibatch of the rank's half per epoch, against one process's full batch: exact as PPO.
    mine = _grpo_rollout()[:, rank * half : (rank + 1) * half].clone()
    torch.save(_grpo_updates(mine, batch_size=STEPS * half), Path(out) / f"grpo_full{rank}.pt")
    # Observation groups: each group's normaliser merges both ranks' statistics.
    data, policy = _rollout_and_policy(**GROUPS)
    mine = data[:, rank * half : (rank + 1) * half].clone()
    torch.save(_updates(policy, mine, batch_size=STEPS * half), Path(out) / f"groups{rank}.pt")
    # A recurrent policy: each rank's minibatch is its envs' whole sequences.
    data, policy = _rollout_and_policy(RECURRENT)
    mine = data[:, rank * half : (rank + 1) * half].clone()
    torch.save(_updates(policy, mine, batch_size=STEPS * half), Path(out) / f"recurrent{rank}.pt")
    # rsl_rl's schedule: the rate of every step from the minibatch's KL, the mean over the ranks.
    data, policy = _skewed_rollout_and_policy()
    mine = data[:, rank * half : (rank + 1) * half].clone()
    torch.save(_updates(policy, mine, batch_size=STEPS * half, **ADAPTIVE), Path(out) / f"adaptive{rank}.pt")
    distributed.shutdown()


@pytest.mark.slow
def test_two_ranks_keep_one_policy_and_update_as_one_process_on_all_the_envs(tmp_path):
    """2 ranks x 8 envs give the update of 1 process x 16 envs, and the same parameters on both ranks after each.

    Exact equality between the ranks: they step with the same averaged gradient. Against one process the
    maths is the same (the advantages normalised over both halves, the observation statistics merged, the
    mean of two half-batch gradients) but the float32 sums run in another order: a few ulp per sum, which
    three Adam steps of lr 1e-3 carry into the parameters as differences below 1e-6 (measured: ~1e-7).
    """
    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    ranks = [ctx.Process(target=_rank, args=(r, port, str(tmp_path))) for r in range(2)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(120)
        assert p.exitcode == 0
    torch.set_num_threads(1)
    data, policy = _rollout_and_policy()
    reference = _updates(policy, data, batch_size=STEPS * NUM_ENVS)
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2))
    _assert_one_policy(_states(rank0), _states(rank1), _states(reference), "update")
    for update, (a, b, ref) in enumerate(zip(rank0, rank1, reference)):
        assert a["stats"] == b["stats"]
        for key in ("policy_loss", "value_loss", "approx_kl", "clipfrac", "explained_variance"):
            assert a["stats"][key] == pytest.approx(ref["stats"][key], rel=1e-4, abs=1e-6), (update, key)
    grpo0, grpo1 = (torch.load(tmp_path / f"grpo{r}.pt", weights_only=True) for r in range(2))
    assert all(torch.equal(a[name], b[name]) for a, b in zip(grpo0, grpo1) for name in a)
    # GRPO's masked means weigh each rank by its live samples: the ranks' mean gradient is the one process's.
    reference = _grpo_updates(_grpo_rollout(), batch_size=STEPS * NUM_ENVS)
    full0, full1 = (torch.load(tmp_path / f"grpo_full{r}.pt", weights_only=True) for r in range(2))
    _assert_one_policy(full0, full1, reference, "GRPO update")
    first, last = rank0[0]["state"], rank0[-1]["state"]
    assert all(not torch.equal(first[name], last[name]) for name in first if name.endswith("weight"))  # it learnt
    data, policy = _rollout_and_policy(**GROUPS)
    reference = _updates(policy, data, batch_size=STEPS * NUM_ENVS)
    groups0, groups1 = (torch.load(tmp_path / f"groups{r}.pt", weights_only=True) for r in range(2))
    assert {"obs_normalizer.actor.mean", "obs_normalizer.critic.var"} <= set(reference[0]["state"])
    _assert_one_policy(_states(groups0), _states(groups1), _states(reference), "groups")
    data, policy = _rollout_and_policy(RECURRENT)
    reference = _updates(policy, data, batch_size=STEPS * NUM_ENVS)
    recurrent0, recurrent1 = (torch.load(tmp_path / f"recurrent{r}.pt", weights_only=True) for r in range(2))
    assert "actor_memory.rnn.weight_hh_l0" in reference[0]["state"]
    _assert_one_policy(_states(recurrent0), _states(recurrent1), _states(reference), "recurrent")
    data, policy = _skewed_rollout_and_policy()
    reference = _updates(policy, data, batch_size=STEPS * NUM_ENVS, **ADAPTIVE)
    adaptive0, adaptive1 = (torch.load(tmp_path / f"adaptive{r}.pt", weights_only=True) for r in range(2))
    rates = [ref["stats"]["learning_rate"] for ref in reference]
    assert len(set(rates)) > 1  # the rate moved
    for update, (a, b) in enumerate(zip(adaptive0, adaptive1)):
        assert a["stats"]["learning_rate"] == b["stats"]["learning_rate"] == pytest.approx(rates[update], rel=1e-9)
    _assert_one_policy(_states(adaptive0), _states(adaptive1), _states(reference), "adaptive")


@pytest.mark.slow
def test_torchrun_trains_one_run_whose_files_rank_0_alone_writes(tmp_path):
    """``torchrun --nproc_per_node=2 -m rlchain.commands.train``: one run directory, global_step over both ranks, and
    every rank's envs in the checkpoint, from which a second torchrun run goes on."""
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "rlchain.commands.train",
    ]
    args = [*TINY, "device=cpu", "hydra.run.dir=run"]
    done = subprocess.run(
        [*torchrun, *args],
        cwd=tmp_path,
        env=subprocess_env(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # rank 1 wrote nothing, not even Hydra's files
    run = tmp_path / "run"
    summary = summary_of(run)
    assert (summary.status, summary.world_size, summary.global_step) == ("completed", 2, 2 * 2 * 8 * 16)
    assert done.stdout.count("rlchain: completed") == 1
    state = load_checkpoint(run / "checkpoints" / "latest.pt")
    assert state["world_size"] == 2 and len(state["ranks"]) == 1
    assert not torch.equal(state["collector"]["obs"], state["ranks"][0]["collector"]["obs"])  # distinct envs

    more = subprocess.run(
        [*torchrun, *args, "trainer.resume_from=auto", "trainer.iterations=3"],
        cwd=tmp_path,
        env=subprocess_env(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert more.returncode == 0, more.stderr
    assert "resumed from" in more.stderr and "cannot restore" not in more.stderr and "process(es)" not in more.stderr
    assert summary_of(run).global_step == 3 * 8 * 16 * 2

    # One process goes on from the two ranks' checkpoint: the policy and the step count go on, the envs restart.
    alone = subprocess.run(
        [sys.executable, "-m", "rlchain.commands.train", *args, "trainer.resume_from=auto", "trainer.iterations=4"],
        cwd=tmp_path,
        env=subprocess_env(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert alone.returncode == 0, alone.stderr
    assert "was saved by a run of 2 process(es) and this one has 1: policy, optimiser" in alone.stderr
    assert "every env is reset" in alone.stderr
    summary = summary_of(run)
    assert (summary.world_size, summary.global_step) == (1, 3 * 8 * 16 * 2 + 8 * 16)


def _start_ranks(tmp_path: Path, args: list[str], port: int | None = None) -> list[subprocess.Popen]:
    """Both ranks of a run, as torchrun would start them, in ``tmp_path`` (rank 0's run directory: ``run``)."""
    port = port or _free_port()
    procs = []
    for rank in range(2):
        env = subprocess_env(
            OMP_NUM_THREADS="1",
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "rlchain.commands.train", *args, "hydra.run.dir=run"],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def _ended(procs: list[subprocess.Popen], timeout: float = 120) -> list[tuple[int, str]]:
    """Each rank's exit status and stderr (a guard against a hang, not a timed assertion)."""
    return [(p.wait(timeout), p.communicate()[1]) for p in procs]


@pytest.mark.slow
def test_sigterm_to_every_rank_stops_both_after_one_iteration_saves_once_and_resumes(tmp_path):
    """SIGTERM to both ranks (as SLURM sends it) while rank 1 is inside iteration 2 and rank 0 waits for it: both
    stop after iteration 2, one latest.pt holds it, and the same command goes on to the end."""
    hold = tmp_path / "hold"
    hold.touch()
    args = [
        *USER,
        "device=cpu",
        "trainer.iterations=6",
        "trainer.save_freq=100",
        "trainer.eval_freq=100",
        "env.fault_rank=1",
        f"env.hold_step={hold}",
    ]
    first = [*args, "trainer.rollout_steps=8"]
    procs = _start_ranks(tmp_path, first)
    # Rank 1 holds at its first step: the run is inside iteration 1 on both ranks.
    wait_for(lambda: Path(f"{hold}.waiting").exists(), "rank 1 to hold its step", procs[1])
    for p in procs:
        p.send_signal(signal.SIGTERM)
    hold.unlink()
    (code0, err0), (code1, err1) = _ended(procs)
    assert (code0, code1) == (143, 143), (err0, err1)
    run = tmp_path / "run"
    summary = summary_of(run)
    assert (summary.status, summary.signal, summary.iteration, summary.world_size) == ("interrupted", "SIGTERM", 1, 2)
    state = load_checkpoint(run / "checkpoints" / "latest.pt")
    assert state["iteration"] == 1 and state["global_step"] == summary.global_step == 8 * 16 * 2
    assert [row["charts/iteration"] for row in rows(run)] == [1]
    assert err0.count("SIGTERM: every rank stops after this iteration") == 1 and "SIGTERM" not in err1  # rank 0 speaks

    procs = _start_ranks(tmp_path, [*first, "trainer.resume_from=auto"])
    (code0, err0), (code1, err1) = _ended(procs)
    assert (code0, code1) == (0, 0), (err0, err1)
    assert "resumed from" in err0 and "cannot restore" not in err0
    summary = summary_of(run)
    assert (summary.status, summary.iteration, summary.global_step) == ("completed", 6, 6 * 8 * 16 * 2)
    assert [row["charts/iteration"] for row in rows(run)] == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow
def test_ctrl_c_at_torchrun_stops_both_ranks_after_the_same_iteration_and_saves_once(tmp_path):
    """Ctrl-C reaches torchrun (its ranks run in a session of their own), which forwards it to both ranks once:
    they stop after the iteration rank 1 is in, and one latest.pt holds it (torchrun then exits non-zero)."""
    hold = tmp_path / "hold"
    hold.touch()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "rlchain.commands.train",
        *USER,
        "device=cpu",
        "trainer.iterations=6",
        "env.fault_rank=1",
        f"env.hold_step={hold}",
        "hydra.run.dir=run",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=subprocess_env(OMP_NUM_THREADS="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_in_a_terminal,
    )
    wait_for(lambda: Path(f"{hold}.waiting").exists(), "rank 1 to hold its step", proc)
    proc.send_signal(signal.SIGINT)
    # Rank 1 is let go once torchrun has forwarded the signal to both ranks (its log says so): released at once,
    # it could end its iteration before the signal reached it.
    lines: list[str] = []
    reader = threading.Thread(target=lambda: [lines.append(line) for line in proc.stderr], daemon=True)
    reader.start()
    wait_for(lambda: "".join(lines).count("closing signal SIGINT") == 2, "torchrun to forward SIGINT", proc)
    hold.unlink()
    out = proc.stdout.read()
    proc.wait(120)
    reader.join(120)
    err = "".join(lines)
    assert proc.returncode != 0
    run = tmp_path / "run"
    summary = summary_of(run)
    assert (summary.status, summary.signal, summary.iteration, summary.world_size) == ("interrupted", "SIGINT", 1, 2)
    assert load_checkpoint(run / "checkpoints" / "latest.pt")["iteration"] == 1
    assert err.count("closing signal SIGINT") == 2  # torchrun forwarded it once to each rank
    assert err.count("rlchain: SIGINT: every rank stops after this iteration") == 1  # rank 0 speaks
    assert out.count("rlchain: interrupted by SIGINT at 256 env steps") == 1


@pytest.mark.slow
def test_a_rank_that_raises_ends_the_run_with_its_error(tmp_path):
    """Rank 1's env raises at its 10th step (iteration 2): rank 0, waiting for it in a collective, ends the run
    with rank 1's error in its one line and in summary.json; both exit 1."""
    procs = _start_ranks(
        tmp_path,
        [
            *USER,
            "device=cpu",
            "trainer.iterations=4",
            "env.fault_rank=1",
            "env.fail_at_step=10",
            "trainer.dist_timeout_s=300",
        ],
    )
    (code0, err0), (code1, err1) = _ended(procs)
    assert (code0, code1) == (1, 1)
    summary = summary_of(tmp_path / "run")
    assert summary.status == "failed" and summary.error == "rank 1 failed: RuntimeError: the simulator exploded"
    assert summary.iteration == 1
    assert (
        err0.strip().splitlines()[-1].startswith("rlchain: failed: rank 1 failed: RuntimeError: the simulator exploded")
    )
    assert "Traceback" not in err0 and "the simulator exploded" in err1


@pytest.mark.slow
def test_a_rank_whose_others_never_come_writes_nothing_and_says_so_in_one_line(tmp_path):
    """Rank 1 alone (rank 0 never starts): the rendezvous fails after dist_timeout_s; rank 1 writes no file, not even
    the summary.json a refused one-process run leaves (rank 0 writes it)."""
    env = subprocess_env(
        OMP_NUM_THREADS="1",
        RANK="1",
        LOCAL_RANK="1",
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
    )
    done = subprocess.run(
        [sys.executable, "-m", "rlchain.commands.train", *TINY, "device=cpu", "trainer.dist_timeout_s=1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert list(tmp_path.iterdir()) == []
    line = done.stderr.strip().splitlines()[-1]
    assert line == (
        "rlchain: rank 1 stopped: the start of the process group (torchrun's rendezvous) did not complete "
        "within trainer.dist_timeout_s=1 on rank 1 (iteration 0, start): another rank did not join it"
    )
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_rank_that_hangs_ends_the_run_within_dist_timeout_s_naming_it_and_the_collective(tmp_path):
    """Rank 1 never ends its first step: rank 0 waits trainer.dist_timeout_s in its first collective, then ends
    the run with a line that names the collective, rank 1 and where rank 1 was."""
    hold = tmp_path / "hold"
    hold.touch()
    procs = _start_ranks(
        tmp_path, [*USER, "device=cpu", "env.fault_rank=1", f"env.hold_step={hold}", "trainer.dist_timeout_s=3"]
    )
    code0, err0 = _ended(procs[:1])[0]
    procs[1].kill()
    procs[1].communicate()
    assert code0 == 1
    line = err0.strip().splitlines()[-1]
    assert "the all-reduce of the" in line and "did not complete within trainer.dist_timeout_s=3 on rank 0" in line
    assert "rank 1 did not join it (rank 1 was last at iteration 1, collect)" in line
    summary = summary_of(tmp_path / "run")
    assert summary.status == "failed" and "rank 1 did not join it" in summary.error
