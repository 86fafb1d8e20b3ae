"""The sweeps of conf/experiment/*.yaml: `peltbench -m +experiment=NAME` launches exactly the runs a table needs.

Each sweep is expanded the way Hydra's basic sweeper does (its `hydra.sweeper.params` joined with the
command line, then the cartesian product), and jobs covering every swept value are composed for real.
"""
import itertools
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[1] / "conf"
TASKS = ["sst2", "mrpc", "cola", "rte", "qnli", "stsb", "mnli", "qqp"]  # Table 1's column order
SEEDS = ["111", "222", "333", "444", "555"]                              # App. B

# experiment -> the values each key sweeps (from the paper's text; see each file's header)
EXPECTED = {
    "table1": {"method": ["ft", "bitfit", "adapter", "prefix", "lora", "unipelt_ap", "unipelt_apl"],
               "task": TASKS, "k": ["100", "500", "1000"], "seed": SEEDS},
    "table1_prefix_l50": {"method": ["prefix_l50"], "task": TASKS, "k": ["100"], "seed": SEEDS},
    "table2": {"method": ["adapter", "prefix", "lora", "unipelt_ap", "unipelt_apl"], "task": TASKS,
               "k": ["100", "500", "1000"], "seed": SEEDS},
    "table3": {"method": ["ft", "adapter", "prefix", "lora", "unipelt_ap", "unipelt_ap_nogate", "unipelt_apl"],
               "task": TASKS, "k": ["all"], "seed": ["111"]},
    "table4": {"method": ["ft", "bitfit", "prefix", "lora", "adapter", "unipelt_ap", "unipelt_apl"],
               "task": TASKS, "k": ["1000"], "seed": ["111"]},
    "fig2_bottleneck": {"method": ["adapter"], "method.bottleneck": ["48", "64", "128", "256"], "task": ["cola"],
                        "k": ["100"], "seed": SEEDS},
    "fig3_lora_scale": {"method": ["lora"], "method.lora_scale": ["1.0", "2.0", "4.0", "8.0", "16.0"],
                        "task": ["stsb", "qqp"], "k": ["100", "1000"], "seed": SEEDS},
}
RUNS = {"table1": 840, "table1_prefix_l50": 40, "table2": 600, "table3": 56, "table4": 56,
        "fig2_bottleneck": 20, "fig3_lora_scale": 100}  # the products stated in each file's header


@pytest.fixture(scope="module")
def hydra():
    from peltbench.launchers import register_launchers

    register_launchers()  # conf/config.yaml's launcher, as the peltbench command registers it (not only when another
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):  # test ran the command first)
        yield


def sweep(experiment, command_line=()):
    """The jobs' override lists, as BasicSweeper.sweep builds them from the config and the command line."""
    cfg = compose("config", overrides=[f"+experiment={experiment}", "method=ft", "task=cola"], return_hydra_config=True)
    params = [f"{key}={value}" for key, value in cfg.hydra.sweeper.params.items()]
    overrides = OverridesParser.create().parse_overrides([f"+experiment={experiment}", *params, *command_line])
    return BasicSweeper.split_arguments(overrides, None)[0]


def swept_values(jobs):
    values = {}
    for job in jobs:
        for override in job[1:]:  # job[0] is +experiment=...
            key, value = override.split("=", 1)
            values.setdefault(key, [])
            if value not in values[key]:
                values[key].append(value)
    return values


def test_every_experiment_file_is_tested():
    assert sorted(path.stem for path in (CONF / "experiment").glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("experiment", sorted(EXPECTED))
def test_sweep_launches_exactly_the_runs_of_its_table(hydra, experiment):
    jobs = sweep(experiment)
    assert len(jobs) == RUNS[experiment]
    assert swept_values(jobs) == EXPECTED[experiment]
    assert len({tuple(job) for job in jobs}) == len(jobs)  # no run twice


@pytest.mark.parametrize("experiment", sorted(EXPECTED))
def test_every_swept_value_composes(hydra, experiment):
    """A handful of jobs that together use every value once: a typo in a method or setting name fails here."""
    columns = [[f"{key}={value}" for value in values] for key, values in EXPECTED[experiment].items()]
    for job in itertools.islice(zip(*(itertools.cycle(column) for column in columns)), max(map(len, columns))):
        cfg = compose("config", overrides=[f"+experiment={experiment}", *job])
        for override in job:
            key, value = override.split("=", 1)
            # a config group (method, task) names its choice; a plain key holds the value
            chosen = OmegaConf.select(cfg, f"{key}.name" if key in ("method", "task") else key)
            assert str(chosen) == value


def test_command_line_narrows_a_sweep(hydra):
    jobs = sweep("table1", ["task=rte", "k=100"])  # a later key=value replaces the sweep's, as in the header
    assert len(jobs) == 7 * 5


def test_each_file_opens_with_its_command():
    for path in (CONF / "experiment").glob("*.yaml"):
        lines = path.read_text().splitlines()
        assert lines[0] == "# @package _global_"
        assert f"#   peltbench -m +experiment={path.stem}" in lines, path.name
