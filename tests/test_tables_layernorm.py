"""The LN-tuning paper's Figure 3 on GLUE from saved LN runs (peltbench.tables.layernorm, issue 9 item 7).

The saved weights are written here as a run with `save.weights=true` writes them (BertForSequenceClassification
state_dict names, method-specific keys beside them): the tiny checkpoint's own LayerNorms moved by known amounts.
"""
import csv

import pytest

from peltbench.tables import load_records, main
from peltbench.tables.layernorm import layernorm_changes
from test_tables import write_record

# How far each saved term is moved from the tiny checkpoint's: layer 1 gains by 0.1, layer 2 by 0.2 (after
# attention), every FFN bias by -0.05, the embeddings' gain by 0.3; in seed 222 everything moves twice as far.
GAIN_MHA = {1: 0.1, 2: 0.2}
BIAS_FFN = -0.05
EMBEDDINGS_GAIN = 0.3


def save_ln_run(root, checkpoint, task, seed, scale=1.0):
    import torch
    from safetensors.torch import save_file
    from transformers import BertForSequenceClassification

    path = write_record(root, "ln", task, 100, seed, 60.0, model=str(checkpoint))
    state = BertForSequenceClassification.from_pretrained(checkpoint).state_dict()
    saved = {name: tensor.clone() for name, tensor in state.items() if "LayerNorm" in name or name.startswith("classifier")}
    for layer, delta in GAIN_MHA.items():
        saved[f"bert.encoder.layer.{layer - 1}.attention.output.LayerNorm.weight"] += scale * delta
        saved[f"bert.encoder.layer.{layer - 1}.output.LayerNorm.bias"] += scale * BIAS_FFN
    saved["bert.embeddings.LayerNorm.weight"] += scale * EMBEDDINGS_GAIN
    saved["classifier.weight"] += 1.0                                    # trained, but not a LayerNorm
    saved["bert.encoder.layer.0.output.adapter.down.weight"] = torch.ones(4, 32)  # a method's own module: ignored
    save_file(saved, str(path.parent / "weights.safetensors"))
    return path


@pytest.fixture
def ln_runs(tmp_path, tiny_checkpoint):
    runs = tmp_path / "runs"
    save_ln_run(runs, tiny_checkpoint, "rte", 111)
    save_ln_run(runs, tiny_checkpoint, "rte", 222, scale=2.0)
    save_ln_run(runs, tiny_checkpoint, "cola", 111)
    return runs


def test_changes_are_mean_absolute_differences_from_the_pretrained_values(ln_runs):
    records = load_records(ln_runs)
    changes = layernorm_changes(records[records["seed"] == 222])
    found = {(row.term, row.module, row.layer): row.change for row in changes.itertuples()}
    assert found == pytest.approx({
        ("Gain", "MHA", 1): 0.2, ("Gain", "MHA", 2): 0.4, ("Bias", "MHA", 1): 0, ("Bias", "MHA", 2): 0,
        ("Gain", "FFN", 1): 0, ("Gain", "FFN", 2): 0, ("Bias", "FFN", 1): 0.1, ("Bias", "FFN", 2): 0.1,
        ("Gain", "embeddings", 0): 0.6, ("Bias", "embeddings", 0): 0}, abs=1e-6)


def test_make_tables_draws_the_figure_and_writes_its_numbers(ln_runs, tmp_path):
    out = tmp_path / "out"
    assert main(["--results-dir", str(ln_runs), "--out", str(out), "--paper-dir", str(tmp_path)]) == 0
    assert (out / "fig_ln_change.png").stat().st_size > 10_000
    with open(out / "fig_ln_change.csv") as file:
        rows = {(row["task"], row["term"], row["module"], row["layer"]): row for row in csv.DictReader(file)}
    rte = rows["rte", "Gain", "MHA", "2"]                         # seeds 111 and 222: 0.2 and 0.4
    assert (float(rte["change"]), rte["n"], rte["k"]) == (pytest.approx(0.3, abs=1e-6), "2", "100")
    assert float(rows["cola", "Bias", "FFN", "1"]["change"]) == pytest.approx(0.05, abs=1e-6)
    assert "fig_ln_change.png / .csv" in (out / "README.md").read_text()


