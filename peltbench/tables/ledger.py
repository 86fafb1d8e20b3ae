"""Every record accounted for: what went into the tables and figures, and why the rest did not.

The console's counts and `other_runs.md` come from one `Ledger`, so a count the console says is the
number of runs listed (issue 8: 15 runs were once said to be in figures and were in none).
"""
from dataclasses import dataclass

import pandas as pd

from .markdown import frame_markdown
from .names import TASKS, k_order, method_label, method_order, order_of
from .records import SKIPPED
from .comparability import canonical, model_label, most_common, parse_protocol, render_options


@dataclass
class Ledger:
    """Where each record went. Frames are rows of `load_records`; `unreadable` is every result.json left out
    (records.Skipped: path, kind, reason)."""

    in_tables: pd.DataFrame        # the chosen model and protocol, default method settings, one per seed
    only_in_figures: pd.DataFrame  # non-default method settings that Figure 2 or 3 plots
    not_plotted: pd.DataFrame      # non-default method settings that no figure plots
    other_settings: pd.DataFrame   # another model or protocol
    unknown: pd.DataFrame          # a method or task peltbench does not have
    duplicates: pd.DataFrame       # every record of a seed recorded more than once (column `duplicate`)
    duplicates_left_out: int      # how many of those were not counted
    unreadable: list
    only_in_selection: pd.DataFrame = None  # --select's candidates that were not chosen (selection.csv lists them)

    def summary(self):
        """One console line that adds up: every record is in exactly one of these counts."""
        listed = {
            "other model or protocol": len(self.other_settings),
            "non-default method settings in no figure": len(self.not_plotted),
            "unknown method or task": len(self.unknown),
            "repeated seeds not counted": self.duplicates_left_out,
        }
        candidates = 0 if self.only_in_selection is None else len(self.only_in_selection)
        total = len(self.in_tables) + len(self.only_in_figures) + candidates + sum(listed.values())
        details = ", ".join(f"{count} {what}" for what, count in listed.items() if count)
        chosen = f"{candidates} only in selection.csv (candidates not chosen), " if candidates else ""
        text = (f"{total} records: {len(self.in_tables)} in the tables, {len(self.only_in_figures)} only in figures, {chosen}"
                f"{sum(listed.values())} listed in other_runs.md" + (f" ({details})" if details else ""))
        return text + (f"; {skipped_counts(self.unreadable)} skipped" if self.unreadable else "")


def skipped_counts(skipped):
    """`1 damaged record, 2 unreadable files`: how many result.json were left out, of each kind (records.SKIPPED)."""
    counts = {kind: sum(which == kind for _, which, _ in skipped) for kind in SKIPPED}
    return ", ".join(f"{count} {SKIPPED[kind][count != 1]}" for kind, count in counts.items() if count)


def other_settings_groups(runs):
    """Runs of other models or protocols, one row per (model, protocol): architecture, counts, methods, tasks and K."""
    if runs.empty:
        return pd.DataFrame(columns=["model", "protocol", "architecture", "runs", "failed", "methods", "tasks", "k"])
    groups = runs.groupby(["model", "protocol"], sort=True)
    return pd.DataFrame({
        "architecture": groups["architecture"].agg(most_common),
        "runs": groups.size(),
        "failed": groups["status"].agg(lambda status: int((status == "failed").sum())),
        "methods": groups["method"].agg(lambda names: _listed(names, method_order)),
        "tasks": groups["task"].agg(lambda names: _listed(names, lambda name: order_of(name, TASKS))),
        "k": groups["k"].agg(lambda ks: _listed(ks, k_order)),
    }).reset_index()


def _listed(values, key):
    return ", ".join(sorted(set(map(str, values)), key=key))


def render_command(model, protocol, selection):
    """The `peltbench-tables` options that render this model and protocol instead."""
    return f"`peltbench-tables {render_options(model, protocol, selection.default_model)}`"


