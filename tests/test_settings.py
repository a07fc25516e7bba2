"""rlchain.settings: one dataclass field per setting, each value checked against its type and range on creation,
then the rules between fields; every refusal one line naming the field, the value and what is allowed."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hydra.errors import InstantiationException

from rlchain.core.algorithms import GRPOConfig
from rlchain.run.trainer import TrainerConfig
from rlchain.settings import SettingError, Settings, rejection, setting


@dataclass
class Arm(Settings):
    """A toy schema: one field of each kind the schemas use."""

    joints: int = setting(6, gt=0)
    gain: float = setting(0.5, ge=0, le=1)
    mode: str = setting("position", choices=("position", "velocity"))
    limit: float | None = setting(None, gt=0)
    sizes: list[int] = setting([64, 64], gt=0)
    damped: bool = False

    def check(self) -> None:
        if self.mode == "velocity" and self.limit is None:
            raise SettingError("limit", None, " is not allowed with mode='velocity': expected a number > 0")


@dataclass
class StiffArm(Arm):
    """A subclass that changes a default and keeps the field's range."""

    gain: float = 0.9


def test_the_defaults_pass_and_an_int_given_for_a_float_becomes_a_float():
    arm = Arm(gain=1)
    assert arm.gain == 1.0 and isinstance(arm.gain, float)
    assert Arm().sizes == [64, 64] and Arm().sizes is not Arm().sizes  # a list default is copied


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"joints": 0}, "joints=0 is not allowed: expected an integer > 0"),
        ({"joints": 2.5}, "joints=2.5 is not allowed: expected an integer > 0"),
        ({"joints": True}, "joints=True is not allowed: expected an integer > 0"),
        ({"gain": 1.5}, "gain=1.5 is not allowed: expected a number in [0, 1]"),
        ({"gain": float("nan")}, "gain=nan is not allowed: expected a number in [0, 1]"),
        ({"mode": "torque"}, "mode='torque' is not allowed: expected one of 'position', 'velocity'"),
        ({"limit": -1.0}, "limit=-1.0 is not allowed: expected a number > 0 or None"),
        ({"sizes": [64, 0]}, "sizes[1]=0 is not allowed: expected an integer > 0"),
        ({"sizes": 64}, "sizes=64 is not allowed: expected a list"),
        ({"damped": "yes"}, "damped='yes' is not allowed: expected true or false"),
        ({"mode": "velocity"}, "limit=None is not allowed with mode='velocity': expected a number > 0"),
    ],
)
def test_a_value_out_of_its_type_or_range_is_one_message_naming_field_value_and_range(settings, message):
    with pytest.raises(SettingError) as caught:
        Arm(**settings)
    assert str(caught.value) == message


def test_a_subclass_that_changes_a_default_keeps_the_range():
    assert StiffArm().gain == 0.9
    with pytest.raises(SettingError, match=r"^gain=2.0 is not allowed: expected a number in \[0, 1\]$"):
        StiffArm(gain=2.0)


def test_the_bounds_of_the_schemas_are_written_in_full():
    with pytest.raises(ValueError, match=r"^seed=-1 is not allowed: expected an integer in \[0, 4294967295\]$"):
        TrainerConfig(seed=-1)
    with pytest.raises(ValueError, match=r"^eps=0.0 is not allowed: expected a number > 0$"):
        GRPOConfig(eps=0)


def test_a_rejection_names_the_setting_in_full_under_its_group():
    err = SettingError("num_envs", 0, " is not allowed: expected an integer > 0")
    assert err.qualified("env") == "env.num_envs=0 is not allowed: expected an integer > 0"
    assert SettingError("algorithm.group_size", 3, ": no").qualified("env") == "algorithm.group_size=3: no"
    wrapped = InstantiationException("Error in call to target")
    wrapped.__cause__ = err
    assert rejection(wrapped, "env") == "env.num_envs=0 is not allowed: expected an integer > 0"
    assert rejection(ValueError("bad spaces"), "policy") == "policy: bad spaces"
    assert rejection(RuntimeError("not a setting"), "env") is None