def test_the_figure_has_the_papers_layout(ln_runs):
    from peltbench.tables.layernorm import layernorm_figure, mean_changes

    figure = layernorm_figure(mean_changes(layernorm_changes(load_records(ln_runs))), "100")
    titles = sorted(axes.get_title() for axes in figure.axes if axes.get_title())
    assert titles == ["CoLA (n = 1)", "RTE (n = 2)"]
    panel = next(axes for axes in figure.axes if axes.get_title() == "RTE (n = 2)")
    assert [label.get_text() for label in panel.get_yticklabels()] == ["Gain MHA", "Gain FFN", "Bias MHA", "Bias FFN"]
    grid = panel.images[0].get_array()
    assert grid.shape == (4, 2)                                   # two layers in the tiny model
    assert grid[0].tolist() == pytest.approx([0.15, 0.3], abs=1e-6)  # Gain MHA per layer, mean of seeds


def test_a_model_that_cannot_be_loaded_offline_skips_the_figure_in_one_line(tmp_path, tiny_checkpoint, capsys):
    runs = tmp_path / "runs"
    path = save_ln_run(runs, tiny_checkpoint, "rte", 111)
    text = path.read_text().replace(str(tiny_checkpoint), str(tmp_path / "gone"))
    path.write_text(text)
    assert main(["--results-dir", str(runs), "--out", str(tmp_path / "out"), "--paper-dir", str(tmp_path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "LN figure" in line or "fig_ln" in line]
    assert lines[0].startswith(f"LN figure: skipped for {tmp_path / 'gone'}: the pretrained model cannot be loaded offline (")
    assert len(lines) == 2 and "fig_ln_change.png not drawn: no saved LN-tuning run could be compared" in lines[1]
    assert not (tmp_path / "out" / "fig_ln_change.png").exists()


def test_a_corrupt_weights_file_is_skipped_in_one_line(tmp_path, tiny_checkpoint, capsys):
    runs = tmp_path / "runs"
    save_ln_run(runs, tiny_checkpoint, "rte", 111)
    bad = save_ln_run(runs, tiny_checkpoint, "rte", 222).parent / "weights.safetensors"
    bad.write_bytes(bad.read_bytes()[:100])
    records = load_records(runs)
    changes = layernorm_changes(records, say=print)
    assert set(changes["seed"]) == {111}
    (line,) = [line for line in capsys.readouterr().out.splitlines()]
    assert line.startswith(f"LN figure: {bad.parent / 'result.json'}: skipped: {bad} is not a readable safetensors file")


def test_without_saved_ln_runs_it_names_the_sweep(tmp_path, capsys):
    write_record(tmp_path, "ln", "rte", 100, 111, 60.0)  # an LN run that did not save its weights
    assert main(["--results-dir", str(tmp_path), "--out", str(tmp_path / "out"), "--paper-dir", str(tmp_path)]) == 0
    assert ("fig_ln_change.png not drawn: no LN-tuning run saved its weights; "
            "`peltbench -m +experiment=table1 method=ln save.weights=true task=rte precision=fp32` fills it"
            ) in capsys.readouterr().out


@pytest.mark.parametrize("model_type", ["roberta", "deberta-v2", "modernbert"])
def test_other_encoders_real_ln_runs_give_their_changes(model_type, tmp_path, glue_dir):
    """A real LN-tuning run with save.weights on each other architecture: its LayerNorms (ModernBERT: the norms
    before attention and FFN, with zero pretrained biases) are found and compared with the pretrained model's."""
    from conftest import compose_config, save_tiny_encoder
    from peltbench.runner import run_group

    checkpoint = save_tiny_encoder(model_type, tmp_path / "ckpt")
    cfg = compose_config("method=ln", "task=rte", f"model.name={checkpoint}", f"data.dir={glue_dir}",
                         f"results_dir={tmp_path / 'runs'}", "k=16", "dev_size=20", "train.epochs=2", "logger=[]",
                         "save.weights=true", "method.lr=0.05")
    [outcome] = run_group([cfg])
    assert outcome.status == "ok"
    changes = layernorm_changes(load_records(tmp_path / "runs"))
    found = {(row.term, row.module, row.layer) for row in changes.itertuples()}
    layers = {"MHA": {2} if model_type == "modernbert" else {1, 2}, "FFN": {1, 2}}  # ModernBERT's layer 1 has none
    assert found == {(term, module, layer) for term in ("Gain", "Bias") for module in ("MHA", "FFN")
                     for layer in layers[module]} | {("Gain", "embeddings", 0), ("Bias", "embeddings", 0)}
    assert (changes["change"] > 0).all()  # lr 0.05 for 2 epochs moves every gain and bias
