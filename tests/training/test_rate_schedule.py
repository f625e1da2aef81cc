"""``config.rate_schedule``: one compilation for the run, exact resume, refused when unknown."""

import pytest
from digits_tiny import digits_example, tiny_config

from dropmask import DropmaskValueError
from dropmask.training import CheckpointError, RateSchedule, train


def test_parsing_and_values():
    config = tiny_config()
    assert RateSchedule.from_config(config) is None  # "constant"
    config.rate, config.rate_schedule = 0.5, "warmdown:4"
    schedule = RateSchedule.from_config(config)
    assert schedule is not None
    assert [float(schedule(s)) for s in range(6)] == [0.5, 0.375, 0.25, 0.125, 0.0, 0.0]
    for bad in ("early", "early:-1", "cosine:5", "warmdown:0", "late:1.5"):
        config.rate_schedule = bad
        with pytest.raises(DropmaskValueError, match="--config.rate_schedule must be"):
            RateSchedule.from_config(config)


@pytest.mark.slow
def test_a_scheduled_run_compiles_once_and_resumes_exactly(tmp_path):
    from dropmask.examples.digits.train import train_step

    example = digits_example()
    config = tiny_config()
    config.rate_schedule = "early:6"
    before = train_step._cache_size()
    whole = train(example, config, tmp_path / "whole", devices=1, progress=False)
    assert train_step._cache_size() - before <= 1  # 12 steps, two rates, one program
    config.steps = 8
    first = train(example, config, tmp_path / "parts", devices=1, progress=False)
    config.steps = 12
    rest = train(example, config, tmp_path / "parts", devices=1, progress=False, resume=True)
    assert first.losses + rest.losses == whole.losses  # exact float equality
    assert rest.final == whole.final
    config.rate_schedule = "early:7"
    with pytest.raises(CheckpointError, match="rate_schedule"):
        train(example, config, tmp_path / "parts", devices=1, progress=False, resume=True)