def other_settings_markdown(runs, selection, heading="## Runs not pooled here: another model or protocol"):
    """Below Tables 1 and 3: the runs not pooled there because their model or protocol differs, with their settings."""
    groups = other_settings_groups(runs)
    if groups.empty:
        return ""
    table = pd.DataFrame({
        "model": [model_label(model, architecture) for model, architecture in zip(groups["model"], groups["architecture"])],
        "settings": groups["protocol"].map(lambda label: _settings_text(label)),
        "runs (failed)": [f"{runs} ({failed})" for runs, failed in zip(groups["runs"], groups["failed"])],
        "methods": groups["methods"].map(lambda names: ", ".join(map(method_label, names.split(", ")))),
        "tasks": groups["tasks"], "K": groups["k"],
        "render with": [render_command(model, protocol, selection) for model, protocol in zip(groups["model"], groups["protocol"])],
    })
    return "\n".join(["", *([heading, ""] if heading else []),
                      f"{int(groups['runs'].sum())} runs are left out because their model or protocol differs from the "
                      "one rendered; each row is one model and protocol.", "",
                      frame_markdown(table), ""])


def _settings_text(label):
    pairs = parse_protocol(label)
    return ", ".join(f"{key}={value}" for key, value in pairs.items())


def other_runs_markdown(ledger, selection):
    """other_runs.md: every record that is in no table, grouped by why."""
    parts = ["# Records not in the tables", "", f"Rendered: {selection.caption()}", "", ledger.summary() + ".", ""]
    parts += _section("Another model or protocol", other_settings_markdown(ledger.other_settings, selection, heading=None))
    parts += _section("Non-default method settings that no figure plots", _settings_list(ledger.not_plotted))
    parts += _section("Unknown method or task (not made a row or column)", _unknown_list(ledger.unknown))
    parts += _section("Seeds recorded more than once under one model, protocol and method setting",
                      _duplicate_list(ledger.duplicates))
    for kind, words in SKIPPED.items():
        left_out = [(path, reason) for path, which, reason in ledger.unreadable if which == kind]
        if left_out or kind == "unreadable":
            parts += _section(f"{words[1][0].upper()}{words[1][1:]} (skipped)",
                              "\n".join(f"- `{path}`: {reason}" for path, reason in left_out))
    return "\n".join(parts) + "\n"


def _section(title, body):
    return [f"## {title}", "", body.strip() or "None.", ""]


def _settings_list(runs):
    if runs.empty:
        return ""
    spelt = {}  # rows with equal settings share one dict and one list (records.read_records): each spelt once
    changed = []
    for settings, keys in zip(runs["settings"], runs["changed"]):
        shared = (id(settings), id(keys))
        if shared not in spelt:
            spelt[shared] = ", ".join(f"{key}={canonical(settings.get(key))}" for key in keys)
        changed.append(spelt[shared])
    counts = runs.assign(changed_text=changed).groupby(["method", "changed_text"]).size()
    return "\n".join(f"- {method_label(method)} with {text}: {count} run(s)" for (method, text), count in counts.items())


def _unknown_list(runs):
    if runs.empty:
        return ""
    counts = runs.groupby(["method", "task"]).agg(runs=("path", "size"), example=("path", "first"))
    return "\n".join(f"- method `{method}`, task `{task}`: {row.runs} run(s), e.g. `{row.example}`"
                     for (method, task), row in counts.iterrows())


def _duplicate_list(duplicates):
    if duplicates.empty:
        return ""
    lines = []
    for (method, task, k, seed, verdict), group in duplicates.groupby(["method", "task", "k", "seed", "duplicate"], sort=False):
        counted = "counted once" if verdict == "same result" else "not counted: which one is right is not for the tables to guess"
        scores = ", ".join(f"`{path}` ({status}, {main})" for path, status, main in zip(group["path"], group["status"], group["main"]))
        lines.append(f"- {method_label(method)}, {task}, K = {k}, seed {seed}: {len(group)} records with {verdict}, {counted}: {scores}")
    return "\n".join(lines)

