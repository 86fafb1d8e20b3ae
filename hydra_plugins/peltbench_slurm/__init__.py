"""Hydra launcher plugin for peltbench sweeps on SLURM (see peltbench README)."""
