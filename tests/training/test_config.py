"""--config.NAME=VALUE overrides (typed by the current value, unknown entries refused), and
the bounds an example checks its entries against."""

import ml_collections
import pytest

from dropmask import DropmaskError, DropmaskValueError
from dropmask.training import base_config, check_config
from dropmask.training._config import apply_overrides, parse_overrides


def _config() -> ml_collections.ConfigDict:
    config = base_config()
    config.hidden = (8, 8)
    config.name = "mlp"
    config.flag = False
    config.model = ml_collections.ConfigDict({"width": 4})
    return config


def test_values_take_the_type_of_the_current_entry():
    pairs = parse_overrides(
        ["--config.steps=7", "--config.rate", "0.25", "--config.hidden=(3,)", "--config.name=x=y"]
        + ["--config.flag=true", "--config.model.width=16", "--config.hidden=[1, 2]"]
    )
    config = apply_overrides(_config(), pairs)
    assert config.steps == 7 and isinstance(config.steps, int)
    assert config.rate == 0.25 and config.name == "x=y" and config.flag is True
    assert config.model.width == 16
    assert config.hidden == (1, 2)  # the last override wins, as a tuple
    assert _config().steps == 1000  # the input is not changed


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--config.nope=1"], "--config.nope: no such config entry"),
        (["--config.model.depth=1"], "--config.model.depth: no such config entry"),
        (["--config.steps=1.5"], "not a valid int"),
        (["--config.flag=maybe"], "not a valid bool"),
        (["--config.hidden=(1,"], "not a valid tuple"),
    ],
)
def test_bad_overrides_name_the_entry(args, match):
    with pytest.raises(DropmaskError, match=match):
        apply_overrides(_config(), parse_overrides(args))


def test_parse_refuses_other_arguments_and_missing_values():
    with pytest.raises(DropmaskError, match="unrecognized argument '--fast'"):
        parse_overrides(["--fast"])
    with pytest.raises(DropmaskError, match="needs a value"):
        parse_overrides(["--config.steps"])


_RULES = {
    "widths": ["hidden", "width"],
    "at_least": {"steps": 1, "warmup": 0},
    "in_range": {"rate": (0.0, 1.0), "digits": (1, 6)},
    "below": {"drop": (0.0, 1.0)},
    "positive": ["learning_rate"],
}


def _entries(**changes):
    entries = {"hidden": (8, 8), "width": 4, "steps": 3, "warmup": 0, "rate": 0.0, "digits": 6}
    entries |= {"drop": 0.0}
    return ml_collections.ConfigDict(entries | {"learning_rate": 1e-3} | changes)


def test_entries_within_their_bounds_pass():
    check_config(_entries(), **_RULES)
    check_config(_entries(rate=1.0, digits=1, hidden=[1], drop=0.999), **_RULES)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"hidden": (8, 0)},
            "config.hidden must be widths >= 1, got (8, 0). Set it with --config.hidden=(N, ...).",
        ),
        ({"width": 0}, "config.width must be a width >= 1, got 0. Set it with --config.width=N."),
        ({"width": 2.0}, "config.width must be a width >= 1, got 2.0"),
        ({"steps": 0}, "config.steps must be an int >= 1, got 0. Set it with --config.steps=N."),
        ({"warmup": True}, "config.warmup must be an int >= 0, got True"),
        ({"rate": 1.5}, "config.rate must be in [0, 1], got 1.5. Set it with --config.rate=VALUE."),
        ({"rate": float("nan")}, "config.rate must be in [0, 1], got nan"),
        ({"digits": 7}, "config.digits must be in [1, 6], got 7"),
        ({"drop": 1.0}, "config.drop must be in [0, 1), got 1.0. Set it with --config.drop=VALUE."),
        ({"drop": -0.1}, "config.drop must be in [0, 1), got -0.1"),
        ({"drop": float("nan")}, "config.drop must be in [0, 1), got nan"),
        ({"learning_rate": 0.0}, "config.learning_rate must be > 0, got 0.0. Set it with "),
        ({"learning_rate": "fast"}, "config.learning_rate must be > 0, got 'fast'"),
    ],
)
def test_an_entry_out_of_bounds_is_named_with_the_flag_that_sets_it(changes, message):
    with pytest.raises(DropmaskValueError) as error:
        check_config(_entries(**changes), **_RULES)
    assert str(error.value).startswith(message)


def test_a_missing_entry_is_named():
    config = _entries()
    del config["steps"]
    with pytest.raises(DropmaskValueError, match=r"config\.steps must be an int >= 1, got None"):
        check_config(config, **_RULES)


def test_the_loops_entries_are_one_table():
    """A new entry of the loop is one row: the config, the schedule and the lists follow."""
    import dataclasses

    from dropmask._workflow import _entries
    from dropmask.training._loop import Schedule

    names = [entry.name for entry in _entries.ENTRIES]
    assert sorted(base_config()) == sorted(names)
    scheduled = [entry.name for entry in _entries.SCHEDULE_ENTRIES]
    assert [field.name for field in dataclasses.fields(Schedule)] == scheduled
    schedule = Schedule.from_config(base_config())
    assert {name: getattr(schedule, name) for name in scheduled} == {
        entry.name: entry.default for entry in _entries.SCHEDULE_ENTRIES
    }
    assert set(_entries.PER_RUN_ENTRIES) | set(_entries.RUN_LENGTH_ENTRIES) <= set(names)


@pytest.mark.parametrize(
    ("entry", "value", "message"),
    [
        ("seed", 1.5, "config.seed must be an int, got 1.5"),
        ("evaluate_at_checkpoints", 1, "config.evaluate_at_checkpoints must be a bool, got 1"),
        ("checkpoint_every", -1, "config.checkpoint_every must be an int >= 0, got -1"),
    ],
)
def test_the_schedule_refuses_an_entry_of_the_wrong_kind(entry, value, message):
    from dropmask.training._loop import Schedule

    config = ml_collections.ConfigDict({**base_config().to_dict(), entry: value})
    with pytest.raises(DropmaskValueError, match=message):
        Schedule.from_config(config)


def test_check_config_choices_name_the_entry_its_values_and_the_flag():
    config = ml_collections.ConfigDict({"algorithm": "bogus", "mode": "a"})
    check_config(config, choices={"mode": ("a", "b")})
    with pytest.raises(
        DropmaskValueError,
        match=r"config.algorithm must be one of 'dense', 'blockwise', got 'bogus'. Set it "
        r"with --config.algorithm=dense",
    ):
        check_config(config, choices={"algorithm": ("dense", "blockwise")})
