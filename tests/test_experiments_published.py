"""The sweeps of conf/experiment/glue/: the published RoBERTa-base (VeRA / FourierFT, and C3A's; RoAd's and DeLoRA's
under full_halves) and DeBERTaV3-base (BOFT / HRA) GLUE tables, at each method's settings and with each method's
learning-rate grid (issue 20 item 5, issue 34 item 5).
"""
import itertools

import pytest
from hydra import compose
from omegaconf import OmegaConf

from test_experiments import CONF, hydra, sweep, swept_values  # noqa: F401  (hydra: the fixture)

SEEDS = ["0", "1", "2", "3", "4"]  # protocol full_median's and full_mean's seeds
HALVES_SEEDS = ["42", "43", "44", "45", "46"]  # protocol full_halves' (DeLoRA's)
HALVES_TASKS = ["mnli", "sst2", "mrpc", "cola", "qnli", "qqp", "rte", "stsb"]  # roberta_base_glue_delora.csv
HALVES_METHODS = ["ft", "bitfit", "lora", "ia3", "road", "delora"]
HALVES_LR = {"road": ["0.001", "0.003", "0.005", "0.007"], "delora": ["0.001", "0.003", "0.01", "0.03"]}
ROBERTA_TASKS = ["sst2", "mrpc", "cola", "qnli", "rte", "stsb"]  # ../shared/data/published/roberta_base_glue.csv
DEBERTA_TASKS = ["mnli", "sst2", "cola", "qqp", "qnli", "rte", "mrpc", "stsb"]  # deberta_v3_base_glue.csv
ROBERTA_LR = {"ft": ["1e-05", "2e-05", "3e-05"], "bitfit": ["0.0001", "0.0004", "0.0007", "0.001"],
              "lora": ["0.0004", "0.0005"], "adalora": ["0.0005", "0.0008", "0.0022"],
              "vera": ["0.001", "0.004", "0.01"], "fourierft": ["0.01", "0.05", "0.09", "0.12"],
              "c3a": ["0.07", "0.2", "0.3"]}
DEBERTA_LR = {"ft": ["1e-05", "2e-05", "3e-05"], "bitfit": ["0.0001", "0.0004", "0.0007", "0.001"],
              "lora": ["0.0004", "0.0005", "0.0008"], "adalora": ["0.0005", "0.0008", "0.0022"],
              "oft": ["0.0001", "0.0003", "0.001"], "boft": ["0.0001", "0.0003", "0.001"], "hra": ["0.0001", "0.0003", "0.001"]}
# experiment -> (protocol, model, the values each key sweeps)
EXPECTED = {
    "glue/roberta_base": ("full_median", "roberta-base",
                          {"method": list(ROBERTA_LR), "task": ROBERTA_TASKS, "seed": SEEDS}),
    "glue/deberta_v3_base": ("full_mean", "microsoft/deberta-v3-base",
                             {"method": list(DEBERTA_LR), "task": DEBERTA_TASKS, "seed": SEEDS}),
    **{f"glue/roberta_base_lr/{method}": ("full_median", "roberta-base",
                                          {"method": [method], "method.lr": rates, "task": ROBERTA_TASKS, "seed": SEEDS})
       for method, rates in ROBERTA_LR.items()},
    "glue/roberta_base_halves": ("full_halves", "roberta-base",
                                 {"method": HALVES_METHODS, "task": HALVES_TASKS, "seed": HALVES_SEEDS}),
    **{f"glue/roberta_base_halves_lr/{method}": ("full_halves", "roberta-base", {"method": [method], "method.lr": rates,
                                                                                 "task": HALVES_TASKS, "seed": HALVES_SEEDS})
       for method, rates in HALVES_LR.items()},
    **{f"glue/deberta_v3_base_lr/{method}": ("full_mean", "microsoft/deberta-v3-base",
                                             {"method": [method], "method.lr": rates, "task": DEBERTA_TASKS, "seed": SEEDS})
       for method, rates in DEBERTA_LR.items()},
}


def test_every_published_experiment_file_is_tested():
    found = sorted(str(path.relative_to(CONF / "experiment").with_suffix("")) for path in (CONF / "experiment" / "glue").rglob("*.yaml"))
    assert found == sorted(EXPECTED)


@pytest.mark.parametrize("experiment", sorted(EXPECTED))
def test_the_grid_and_the_protocol(hydra, experiment):  # noqa: F811
    protocol, model, values = EXPECTED[experiment]
    jobs = sweep(experiment)
    assert swept_values(jobs) == values
    assert len(jobs) == len({tuple(job) for job in jobs}) == len(list(itertools.product(*values.values())))
    columns = [[f"{key}={value}" for value in column] for key, column in values.items()]
    # the table files: jobs that use every method and task once; a grid file: its first job (its values are above)
    count = 1 if "_lr/" in experiment else max(map(len, columns))
    for job in itertools.islice(zip(*(itertools.cycle(column) for column in columns)), count):
        cfg = compose("config", overrides=[f"+experiment={experiment}", *job])  # a missing method fails here
        assert (cfg.protocol.name, cfg.model.name, cfg.k) == (protocol, model, "all")
        assert cfg.method.name == job[0].split("=", 1)[1]
        assert cfg.fuse == ("_lr/" in experiment)  # the grids train as fused groups
        if "method.lr" in values:
            assert str(OmegaConf.select(cfg, "method.lr")) == job[1].split("=", 1)[1]


def test_each_file_opens_with_its_command():
    for experiment in EXPECTED:
        lines = (CONF / "experiment" / f"{experiment}.yaml").read_text().splitlines()
        assert lines[0] == "# @package _global_" and f"#   peltbench -m +experiment={experiment}" in lines
