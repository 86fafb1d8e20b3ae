"""Hints and captions per protocol (issue 26 item 4): every sweep a render proposes is a command peltbench accepts
(checked here by composing its runs with `-m ... --cfg job`, nothing trained) whose runs land in the cells shown:
the render's model and protocol, the protocol's K and seeds. Captions state K per class or in total, the rows that
select and the rows reported, each task's metric and the statistic."""
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from conftest import compose_config
from peltbench.cli import preflight
from peltbench.tables.command import main
from peltbench.tables.comparability import protocol_label, run_protocol

MODEL = "/ckpt/mini"


def write_run(root: Path, protocol: str, method: str, task: str, k, seed: int, main_score: float, *extra: str) -> None:
    """A record whose config is the real composed one of `protocol` (so its protocol label is the real label)."""
    config = OmegaConf.to_container(compose_config(f"protocol={protocol}", f"method={method}", f"task={task}", f"k={k}",
                                                   f"seed={seed}", f"model.name={MODEL}", *extra), resolve=True)
    config.pop("hydra", None)
    folder = root / protocol / method / task / f"k{k}" / f"seed{seed}"
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps({
        "method": method, "variant": method, "task": task, "k": config["k"], "seed": seed, "model": MODEL, "status": "ok",
        "test": {"main": main_score}, "dev_best": {"main": main_score}, "precision": "fp32", "config": config}))


def render(tmp_path, protocol, runs):
    out = tmp_path / "out"
    option = [] if protocol == "unipelt" else ["--protocol", f"protocol={protocol}"]
    assert main(["--results-dir", str(runs), "--out", str(out), "--paper-dir", str(tmp_path / "none"), *option]) == 0
    return out


def hints(out):
    """{command: [files naming it]} for every `peltbench -m ...` the render's Markdown proposes."""
    found = {}
    for path in sorted(out.glob("*.md")):
        for command in re.findall(r"`(peltbench -m [^`]+)`", path.read_text()):
            found.setdefault(command, []).append(path.name)
    return found


def jobs(command):
    """Each run the hinted sweep would start, composed and checked as `peltbench` does (narrowed to one task and,
    where the sweep has several, one method, as a key after the experiment replaces the sweep's values)."""
    words = shlex.split(command)
    assert words[:2] == ["peltbench", "-m"]
    pinned = any(word.startswith("method=") for word in words) or "+experiment=fig" in command
    narrow = ["task=rte", *([] if pinned else ["method=lora"])]
    text = preflight([*words[1:], *narrow, "--cfg", "job", "--resolve"])
    return [yaml.safe_load(part.split("\n", 1)[1]) for part in text.split("# run ")[1:]]


def label_of(config):
    return protocol_label(run_protocol(config, config["precision"]))


CASES = {  # protocol: (K of the records, seeds, the label a render pools)
    "unipelt": ("100", (111, 222), "train.epochs=3,precision=fp32"),
    "lmbff": ("16", (13, 21), "protocol=lmbff,precision=fp32"),
    "full_median": ("all", (0, 1), "protocol=full_median,precision=fp32"),
}


@pytest.mark.parametrize("protocol", list(CASES))
def test_every_hint_is_accepted_and_fills_the_cells_shown(tmp_path, protocol):
    k, seeds, label = CASES[protocol]
    extra = ("train.epochs=3",) if protocol == "unipelt" else ()
    for seed in seeds:
        write_run(tmp_path / "runs", protocol, "lora", "rte", k, seed, 60.0 + seed % 7, *extra, "precision=fp32")
    option = ["--protocol", "train.epochs=3"] if protocol == "unipelt" else ["--protocol", f"protocol={protocol}"]
    out = tmp_path / "out"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--paper-dir", str(tmp_path), *option]) == 0
    found = hints(out)
    assert found, "a render with empty tables proposes sweeps"
    protocol_seeds = {"unipelt": None, "lmbff": {13, 21, 42, 87, 100}, "full_median": {0, 1, 2, 3, 4}}[protocol]
    for command, files in found.items():
        runs = jobs(command)
        assert runs, command
        for config in runs:
            assert label_of(config) == label, (command, files)  # the runs land in this render's protocol
            assert config["model"]["name"] == MODEL
            if protocol != "unipelt":
                assert str(config["k"]) == k, (command, files)  # the protocol's K, never UniPELT's 100/500/1000
        if protocol_seeds and "+experiment=table4" not in command:
            assert {config["seed"] for config in runs} == protocol_seeds, command
    # no sweep of the protocol can fill Tables 1 and 2 (few-shot) under full_median, or Table 3 (K = all) under lmbff
    empty = {"unipelt": (), "lmbff": ("table3.md",), "full_median": ("table1.md", "table2.md")}[protocol]
    for name in empty:
        text = (out / name).read_text()
        assert "peltbench -m" not in text and "cannot be run under it" in text
    assert any("+experiment=table3" in command for command in found) == (protocol != "lmbff")
    assert any("method=ln save.weights=true" in command for command in found)  # the classifier's LN figure
    assert any("+experiment=table1" in command for command in found) == (protocol != "full_median")


