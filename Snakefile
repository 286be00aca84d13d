"""specsweep: up to what load does speculative decoding pay off, on this stack?

snakemake --cores 1 crossover          # every variant's crossover (default config: simulated engine)
snakemake --cores 1 crossover --configfile config/examples/kimi-k25-8gpu.yaml
snakemake --cores 1 crossover --forcerun results/demo/sim/eagle3/c10/summary.json   # redo one cell
"""

import os
import sys
from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")

# The embedded default, unless --configfile names another experiment (which then replaces it, not merges).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


# Run from a checkout even where the package is not installed; jobs see the same package (specsweep.serving.jobenv).
_PKG_ROOT = str(Path(workflow.basedir) / "workflow")
sys.path.insert(0, _PKG_ROOT)

from specsweep import config as ssconfig
from specsweep.measure.heal import JUDGE_ENV, judge_env
from specsweep.serving.jobenv import prepare

prepare(_PKG_ROOT)

_validated = ssconfig.validate(config)
config.clear()
config.update(_validated)

# The cell jobs judge their own attempts by the experiment's gates (specsweep.measure.heal): given through the environment,
# not a rule param, so that a gate change re-judges stored cells without re-measuring them.
os.environ[JUDGE_ENV] = judge_env(config)


report: "workflow/report/workflow.rst"


# On a cluster (workflow/profiles/slurm) these run where Snakemake runs: they read the shared results folder
# and the tracking server, not a GPU.
localrules:
    all,
    crossover,
    refine,
    schedule,
    crossover_variant,
    compare,
    track_variant,
    merge_segments,
    segment_need,


include: "workflow/rules/common.smk"
include: "workflow/rules/env.smk"
include: "workflow/rules/cell.smk"
include: "workflow/rules/adaptive.smk"
include: "workflow/rules/policy.smk"
include: "workflow/rules/crossover.smk"
include: "workflow/rules/tracking.smk"


rule all:
    """Everything: crossovers, variant comparison, MLflow."""
    default_target: True
    input:
        crossover_targets(),
        comparison_targets(),


rule crossover:
    """Every variant's crossover, plots and policy, logged to MLflow."""
    input:
        crossover_targets(),


onstart:
    from specsweep.serving.servers import stop_on_sigterm

    stop_on_sigterm(STATE_DIR)
    start_run_budget()


onsuccess:
    from specsweep.final import print_final
    from specsweep.serving.servers import stop_all

    stop_all(STATE_DIR, reason="workflow finished")
    print_final(config, [str(f) for f in workflow.overwrite_configfiles or []])
    print_run_budget()


onerror:
    from specsweep.serving.servers import stop_all

    stop_all(STATE_DIR, reason="workflow failed")
