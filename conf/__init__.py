"""peltbench's Hydra configs (installed as the package `peltbench.conf`).

Importing it registers peltbench's launchers, which config.yaml's defaults list names.
"""

from peltbench.launchers import register_launchers

register_launchers()
