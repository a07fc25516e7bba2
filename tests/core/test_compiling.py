"""The compile seam (rlchain.core.compiling): the graphs trainer.compile hands to inductor hold no construct known to
break its Triton backend, and a compile that fails says what failed in one line."""

from __future__ import annotations

import math

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._inductor.compile_fx import compile_fx
from torch._inductor.compile_worker.subproc_pool import SubprocException
from torch._inductor.exc import InductorError

from rlchain.core.algorithms import GRPO, PPO
from rlchain.core.algorithms.update import update_step
from rlchain.core.collector import SyncCollector
from rlchain.core.compiling import Step, StepCompileError, compile_failure
from rlchain.core.envs import CartPoleEnv, PushCubeEnv
from rlchain.core.policies import ActorCritic, ActorOnly

# Ops that inductor's Triton backend has failed to generate code for, so no compiled step may hand them to it. On
# an H200 (torch 2.11, Triton 3.6) every trainer.compile=true run stopped before its first step: push_cube's
# torch._foreach_copy_ of its 8 state tensors inside the collection step became the foreach kernel
# triton_for_fused_4, which Triton could not compile ("NameError('in_ptr0 is not defined')"). CI has no GPU, and
# inductor's C++ backend compiles the same graphs, so this list is checked on the graphs themselves.
DENIED_PREFIXES = ("aten._foreach_",)

CASES = {
    "push_cube_ppo": (lambda: PushCubeEnv(num_envs=16, seed=0, obs_noise_std=0.01), ActorCritic, PPO, {}),
    "push_cube_grpo": (
        lambda: PushCubeEnv(num_envs=16, seed=0, max_episode_steps=8),
        ActorOnly,
        GRPO,
        {"group_size": 4, "kl_coef": 0.1},
    ),
    "cart_pole_ppo": (
        lambda: CartPoleEnv(num_envs=16, seed=0),
        ActorCritic,
        PPO,
        {"lr_schedule": "adaptive_minibatch", "target_kl": 0.01},
    ),
    "cart_pole_grpo": (
        lambda: CartPoleEnv(num_envs=16, seed=0, max_episode_steps=8),
        ActorOnly,
        GRPO,
        {"group_size": 4},
    ),
}


def handed_to_inductor(step: Step) -> list[str]:
    """Compile ``step`` as trainer.compile does, through inductor's own front end (its decompositions, AOTAutograd's
    forward and backward graphs), and return every op of the graphs it hands on to code generation; the graphs
    then run with eager kernels instead of generated ones (code generation takes minutes on a 2-core CPU)."""
    ops: list[str] = []

    def record(gm: torch.fx.GraphModule, example_inputs, **kwargs):
        ops.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return make_boxed_func(gm)

    def backend(gm: torch.fx.GraphModule, example_inputs):
        return compile_fx(gm, example_inputs, inner_compile=record)

    step.compile(backend=backend)
    assert step.mode == "compiled" and ops, "nothing was handed to inductor"
    return ops


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_graphs_trainer_compile_hands_to_inductor_hold_no_op_that_breaks_triton(case):
    make_env, make_policy, make_algorithm, settings = CASES[case]
    torch._dynamo.reset()
    torch.manual_seed(0)
    env = make_env()
    policy = make_policy(env.single_observation_space, env.single_action_space, hidden_sizes=[16, 16])
    algorithm = make_algorithm(policy, batch_size=32, n_epochs=2, **settings)
    collector = SyncCollector(env, policy, 8, reset_options=algorithm.reset_options)
    for step in (collector.step, update_step(algorithm, collector.buffer.data)):
        ops = handed_to_inductor(step)
        denied = sorted({op for op in ops if op.startswith(DENIED_PREFIXES)})
        assert not denied, f"rlchain's {step.name} hands inductor {denied}, which its Triton backend failed on"
    stats = algorithm.update(collector.collect().data)  # the recorded graphs run
    assert all(math.isfinite(value) for value in stats.values())


def failed(step: str, cause: BaseException) -> str:
    return str(compile_failure(StepCompileError(step, cause), None))


def test_a_kernel_triton_cannot_generate_is_named_with_its_innermost_cause():
    # What the H200 showed, in the shape inductor raises it: an InductorError around the exception of the
    # subprocess that compiled the kernel, whose traceback is text.
    details = (
        "Traceback (most recent call last):\n"
        '  File "triton/compiler/code_generator.py", line 1300, in visit_Name\n'
        "    raise NameError(f'{name} is not defined')\n"
        "triton.compiler.errors.CompilationError: at 12:11:\n"
        "def triton_for_fused_4(in_ptr0, in_ptr1, out_ptr0, xnumel):\n"
        "    tmp0 = tl.load(in_ptr0 + (x0), xmask)\n"
        "           ^\n"
        "NameError('in_ptr0 is not defined')\n"
    )
    cause = InductorError(SubprocException(details, name="triton_for_fused_4"), None)
    assert failed("collection step", cause) == (
        "trainer.compile=true: Triton could not compile rlchain's collection step (kernel triton_for_fused_4: "
        "NameError 'in_ptr0 is not defined'); run with trainer.compile=false"
    )


def test_a_step_that_does_not_trace_whole_says_so_and_writes_its_traceback(tmp_path):
    hidden = torch.zeros(4)

    def breaks() -> torch.Tensor:
        hidden.add_(1)
        if float(hidden.sum()) > 0:  # a host read: no whole graph
            return hidden * 2
        return hidden

    step = Step(
        "collection step", breaks, hidden.device, warm_up=lambda: step(), snapshot=hidden.clone, restore=hidden.copy_
    )
    with pytest.raises(StepCompileError) as err:
        step.compile(backend="eager")
    trace = tmp_path / "run" / "compile_error.txt"
    line = str(compile_failure(err.value, trace))
    assert line.startswith("trainer.compile=true: rlchain's collection step does not compile whole (")
    assert line.endswith(f"); run with trainer.compile=false (full traceback: {trace})")
    assert "Traceback (most recent call last)" in trace.read_text()
    assert torch.equal(hidden, torch.zeros(4))  # what the warm-up touched is restored
