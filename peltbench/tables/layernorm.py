"""The LN-tuning paper's Figure 3 on GLUE: how far LN-tuning moved each layer's LayerNorm gain and bias.

As in that paper (§4, following BitFit), the change of a term t (a gain g or a bias b) is
(1 / dim t) · ‖t_o − t_f‖₁, the mean absolute difference between the pretrained values t_o and the
fine-tuned values t_f; rows are Gain MHA, Gain FFN, Bias MHA, Bias FFN (the LayerNorm after attention /
after the feed-forward block), columns the layers, one panel per task. The embeddings' LayerNorm, which
LN-tuning trains too but the paper's figure does not show, is in the CSV as layer 0.

t_f comes from the `weights.safetensors` a run saved beside its result.json (`save.weights=true`): keys are
the `*ForSequenceClassification` state_dict names (`bert.encoder.layer.3.output.LayerNorm.weight`, ...);
t_o from the record's `config.model.name`, loaded offline. Where each layer's LayerNorms are is the architecture
map's (peltbench/architectures.py): on a pre-norm encoder (ModernBERT) MHA and FFN are the LayerNorms before
those blocks, and a bias the checkpoint lacks is a pretrained bias of zero.
"""
import re

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..architectures import ARCHITECTURES
from .names import TASKS, k_label, order_of, task_label

TERMS = {"weight": "Gain", "bias": "Bias"}
ROWS = ("Gain MHA", "Gain FFN", "Bias MHA", "Bias FFN")  # the paper's y-axis
PREFIXES = {"bert": "bert", "roberta": "roberta", "electra": "electra", "deberta-v2": "deberta", "modernbert": "model"}
SWEEP = "peltbench -m +experiment=table1 method=ln save.weights=true"  # LN runs that keep their trained LayerNorms


class Unavailable(Exception):
    """Why a run or a pretrained model cannot be used for the figure (one line)."""


def saved_ln_runs(runs):
    """LN-tuning runs (default settings, finished) that saved their weights."""
    return runs[(runs["method"] == "ln") & (runs["status"] == "ok") & runs["weights"].notna()]


def layernorm_changes(runs, say=print):
    """One row per (run, term, module, layer): task, k, seed, term, module, layer, change.

    Runs whose weights or pretrained model cannot be read are skipped with one line each through `say`.
    """
    pretrained, rows = {}, []
    for run in runs.itertuples():
        model_name = (run.config.get("model") or {}).get("name") or run.model
        if model_name not in pretrained:
            try:
                pretrained[model_name] = pretrained_layernorms(model_name)
            except Unavailable as error:
                pretrained[model_name] = None
                say(f"LN figure: skipped for {model_name}: {error}")
        if pretrained[model_name] is None:
            continue
        try:
            rows += [{"task": run.task, "k": run.k, "seed": run.seed, **change}
                     for change in _changes(saved_layernorms(run.weights), pretrained[model_name])]
        except Unavailable as error:
            say(f"LN figure: {run.path}: skipped: {error}")
    return pd.DataFrame(rows, columns=["task", "k", "seed", "term", "module", "layer", "change"])


def pretrained_layernorms(model_name):
    """{name in the encoder: numpy array} of every LayerNorm gain and bias of the pretrained model, loaded offline."""
    from transformers import AutoModel

    try:
        model = AutoModel.from_pretrained(model_name, local_files_only=True)
    except Exception as error:  # transformers raises OSError, ValueError, ... for a model it cannot find offline
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise Unavailable(f"the pretrained model cannot be loaded offline ({message})") from None
    keys = _keys(model.config.model_type)
    if keys is None:
        raise Unavailable(f"its architecture ({model.config.model_type}) is not one peltbench supports")
    found = {}
    for name, module in model.named_modules():
        for term in ("weight", "bias"):
            key = f"{name}.{term}"
            if _match(keys, key) is not None and getattr(module, "weight", None) is not None:
                tensor = getattr(module, term)
                tensor = module.weight.new_zeros(module.weight.shape) if tensor is None else tensor  # no bias: zero
                found[key] = tensor.detach().float().numpy()
    return found


