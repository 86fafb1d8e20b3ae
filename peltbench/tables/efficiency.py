"""Table 4 (§4.4): trainable parameters and training / inference time relative to fine-tuning.

Parameters are what the pooled model's records carry: `trainable_params` (docs/protocol.md §4's count, head
excluded) over the same records' `backbone_params`, so a percentage is of that model's backbone, whatever its
architecture (nothing here knows BERT-base's sizes). Training time is seconds per optimiser step and inference
time seconds per test example: each is averaged over the seeds of one (task, K), divided by fine-tuning's on the
same (task, K), and the ratios are averaged over every (task, K) that both methods ran. A fused run (trained
together with others on one backbone, `fused.size` > 1) records its group's wall time, so its times are left
out; its parameters count as usual. A run that records no training steps (or no test examples) has no time per
step (per example): that time is left out too, never a division by zero.
"""
import pandas as pd

from .names import EFFICIENCY_METHODS, order_of

COLUMNS = ["trainable_params", "backbone_params", "params_percent", "train_time_percent", "inference_time_percent", "setups"]


def efficiency_table(runs):
    """One row per method (Table 4's order) from ok runs with default settings; times NaN without fine-tuning."""
    ok = runs[runs["status"] == "ok"]
    if ok.empty:
        return pd.DataFrame(columns=COLUMNS).rename_axis("method")
    table = _parameter_counts(ok)
    table["params_percent"] = 100 * table["trainable_params"].astype(float) / table["backbone_params"].astype(float)
    timed = ok[~is_fused(ok)]
    train_time, setups = _relative_to_fine_tuning(timed, "train_seconds", "train_steps")
    inference_time, _ = _relative_to_fine_tuning(timed, "test_seconds", "test_examples")
    table["train_time_percent"] = 100 * train_time
    table["inference_time_percent"] = 100 * inference_time
    table["setups"] = setups.reindex(table.index).fillna(0).astype(int)
    return table.loc[sorted(table.index, key=lambda method: order_of(method, EFFICIENCY_METHODS)), COLUMNS]


def is_fused(runs):
    """Runs trained in a fused group of more than one: their seconds are the whole group's."""
    return pd.to_numeric(runs["fused_size"], errors="coerce").fillna(1) > 1


def without_units(runs, units):
    """Ok runs that record 0 `units` (`train_steps`, `test_examples`): no time per unit, left out of that ratio."""
    ok = runs[runs["status"] == "ok"]
    return ok[_numbers(ok[units]) <= 0]


def _numbers(values):
    return pd.to_numeric(values, errors="coerce")


def machines(runs):
    """The distinct machines (GPU, else CPU, else device) that timed these runs, for Table 4's caption."""
    timed = runs[(runs["status"] == "ok") & ~is_fused(runs)]
    names = timed["machine_gpu"].fillna(timed["machine_cpu"]).fillna(timed["device"]).dropna()
    return sorted(set(names))


def _parameter_counts(ok):
    """Per method, the (trainable_params, backbone_params) pair most of its records carry (the same on every task):
    the percentage divides counts of the same records. <NA> where no record carries a count."""
    counted = ok.dropna(subset=["trainable_params"])
    pairs = counted.groupby(["method", "trainable_params", "backbone_params"], dropna=False).size().rename("records")
    pairs = pairs.reset_index().sort_values(["records", "trainable_params"], ascending=[False, True])
    pairs = pairs.drop_duplicates("method")
    table = pairs.set_index("method")[["trainable_params", "backbone_params"]].reindex(sorted(set(ok["method"])))
    return table.astype("Int64")


def _relative_to_fine_tuning(ok, seconds, units):
    """Mean over (task, K) of method / fine-tuning seconds per unit; also how many (task, K) each ratio used."""
    if ok.empty:
        return pd.Series(dtype=float), pd.Series(dtype=int)
    counted = _numbers(ok[units])
    per_unit = (_numbers(ok[seconds]) / counted.where(counted > 0)).rename("per_unit")
    by_setup = ok.assign(per_unit=per_unit).groupby(["method", "task", "k"])["per_unit"].mean().unstack("method")
    if "ft" not in by_setup:
        return pd.Series(dtype=float), pd.Series(dtype=int)
    ratios = by_setup.div(by_setup["ft"].where(by_setup["ft"] > 0), axis=0)  # fine-tuning's 0.000 s: no ratio
    return ratios.mean(), ratios.notna().sum()
