from benchmarks import site_hlo


def test_a_site_is_counted_from_its_compiled_program(capsys) -> None:
    row = site_hlo.measure("dropmask")
    assert row["lines"] > 100
    assert row["ops"]["add"] > 0 and row["ops"]["xor"] > 0  # the rounds are in it
    assert site_hlo.main(["--only", "flax-attention-0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("flax-attention-0: compile ") and " lines; " in out
