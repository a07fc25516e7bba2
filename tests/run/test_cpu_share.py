"""trainer.adapt_threads: a run on CPUs that other processes share trains on the cores they leave free."""

from __future__ import annotations

import pytest
import torch

from rlchain.run.cpu_share import CpuShare, threads_for


@pytest.mark.parametrize(
    "cpus, others, most, threads",
    [
        (2, 0.0, 2, 2),  # alone: every thread
        (2, 0.3, 2, 2),  # background noise: less than half a core
        (2, 0.6, 2, 1),  # one busy neighbour, itself slowed by our spinning threads
        (2, 1.0, 2, 1),
        (2, 2.0, 2, 1),  # never fewer than one
        (8, 2.4, 8, 6),
        (8, 0.0, 4, 4),  # never more than the run started with (a launcher's slot, OMP_NUM_THREADS)
    ],
)
def test_the_threads_are_the_cpus_the_other_processes_leave(cpus, others, most, threads):
    assert threads_for(cpus, others, most) == threads


def test_it_adapts_only_a_cpu_run_of_several_threads_that_asks_for_it():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert not CpuShare(False, torch.device("cpu")).active
        assert not CpuShare(True, torch.device("cuda")).active
        torch.set_num_threads(1)
        assert not CpuShare(True, torch.device("cpu")).active  # one thread: nothing to give up
    finally:
        torch.set_num_threads(threads)


@pytest.mark.skipif(not CpuShare.readable(), reason="needs Linux's /proc/stat and two CPUs")
def test_it_reads_the_cpus_of_the_process_and_gives_the_thread_count_back():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        share = CpuShare(True, torch.device("cpu"))
        assert share.active and share.most == 2
        wall, busy, own = share._sample()
        sum(range(2_000_000))  # some CPU time of this process's own
        later = share._sample()
        assert later[0] > wall and later[1] >= busy and later[2] > own
        torch.set_num_threads(1)  # as update() does where others are busy
        share.close()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
