"""The paper's names and orders: tasks, methods, K, and which methods UniPELT is made of (§4.1, Tables 1-4)."""

from collections import Counter

# Table 1's column order (not alphabetical, not GLUE's): SST-2, MRPC, CoLA, RTE, QNLI, STS-B, MNLI, QQP.
TASKS = ("sst2", "mrpc", "cola", "rte", "qnli", "stsb", "mnli", "qqp")
TASK_LABELS = {
    "sst2": "SST-2", "mrpc": "MRPC", "cola": "CoLA", "rte": "RTE",
    "qnli": "QNLI", "stsb": "STS-B", "mnli": "MNLI", "qqp": "QQP", "avg": "Avg.",
}
# Each task's main metric (§4.1, Table 1's caption), for axis labels.
TASK_METRICS = {
    "sst2": "accuracy", "mrpc": "F1", "cola": "Matthews corr.", "rte": "accuracy",
    "qnli": "accuracy", "stsb": "Spearman corr.", "mnli": "accuracy (matched)", "qqp": "F1",
}
AVG = "avg"  # the Avg. column travels as one more "task" in the long score frames

# Row order of Tables 1 and 3; the second paper's methods (LN-tuning, Prefix+LN, MAM) follow when present.
PAPERS_METHODS = (
    "ft", "bitfit", "adapter", "prefix", "prefix_l50", "lora",
    "unipelt_ap", "unipelt_ap_nogate", "unipelt_apl", "unipelt_apl_nogate",
    "ln", "prefix_ln", "mam", "mam_he",
)
# The methods not named as their one component, with their names in the tables; a method named as its component
# (lora, dora, ...) takes the name its component declares (`label`: peltbench.component).
METHOD_LABELS = {
    "ft": "Fine-tuning", "prefix_l50": "Prefix-tuning (L = 50)",
    "unipelt_ap": "UniPELT (AP)", "unipelt_ap_nogate": "UniPELT (AP)-NoGate",
    "unipelt_apl": "UniPELT (APL)", "unipelt_apl_nogate": "UniPELT (APL)-NoGate",
    "prefix_ln": "Prefix+LN",
    # Two MAMs: the LN-tuning paper's BERT-base setting and He et al.'s own (prefix L = 30, FFN adapter 512).
    "mam": "MAM (LN-paper, L=8, r=8)", "mam_he": "MAM (He et al.)",
    "lora_fa": "LoRA-FA", "ptuning_v2": "P-tuning v2",  # issue 19
}
# Their papers (arXiv), as a component declares its own (`arxiv`): the later methods follow the papers' tables' in the
# order their papers first appeared.
METHOD_ARXIV = {"ptuning_v2": "2110.07602", "lora_fa": "2308.03303"}


def _component_names() -> tuple[tuple[str, ...], dict[str, str], dict[str, str]]:
    """(the later methods in their papers' order, every method's name in the tables, every later method's paper) from
    METHOD_LABELS, METHOD_ARXIV and the built-in components' declarations."""
    from ..component import builtin_names, declaration

    labels, papers = dict(METHOD_LABELS), dict(METHOD_ARXIV)
    for name in builtin_names():
        component = declaration(name)
        if component.label:
            labels.setdefault(name, component.label)
        if component.arxiv:
            papers.setdefault(name, component.arxiv)
    later = sorted((name for name in papers if name not in PAPERS_METHODS), key=lambda name: (papers[name], name))
    return tuple(later), labels, papers


_LATER, _LABELS, _PAPERS = _component_names()
# Row order of every table: the papers' methods, then the later methods (issue 19 on) in the order their papers first
# appeared (arXiv); others (a user's method) after them, alphabetically.
METHODS = (*PAPERS_METHODS, *_LATER)
METHOD_LABELS = _LABELS
# A user's methods named as the built-ins are (name_users_methods): {method: (label, arXiv id or None)}, as their
# records' components declare them; those of the records read last (tables.records.read_records).
USERS_METHODS: dict[str, tuple[str | None, str | None]] = {}


def name_users_methods(components: dict[str, tuple[str, ...]]) -> None:
    """Name a user's methods (`{method: its components}`, from its records) as the built-ins are named: a method named
    as one of its components (`loha`, of `mylab.loha`) takes the `label` and `arxiv` that component declares
    (peltbench.component.declaration: read, not run); its label only where no other method has it (a copy of lora.py
    declares LoRA's). A method whose module is not on this Python's path, or named otherwise, keeps its name."""
    from ..component import ComponentError, declaration, is_builtin

    found = {}
    for method, names in sorted(components.items()):
        own = [name for name in names if not is_builtin(name) and name.rpartition(".")[2] == method]
        if method in METHOD_LABELS or method in METHODS or len(own) != 1:
            continue
        try:
            component = declaration(own[0])
        except ComponentError:
            continue
        found[method] = component.label, component.arxiv
    taken = Counter([*METHOD_LABELS.values(), *(label for label, _ in found.values() if label)])
    USERS_METHODS.clear()
    USERS_METHODS.update({method: (label if taken[label] == 1 else None, paper)
                          for method, (label, paper) in found.items()})


def method_order(method):
    """Sort key of a method's row: the papers' methods in the papers' order, then the later methods, peltbench's and a
    user's that names its paper (name_users_methods), in the order their papers first appeared (arXiv id), then the
    others alphabetically."""
    if method in PAPERS_METHODS:
        return 0, PAPERS_METHODS.index(method), ""
    paper = _PAPERS.get(method) or USERS_METHODS.get(method, (None, None))[1]
    return (1, paper, str(method)) if paper else (2, "", str(method))


# The rows each paper table has. Other methods are set apart below them and take no bold / underline,
# so a method the paper did not run never displaces the paper's best (issue 8).
TABLE1_METHODS = ("ft", "bitfit", "adapter", "prefix", "prefix_l50", "lora", "unipelt_ap", "unipelt_apl")
TABLE3_METHODS = ("ft", "adapter", "prefix", "lora", "unipelt_ap", "unipelt_ap_nogate", "unipelt_apl")
# Table 4's row order.
EFFICIENCY_METHODS = ("ft", "bitfit", "prefix", "lora", "adapter", "unipelt_ap", "unipelt_apl")

# "The best single method" UniPELT is tested against (§4.3): the five methods of Table 1 that are not UniPELT.
SINGLE_METHODS = ("ft", "bitfit", "adapter", "prefix", "lora")
# Table 2: each gated UniPELT variant and the submodules whose per-task best is its upper bound.
UNIPELT_SUBMODULES = {
    "unipelt_ap": ("adapter", "prefix"),
    "unipelt_apl": ("adapter", "prefix", "lora"),
}


def order_of(name, ordered):
    """Sort key: the paper's position first, unknown names after them alphabetically."""
    return (ordered.index(name), "") if name in ordered else (len(ordered), str(name))


def k_order(k):
    """Sort key for K: 100 < 500 < 1000 < all (K is a string in the frames: "100", "all")."""
    return (1, 0) if k == "all" else (0, int(k))


def method_label(method):
    return METHOD_LABELS.get(method) or USERS_METHODS.get(method, (None,))[0] or method


def task_label(task):
    return TASK_LABELS.get(task, task)


def k_label(k):
    return "K = all" if k == "all" else f"K = {k}"
