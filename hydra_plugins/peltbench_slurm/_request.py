"""Whether a SLURM request can ever run: checked against the partition before submitting, and from squeue's
pending reason while waiting. Without these checks, a request larger than every node (the default 4 CPUs and
32 GB on a small node) stays pending with reason PartitionConfig, and the sweep waits silently forever.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

# Pending reasons (squeue %r) that no amount of waiting clears: the request itself breaks a limit of the partition,
# QOS or account. Others (Priority, Resources, JobArrayTaskLimit, ReqNodeNotAvail for a drained node, ...) pass.
NEVER_STARTS = re.compile(r"^(PartitionConfig|PartitionNodeLimit|PartitionTimeLimit|BadConstraints|InvalidAccount|"
                          r"InvalidQOS|DependencyNeverSatisfied|(QOS|Assoc)Max\w*PerJob\w*|QOSMin\w*)$")


def never_starts(reason: str) -> bool:
    return bool(NEVER_STARTS.match(reason.strip()))


@dataclass
class Node:
    name: str
    cpus: int
    memory_mb: int
    gpus: int
    partitions: List[str]

    def describe(self) -> str:
        return f"{self.name} has {_count(self.cpus, 'CPU')}, {self.memory_mb / 1024:.0f} GB, {_count(self.gpus, 'GPU')}"


def check_request(params: Dict[str, Any]) -> Optional[str]:
    """Why the launcher's request (hydra.launcher.*) can never run on its partition, or None.

    None also when SLURM cannot be asked (no scontrol): sbatch then says what it thinks.
    """
    partitions = _records(["scontrol", "show", "partition", "--oneliner"])
    nodes = _records(["scontrol", "show", "node", "--oneliner"])
    if not partitions or nodes is None:
        return None
    name = params.get("partition") or next((p["PartitionName"] for p in partitions if p.get("Default") == "YES"), None)
    partition = next((p for p in partitions if p.get("PartitionName") == name), None)
    if partition is None:
        known = ", ".join(p.get("PartitionName", "?") for p in partitions)
        return (f"hydra.launcher.partition={name}: no such partition (partitions: {known})" if name else
                f"no default SLURM partition: set hydra.launcher.partition (partitions: {known})")
    limit = _minutes(partition.get("MaxTime", "UNLIMITED"))
    timeout = params.get("timeout_min")
    if limit is not None and timeout and timeout > limit:
        return (f"hydra.launcher.timeout_min={timeout} exceeds partition {name}'s time limit of {limit} minutes "
                f"(MaxTime {partition['MaxTime']}): lower it, or choose another hydra.launcher.partition")
    members = [node for node in map(_node, nodes) if name in node.partitions]
    if not members:
        return None
    cpus = (params.get("cpus_per_task") or 1) * (params.get("tasks_per_node") or 1)
    memory_mb = int((params.get("mem_gb") or 0) * 1024)
    gpus = params.get("gpus_per_node") or 0
    if any(node.cpus >= cpus and node.memory_mb >= memory_mb and node.gpus >= gpus for node in members):
        return None
    largest = max(members, key=lambda node: (node.gpus >= gpus, node.cpus, node.memory_mb))
    fits = (f"hydra.launcher.gpus_per_node={min(gpus, largest.gpus)} "
            f"hydra.launcher.cpus_per_task={max(1, min(cpus, largest.cpus) // (params.get('tasks_per_node') or 1))} "
            f"hydra.launcher.mem_gb={min(memory_mb, largest.memory_mb) // 1024}")
    return (f"each array task asks for {_count(cpus, 'CPU')}, {memory_mb // 1024} GB and {_count(gpus, 'GPU')} "
            f"(hydra.launcher.cpus_per_task, mem_gb, gpus_per_node), more than any node of partition {name} has "
            f"({'; '.join(node.describe() for node in members[:3])}{'; ...' if len(members) > 3 else ''}): "
            f"it could never start. A request that fits: {fits}")


def _count(number: int, thing: str) -> str:
    return f"{number} {thing}{'' if number == 1 else 's'}"


def _records(command: List[str]) -> Optional[List[Dict[str, str]]]:
    """`scontrol show ... --oneliner` as one dict per line (KEY=VALUE words); None if scontrol cannot answer."""
    try:
        listing = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if listing.returncode != 0:
        return None
    return [dict(re.findall(r"(?:^|\s)(\w+)=(\S*)", line)) for line in listing.stdout.splitlines() if line.strip()]


def _node(fields: Dict[str, str]) -> Node:
    gpus = sum(int(count) for count in re.findall(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)", fields.get("Gres", "")))
    return Node(name=fields.get("NodeName", "?"), cpus=_int(fields.get("CPUEfctv") or fields.get("CPUTot")),
                memory_mb=_int(fields.get("RealMemory")), gpus=gpus,
                partitions=[p for p in fields.get("Partitions", "").split(",") if p])


def _int(value: Optional[str]) -> int:
    return int(value) if value and value.isdigit() else 0


def _minutes(limit: str) -> Optional[int]:
    """A SLURM time limit in whole minutes, rounded up; None for UNLIMITED. Formats: MM, MM:SS, HH:MM:SS and, with
    days, D-HH, D-HH:MM, D-HH:MM:SS (scontrol prints HH:MM:SS or D-HH:MM:SS)."""
    if not limit or limit.upper() in ("UNLIMITED", "INFINITE", "NONE"):
        return None
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:
        hours, minutes, seconds = (parts + [0, 0])[:3]
    else:
        hours, minutes, seconds = {1: [0, *parts, 0], 2: [0, *parts], 3: parts}[len(parts)]
    return (int(days or 0) * 24 + hours) * 60 + minutes + (1 if seconds else 0)
