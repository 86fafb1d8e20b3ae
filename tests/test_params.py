"""`peltbench-params` prints METHODS.md's counts for bert-base-uncased without downloading anything."""

from __future__ import annotations

from peltbench.params import main, paper_rounding


def test_prints_the_methods_table(capsys):
    main([])
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split() and line.split()[0].isidentifier()}
    # METHODS.md's table, and Table 4's rounding of it
    for method, count, rounded in [("ft", "109,482,240", "110M"), ("bitfit", "102,912", "103K"),
                                   ("prefix", "184,320", "184K"), ("lora", "294,912", "295K"),
                                   ("adapter", "894,528", "895K"), ("unipelt_ap", "1,097,304", "1.1M"),
                                   ("unipelt_apl", "1,410,672", "1.4M"), ("ln", "38,400", "38K"),
                                   ("prefix_ln", "222,720", "223K")]:
        assert rows[method][1:3] == [count, rounded], method


def test_csv(capsys):
    main(["--csv", "--num-labels", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("method,trainable_params")
    adapter = next(line for line in lines if line.startswith("adapter,"))
    assert adapter.split(",")[1] == "894528" and adapter.split(",")[3] == "769"  # 1-way head: 768 + 1


def test_local_model_config(tiny_checkpoint, capsys):
    main(["--model", str(tiny_checkpoint)])
    out = capsys.readouterr().out
    assert "6,304" in out  # adapter on the tiny config (tests/test_methods.py)
    # C3A's block size 128 cannot tile hidden 32: its row says so, the others are counted
    [c3a] = [line for line in out.splitlines() if line.startswith("c3a ")]
    assert "not on this model: c3a_block_size=128 must divide" in c3a
    main(["--model", str(tiny_checkpoint), "--csv"])
    assert "\nc3a,,,,," in capsys.readouterr().out


def test_paper_rounding():
    assert [paper_rounding(n) for n in (102_912, 894_528, 1_097_304, 1_410_672, 109_482_240)] == [
        "103K", "895K", "1.1M", "1.4M", "110M"]