def test_captions_follow_the_protocol(tmp_path):
    runs = tmp_path / "runs"
    for seed in (13, 21):
        write_run(runs, "lmbff", "lora", "rte", 16, seed, 60.0 + seed)
        write_run(runs, "lmbff", "lora", "stsb", 16, seed, 70.0 + seed)
    for seed in (42, 43):
        write_run(runs, "full_halves", "lora", "rte", "all", seed, 70.0 + seed)
    lmbff = render(tmp_path / "a", "lmbff", runs)
    table1 = (lmbff / "table1.md").read_text()
    assert "K = 16 training examples per class" in table1 and "K = {16}" not in table1
    assert "Best epoch (or evaluation step) chosen on: a dev set of K train rows per class" in table1
    assert "STS-B Pearson corr." in table1 and "Spearman" not in table1 and "Mean and standard deviation over data seeds 13, 21 (std with ddof = 1; 5 seeds expected per cell)" in table1  # LM-BFF: Pearson
    assert "Table 1: results on GLUE with K training examples per class (test)" in table1
    assert "[$K = 16$ per class] Test Performance" in (lmbff / "table1.tex").read_text()
    halves = render(tmp_path / "b", "full_halves", runs)
    table3 = (halves / "table3.md").read_text()
    assert "best performance on the GLUE dev split" not in table3.lower()
    assert "best-epoch performance on the part of GLUE dev not used for selection" in table3
    assert "Best epoch chosen on: one part of GLUE dev (never a reported row)" in table3
    assert "Best Performance on the Held-out Part of GLUE Dev" in (halves / "table3.tex").read_text()
    assert "Mean over data seeds 42, 43 (5 seeds expected per cell)" in table3 and "(n=2)" in table3  # full_halves' 5


def test_a_tasks_metric_is_the_one_its_records_rank_by(tmp_path):
    """A protocol that ranks STS-B by Pearson (its records' `task.main_metric`) is captioned so."""
    runs = tmp_path / "runs"
    for seed in (13, 21):
        write_run(runs, "lmbff", "lora", "stsb", 16, seed, 70.0, "task.main_metric=pearson")
    text = (render(tmp_path, "lmbff", runs) / "table1.md").read_text()
    assert "STS-B Pearson corr." in text and "Spearman" not in text


def test_a_tasks_metric_is_the_one_its_main_score_is(tmp_path):
    """Whatever the config says, the caption names the metric whose value test.main holds."""
    runs = tmp_path / "runs"
    for seed in (13, 21):
        write_run(runs, "lmbff", "lora", "stsb", 16, seed, 70.0)
        path = runs / "lmbff" / "lora" / "stsb" / "k16" / f"seed{seed}" / "result.json"
        record = json.loads(path.read_text())
        record["test"] = {"main": 70.0 + seed, "pearson": 70.0 + seed, "spearman": 60.0}
        path.write_text(json.dumps(record))
    text = (render(tmp_path, "lmbff", runs) / "table1.md").read_text()
    assert "STS-B Pearson corr." in text and "Spearman" not in text


