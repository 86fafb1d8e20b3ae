"""Does a change alter results? A fixed sweep on a tiny BERT (every method alone, every fusing method in one fused
group, two prompt runs fused), before and after, must write equal records (timings, dates, versions, hosts and paths
left out; config hashes, histories and scores compared exactly):

    python scripts/fixed_sweep.py run /tmp/fixedsweep && mv /tmp/fixedsweep /tmp/before     # on the old code
    python scripts/fixed_sweep.py run /tmp/fixedsweep && mv /tmp/fixedsweep /tmp/after      # on the new code
    python scripts/fixed_sweep.py compare /tmp/before /tmp/after                            # "equal", or what differs

Run both at the same path (the model's path is part of a run's identity), on the same machine.
"""
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the tiny checkpoints and GLUE files the tests build

VOLATILE = {"started_at", "finished_at", "versions", "machine", "train_seconds", "eval_seconds", "train_seconds_share",
            "eval_seconds_share", "peak_memory", "epoch_seconds", "seconds", "path", "data_dir", "data_source",
            "model", "config", "traceback", "identity"}

def strip(value):
    if isinstance(value, dict):
        return {k: strip(v) for k, v in value.items() if k not in VOLATILE and not k.endswith("_seconds")}
    if isinstance(value, list):
        return [strip(v) for v in value]
    return value

def run(out):
    import conftest as c
    from peltbench.runner import run_group
    out = Path(out)
    ck = c.save_tiny_encoder("bert", out / "ck")
    glue = c.write_glue(out / "glue")
    methods = sorted(p.stem for p in (REPO / "conf" / "method").glob("*.yaml"))
    def cfg(m, where, *extra):
        return c.compose_config(f"method={m}", "task=rte", *c.tiny_run_overrides(ck, glue, out / where), "device=cpu",
                                *c.tiny_method_overrides(m), *extra)
    for m in methods:
        run_group([cfg(m, "alone")])
    run_group([cfg(m, "fused", "fuse=true") for m in methods if m not in ("ft", "prompt")])
    run_group([cfg("prompt", "prompts", "fuse=true", f"seed={s}") for s in (111, 222)])

def load(root):
    return {str(p.relative_to(root)): strip(json.load(open(p))) for p in sorted(Path(root).rglob("result.json"))}

if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(sys.argv[2])
    else:
        a, b = load(sys.argv[2]), load(sys.argv[3])
        print(len(a), "records vs", len(b))
        bad = [k for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]
        for k in bad:
            print("DIFFERENT:", k)
            ka, kb = a.get(k) or {}, b.get(k) or {}
            for f in sorted(ka.keys() | kb.keys()):
                if ka.get(f) != kb.get(f):
                    print("   ", f, str(ka.get(f))[:150], "|", str(kb.get(f))[:150])
        print("equal" if not bad else f"{len(bad)} differ")