def saved_layernorms(path):
    """The LayerNorm tensors of a run's weights.safetensors (other keys, e.g. a method's new modules, ignored), under
    their names in the encoder (the model's prefix, `bert.` ..., removed)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(path)
    except (SafetensorError, OSError, ValueError) as error:
        raise Unavailable(f"{path} is not a readable safetensors file ({str(error).splitlines()[0]})") from None
    found = {}
    for model_type, prefix in PREFIXES.items():
        keys = _keys(model_type)
        for name, tensor in tensors.items():
            plain = name.removeprefix(f"{prefix}.")
            if name.startswith(f"{prefix}.") and _match(keys, plain) is not None:
                found[plain] = tensor.float().numpy()
        if found:
            return found
    raise Unavailable(f"{path} holds no LayerNorm weights")


def _keys(model_type):
    """(layer pattern, embeddings pattern) of an architecture's LayerNorm names in its encoder, or None."""
    arch = ARCHITECTURES.get(model_type)
    if arch is None:
        return None
    blocks = "|".join(re.escape(norm) for norm in arch.norms)
    layer = re.compile(rf"^{re.escape(arch.layers)}\.(\d+)\.({blocks})\.(weight|bias)$")
    return arch, layer, re.compile(rf"^{re.escape(arch.embeddings_norm)}\.(weight|bias)$")


def _match(keys, name):
    """(term, module, layer) of a LayerNorm name, or None for another tensor."""
    arch, layer, embeddings = keys
    found = layer.match(name)
    if found:
        return found[3], ("MHA", "FFN")[arch.norms.index(found[2])], int(found[1]) + 1
    found = embeddings.match(name)
    return (found[1], "embeddings", 0) if found else None


def _changes(saved, pretrained):
    """The mean absolute change of each saved LayerNorm term against its pretrained value."""
    keys = next((_keys(t) for t in PREFIXES if all(_match(_keys(t), name) for name in saved)), None)
    for name, values in saved.items():
        if keys is None or name not in pretrained or pretrained[name].shape != values.shape:
            raise Unavailable(f"{name} does not match the pretrained model's")
        term, module, layer = _match(keys, name)
        yield {"term": TERMS[term], "module": module, "layer": layer,
               "change": float(np.abs(values - pretrained[name]).mean())}


def mean_changes(changes):
    """Mean over seeds per (task, K, term, module, layer), with the number of seeds `n`."""
    grouped = changes.groupby(["task", "k", "term", "module", "layer"], sort=False)["change"]
    return grouped.agg(change="mean", n="count").reset_index()


def layernorm_figure(means, k):
    """Heat maps, one per task: rows Gain/Bias × MHA/FFN, columns layers 1..L, one colour scale for all tasks."""
    means = means[(means["k"] == k) & (means["layer"] > 0)]
    tasks = sorted(means["task"].unique(), key=lambda task: order_of(task, TASKS))
    if not tasks:
        return None
    columns = min(4, len(tasks))
    rows = -(-len(tasks) // columns)
    figure = Figure(figsize=(max(3.4 * columns, 6.5), 2.1 * rows + 0.8), layout="constrained")
    panels = figure.subplots(rows, columns, squeeze=False).ravel()
    top = means["change"].max()
    for axes, task in zip(panels, tasks):
        grid, seeds = _grid(means[means["task"] == task])
        image = axes.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=top)
        axes.set_yticks(range(len(ROWS)), ROWS, fontsize="small")
        axes.set_xticks(range(grid.shape[1]), range(1, grid.shape[1] + 1), fontsize="small")
        axes.set_xlabel("layer")
        axes.set_title(f"{task_label(task)} (n = {seeds})")
    for axes in panels[len(tasks):]:
        axes.set_visible(False)
    figure.colorbar(image, ax=panels[: len(tasks)].tolist(), label="mean |pretrained − tuned|")
    figure.suptitle(f"LN-tuning: change of LayerNorm gain and bias per layer\n({k_label(k)}, mean over n data seeds)")
    return figure


def _grid(task_means):
    """The paper's layout for one task: a (4, layers) array, NaN where a term was not saved; and the seeds."""
    layers = int(task_means["layer"].max())
    grid = np.full((len(ROWS), layers), np.nan)
    for row in task_means.itertuples():
        grid[ROWS.index(f"{row.term} {row.module}"), row.layer - 1] = row.change
    return grid, int(task_means["n"].max())