def test_hints_sweep_the_renders_tasks_from_its_data_dir(tmp_path):
    """Issue 32 item 6: the hints had no data.dir and swept all 8 tasks, so they failed offline. Runs on RTE and
    SST-2 from the shipped GLUE folder: every hint sweeps those tasks (a figure's too) from that folder, and its whole
    sweep passes peltbench's own check of the folder (each task's files)."""
    glue = str(Path(__file__).resolve().parents[1] / "data" / "glue")
    for task in ("rte", "sst2"):
        for seed in (111, 222):
            write_run(tmp_path / "runs", "unipelt", "lora", task, 100, seed, 60.0 + seed % 7, "train.epochs=3",
                      "precision=fp32", f"data.dir={glue}")
    out = tmp_path / "out"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--paper-dir", str(tmp_path),
                 "--protocol", "train.epochs=3"]) == 0
    found = hints(out)
    assert any("+experiment=fig3_lora_scale" in command for command in found)  # STS-B and QQP in the file: not shipped
    for command in found:
        words = shlex.split(command)
        assert f"data.dir={glue}" in words, command
        assert [word for word in words if word.startswith("task=")] == ["task=sst2,rte"], command
        pinned = any(word.startswith("method=") for word in words) or "+experiment=fig" in command
        text = preflight([*words[1:], *([] if pinned else ["method=lora"]), "k=100", "seed=111", "--cfg", "job"])
        configs = [yaml.safe_load(part.split("\n", 1)[1]) for part in text.split("# run ")[1:]]
        assert {config["task"]["name"] for config in configs} == {"rte", "sst2"}, command
        assert {config["data"]["dir"] for config in configs} == {glue}


CLOZE = ("objective=cloze", "objective.demonstrations=true",
         "objective.template='*cls**sent_0*_?*mask*,*+sentl_1**sep+*'",
         "objective.label_words={entailment: 'Yes', not_entailment: No}")


def test_a_cloze_renders_hints_repeat_its_prompt_whole_and_fill_its_cells(tmp_path):
    """A label holds a template and label words only as digests (`objective.template=sha-...`, no value a run takes):
    each hint writes them out whole, as the runs' records hold them, and its runs land in the render's label."""
    for seed in (13, 21):
        write_run(tmp_path / "runs", "lmbff", "lora", "rte", 16, seed, 60.0 + seed, *CLOZE)
    config = json.loads(next((tmp_path / "runs").rglob("result.json")).read_text())["config"]
    label = label_of({**config, "precision": "fp32"})
    assert re.fullmatch(r"protocol=lmbff,objective=cloze,objective\.demonstrations=true,objective\.label_words="
                        r"sha-[0-9a-f]{8},objective\.template=sha-[0-9a-f]{8},precision=fp32", label)
    out = tmp_path / "out"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--paper-dir", str(tmp_path),
                 "--protocol", label]) == 0
    found = hints(out)
    assert found
    assert not any("method=ln" in command for command in found)  # LN-tuning's figure is of classifier runs
    assert "| `fig_ln_change.png` | not drawn: the LN-tuning paper's Figure 3 is of classifier runs" in \
        (out / "README.md").read_text()
    for command in found:
        assert "sha-" not in command, command
        assert 'objective.template="*cls**sent_0*_?*mask*,*+sentl_1**sep+*"' in shlex.split(command), command
        for run in jobs(command):
            assert label_of(run) == label, command
            assert run["objective"]["template"] == "*cls**sent_0*_?*mask*,*+sentl_1**sep+*"


def test_a_digest_no_override_gives_back_is_left_out_of_a_hint_and_said(tmp_path):
    import pandas as pd

    from peltbench.tables.captions import written_out
    from peltbench.tables.comparability import Selection
    from peltbench.tables.outputs import Render, _sweep

    label = "protocol=lmbff,objective=cloze,objective.template=sha-0123abcd,precision=fp32"
    unwritable = {"objective": {"name": "cloze", "template": "*cls**sent_0*_${oops}*mask*.*sep+*"}}
    assert written_out(label, [unwritable]) == {}  # Hydra would interpolate it
    render = Render(Selection(MODEL, "", label, ""), 5, 1, None, pd.DataFrame())
    command = _sweep("table1", render)
    assert "objective=cloze" in command and "objective.template" not in command
    assert render.notes == ["The sweep commands leave out objective.template: the label holds only a digest of the "
                            "runs' value, which no override repeats; add it as their records' config holds it"]
    assert written_out(label, [{"objective": {"template": 'a "quoted" *mask*'}}]) == {
        "objective.template": 'objective.template="a \\"quoted\\" *mask*"'}
