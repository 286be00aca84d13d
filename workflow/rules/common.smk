# Config helpers and input functions shared by the rules.

import json
import os
import re
import shlex
from pathlib import Path

from specsweep.config import (
    analysis_spec,
    cell_priority,
    cell_spec,
    dumps,
    fixed_arms,
    instances,
    interleaved_variants,
    level_priority,
    max_instances,
    replicated_variants,
    segment_need_priority,
    headline_units,
    sweep_units,
    unit_datasets,
    unit_variant,
    segment_priority,
    level_name,
    levels,
    load_mode,
    parse_level,
    policy_arms,
    policy_level_specs,
    preflight_spec,
    requests_for,
    slurm_resources,
    startup_timeout_s,
    tracking_spec,
)

EXP = config["experiment"]
RES = Path(config["results_dir"]) / EXP
STATE_DIR = RES / ".servers"
LOGS = RES / "logs"
VARIANTS = list(config["variants"])  # the stacks: preflight, environment and model per variant
# what is measured and answered for: each variant, or each of its content classes and their mix (<variant>@<class>);
# the measuring and analysis rules' {variant} wildcard is a unit
UNITS = sweep_units(config)
HEADLINE_UNITS = headline_units(config)  # one per variant where it has one answer (its mix, or itself): compared
CLASSED_VARIANTS = [v for v in VARIANTS if config["workload"]["classes"]]  # their classes' answers side by side
ARMS = list(config["arms"])
FIXED_ARMS = fixed_arms(config)  # the baseline and every speculative (sub-)arm
PAIRED_VARIANTS = interleaved_variants(config)  # their fixed arms' levels are measured in interleaved blocks
REPLICATED_VARIANTS = replicated_variants(config)  # their fixed arms run on several instances (pairing.instances)
POLICY_ARMS = policy_arms(config)  # policy arm -> its family: serves the derived schedule (workflow/rules/policy.smk)
# A measurement uses every core of its host (the servers' process trees on all CPUs but the client's, the client on
# that one): its rules ask for every core Snakemake may use, so under `snakemake --cores N` no other job (another
# variant's level, an analysis or MLflow job, a build) runs beside it; the machine-busy gate would throw out a cell
# measured so (a --cores 2 run here: 3 cells at 31%), and two variants' levels taking turns would restart their
# servers at every turn. Builds, analysis and MLflow jobs run beside one another. The SLURM profile sets these rules'
# threads back to 1 (set-threads: a cluster job is a host of its own, its CPUs the variant's slurm.cpus_per_task).
MEASURE_THREADS = workflow.resource_settings.cores or 1  # (`workflow.cores` refuses a run without --cores: --report)
LOAD_MODE = load_mode(config)  # closed (c<C> cells), open (r<rate>) or trace (t<time scale>)
LEVELS = levels(config)
BASELINE_ARM = config["analysis"]["baseline_arm"]
ADAPTIVE = config["adaptive"]
TRACKING = config["mlflow"]["enabled"]
TRACKING_JSON = dumps(tracking_spec(config))


def known(kind, name, names):
    """Refuse an unknown variant or arm in a target, listing the known ones."""
    if name not in names:
        raise ValueError(
            f"unknown {kind} '{name}' in the requested target; known {kind}s: {', '.join(names)}"
            f" (defined in the config under '{kind}s')"
        )
    return name


def cell_path(variant, arm, c, name):
    return RES / variant / arm / level_name(LOAD_MODE, c) / name


def levels_after(variant, round_):
    """The variant's levels once `round_` refinement rounds are done: the configured grid at round 0 (and
    always, without adaptive levels), else what the rounds' checkpoints wrote (workflow/rules/adaptive.smk).
    A round that adds nothing ends the refinement: no later round is asked for."""
    levels = LEVELS
    for r in range(1, round_ + 1 if ADAPTIVE["enabled"] else 1):
        plan = json.loads(Path(checkpoints.refine.get(variant=variant, round=r).output[0]).read_text())
        levels = plan["levels"]
        if plan["stop"]:
            break
    return levels


def final_levels(variant):
    return levels_after(variant, ADAPTIVE["max_rounds"] if ADAPTIVE["enabled"] else 0)


def schedules(variant):
    """The variant's schedule.json (the `schedule` checkpoint): what each policy arm serves."""
    return json.loads(Path(checkpoints.schedule.get(variant=variant).output[0]).read_text())


def served_policy_arms(variant):
    """Policy arms whose family got a schedule that switches K (an inconclusive family has none, and no policy
    arm; one K over the whole range is a fixed arm's static setting, `served_by`: its cells are the measurement)."""
    if not POLICY_ARMS:
        return []
    families = schedules(variant)["families"]
    return [
        a
        for a, fam in POLICY_ARMS.items()
        if (families.get(fam) or {}).get("schedule") and not (families.get(fam) or {}).get("served_by")
    ]


def fixed_cells(wildcards, name="summary.json", levels=None):
    """The fixed arms' cells: what refinement rounds and the schedule judge."""
    known("variant", wildcards.variant, UNITS)
    levels = final_levels(wildcards.variant) if levels is None else levels
    return [cell_path(wildcards.variant, a, c, name) for a in FIXED_ARMS for c in levels]


def variant_cells(wildcards, name="summary.json"):
    """Every cell of the variant: the fixed arms' and the policy arms' (after the schedule is derived)."""
    levels = final_levels(wildcards.variant)
    policy = [cell_path(wildcards.variant, a, c, name) for a in served_policy_arms(wildcards.variant) for c in levels]
    return fixed_cells(wildcards, name) + policy


def round_cells(wildcards, name="summary.json"):
    """The cells a refinement round judges: every level measured before it."""
    return fixed_cells(wildcards, name, levels_after(wildcards.variant, int(wildcards.round) - 1))


def schedule_input(wildcards):
    return [RES / wildcards.variant / "schedule.json"] if POLICY_ARMS else []


def policy_entry(variant, arm):
    """The schedule a policy arm serves (its family's entry of schedule.json); refuses one without."""
    entry = schedules(variant)["families"].get(POLICY_ARMS[arm]) or {}
    if not entry.get("schedule"):
        raise ValueError(
            f"{variant}/{arm}: no schedule was derived ({entry.get('reason', 'unknown')}); "
            f"see {RES / variant / 'schedule.json'}"
        )
    return entry


def level_inputs(variant, level):
    """What every cell of a level needs before it runs: the variant's environment (and model, trace, dataset)."""
    known("variant", variant, UNITS)
    mode, c = parse_level(level)
    if mode != LOAD_MODE:
        raise ValueError(
            f"level {level} is a {mode} level, and load.mode is {LOAD_MODE}; "
            f"ask for {level_name(LOAD_MODE, LEVELS[0])}-style cells (levels {LEVELS})"
        )
    if ADAPTIVE["enabled"] and not LEVELS[0] <= c <= LEVELS[-1]:
        raise ValueError(
            f"concurrency {c} is outside the configured range {LEVELS[0]}..{LEVELS[-1]}, where adaptive levels "
            "are added; widen 'concurrency'"
        )
    if not ADAPTIVE["enabled"] and c not in LEVELS:
        raise ValueError(
            f"level {c} is not among the configured levels {LEVELS}; add it to "
            + (
                "'concurrency' (or enable adaptive levels)"
                if mode == "closed"
                else f"the load's levels (load.mode {mode})"
            )
        )
    stack = unit_variant(variant)  # a unit's environment and model are its variant's
    inputs = {"env": expand(rules.env.output[0], variant=stack)[0]}
    if LOAD_MODE == "trace":  # editing the trace reruns its cells
        inputs["trace"] = config["load"]["trace"]["path"]
    if config["variants"][stack].get("model_builder"):
        inputs["model"] = expand(rules.model.output[0], variant=stack)[0]
    datasets = unit_datasets(config, variant)
    if datasets:  # an edited workload file re-measures the cells that send it
        inputs["dataset"] = datasets
    return inputs


def cell_inputs(wildcards):
    inputs = level_inputs(wildcards.variant, wildcards.level)
    known("arm", wildcards.arm, ARMS)
    if wildcards.arm in POLICY_ARMS:  # waits for the schedule; its content is a param (cell_spec_json)
        policy_entry(wildcards.variant, wildcards.arm)
    return inputs


def paired_inputs(wildcards):
    return level_inputs(wildcards.variant, wildcards.level)


REFERENCE_FIRST = [BASELINE_ARM] + [a for a in FIXED_ARMS if a != BASELINE_ARM]


def paired_specs_json(wildcards):
    """Every fixed arm's cell spec at the level, the baseline (the drift reference) first."""
    arms = REFERENCE_FIRST
    c = parse_level(wildcards.level)[1]
    return dumps({a: cell_spec(config, wildcards.variant, a, c) for a in arms})


def paired_policy_specs_json(wildcards):
    """A policy arm's cell spec at the level, after the best fixed arm there (measured with it in interleaved
    blocks, as the proof's pair); the policy arm alone where no fixed cell of the level was valid."""
    served = policy_entry(wildcards.variant, wildcards.arm)
    c = parse_level(wildcards.level)[1]
    return dumps(policy_level_specs(config, wildcards.variant, wildcards.arm, c, served))


def instance_spec_json(wildcards):
    c = parse_level(wildcards.level)[1]
    return dumps(cell_spec(config, wildcards.variant, wildcards.arm, c, instance=int(wildcards.instance)))


def instance_priority_of(wildcards):
    return segment_priority(config, wildcards.variant, wildcards.arm, int(wildcards.instance), wildcards.level)


def segment_answer(variant, level, pairs):
    """The segment rule's answer file after `pairs` instance pairs at a level (checkpoint segment_need)."""
    return RES / variant / "segments" / level / f"after-i{pairs}.json"


def instances_at(variant, level):
    """Server instances per fixed arm the level is measured on: pairing.instances, then one more pair each time
    its checkpoint says the answer is not yet known, up to precision.max_instances (none asked where they are
    equal)."""
    n, most = instances(config, variant), max_instances(config, variant)
    if most == n:
        return n
    while json.loads(Path(checkpoints.segment_need.get(variant=variant, level=level, pairs=n).output[0]).read_text())[
        "more"
    ]:
        n += 1
    return n


def segment_decisions(wildcards):
    """The segment rule's answers the level's merged cells record (none without precision.max_instances)."""
    n0, most = instances(config, wildcards.variant), max_instances(config, wildcards.variant)
    if most == n0:
        return []
    last = instances_at(wildcards.variant, wildcards.level)
    return [segment_answer(wildcards.variant, wildcards.level, k) for k in range(n0, last + 1)]


def segment_cells(wildcards, name="summary.json", pairs=None):
    """Every fixed arm's instance cells at the level: what its merged cells (or, `pairs` given, the segment
    rule's answer after that many pairs) are made of."""
    n = int(pairs) if pairs is not None else instances_at(wildcards.variant, wildcards.level)
    return [
        RES / wildcards.variant / a / wildcards.level / "instances" / f"i{k}" / name
        for a in FIXED_ARMS
        for k in range(1, n + 1)
    ]


def segment_rule_args(wildcards):
    """The segment rule's target and budget on the command line (a param: changing them re-asks it)."""
    p = config["precision"]
    margin = "" if p["decide_margin"] is None else f" --decide-margin {p['decide_margin']}"
    return f"--target {p['target']} --max-instances {max_instances(config, wildcards.variant)}{margin}"


def paired_priority_of(wildcards):
    return level_priority(config, wildcards.variant, wildcards.level)


def regex_of(names):
    """A wildcard constraint matching exactly these names (nothing when there are none)."""
    return "|".join(re.escape(n) for n in names) if names else "(?!)"


def preflight_spec_json(wildcards):
    return dumps(preflight_spec(config, known("variant", wildcards.variant, VARIANTS)))


def variant_analysis_json(wildcards):
    return dumps(analysis_spec(config, [known("variant", wildcards.variant, UNITS)]))


def schedule_decision_json(wildcards):
    """What a schedule depends on besides the cells' bytes (a param: changing it re-derives the schedule)."""
    known("variant", wildcards.variant, UNITS)
    keys = ("policy_rule", "primary_metric", "baseline_arm")
    analysis = {k: config["analysis"][k] for k in keys}
    return dumps({"policy": config["policy"], "arms": config["arms"], "analysis": analysis})


def refine_json(wildcards):
    """What a refinement round's decision depends on (a param: changing it re-decides the round)."""
    known("variant", wildcards.variant, UNITS)
    return dumps({"adaptive": ADAPTIVE, "concurrency": LEVELS, "arms": config["arms"]})


def recipe_input(wildcards):
    """The variant's environment recipe as an input of its env job: editing the file reruns the stack's jobs."""
    v = config["variants"][known("variant", wildcards.variant, VARIANTS)]
    if v.get("python") or not v.get("recipe"):
        return []
    recipe = Path(v["recipe"])
    if not recipe.is_file():
        raise ValueError(
            f"variant '{wildcards.variant}': environment recipe {recipe} does not exist; "
            "fix variants.<name>.recipe (a pip requirements file under envs/)"
        )
    from specsweep.stack.envbuild import parse_recipe

    # its patches and local wheels too: a changed one rebuilds the environment (a local checkout, a folder,
    # counts through recipe_digest)
    parsed = parse_recipe(recipe)
    extra = [str(p["path"]) for p in parsed["patches"]] + [str(p) for p in parsed["local"] if p.is_file()]
    return [str(recipe)] + extra


def recipe_digest(wildcards):
    """The environment's hash (recipe, patches, local wheels and checkouts by content) as a param of the env job."""
    from specsweep.stack.envbuild import recipe_hash

    recipe = recipe_input(wildcards)
    return recipe_hash(Path(recipe[0]))[:12] if recipe else ""


def builder_input(wildcards):
    """The model builder's source as an input of the model job: a changed builder rebuilds the model."""
    from specsweep.stack.modelbuild import builder_source

    v = config["variants"][known("variant", wildcards.variant, VARIANTS)]
    return [str(builder_source(v["model_builder"]))]


def cell_spec_json(wildcards):
    served = policy_entry(wildcards.variant, wildcards.arm) if wildcards.arm in POLICY_ARMS else None
    return dumps(cell_spec(config, wildcards.variant, wildcards.arm, parse_level(wildcards.level)[1], served))


def slurm(name):
    """One of the variant's cluster-job resources (config variants.<name>.slurm); local runs ignore them."""
    return lambda w: slurm_resources(config, known("variant", w.variant, VARIANTS + UNITS))[name]


def cell_priority_of(wildcards):
    return cell_priority(config, wildcards.variant, wildcards.arm, wildcards.level)


def crossover_targets():
    targets = [RES / v / "crossover.json" for v in UNITS]
    if TRACKING:
        targets += [RES / v / "mlflow_crossover.json" for v in UNITS]
    targets += [RES / v / "contents.json" for v in CLASSED_VARIANTS]
    return targets


def comparison_targets():
    return [RES / "comparison" / "comparison.json"] if len(HEADLINE_UNITS) > 1 else []


def fingerprint_args(wildcards):
    """Command-line arguments of `specsweep fingerprint` for one variant (recipe or interpreter, GPUs, env)."""
    v = config["variants"][known("variant", wildcards.variant, VARIANTS)]
    args = ["--engine", v["engine"]]
    if v.get("python"):
        args += ["--python", v["python"]]
    elif v.get("recipe"):
        args += ["--recipe", str(recipe_input(wildcards)[0])]
    if v.get("gpus"):
        args += ["--gpus", str(v["gpus"])]
    for key, value in v.get("env_vars", {}).items():
        args += ["--env", f"{key}={value}"]
    return " ".join(shlex.quote(a) for a in args)


def levels_to_measure():
    """Level shares this run is to measure, as far as known when it starts (specsweep.measure.budget): every
    interleaved unit's grid levels not yet measured, the levels its refinement rounds may add (one a round), and
    its policy arms' levels (at every level, where its family gets a schedule), each of these half a share. An
    estimate where levels are not known yet: a run that measures fewer leaves their seconds to the last."""
    from specsweep.measure.budget import POLICY_LEVEL_SHARE

    added = ADAPTIVE["max_rounds"] if ADAPTIVE["enabled"] else 0
    n = 0.0
    for unit in PAIRED_VARIANTS:
        grid = [c for c in LEVELS if not cell_path(unit, BASELINE_ARM, c, "summary.json").exists()]
        policy = [c for a in POLICY_ARMS for c in LEVELS if not cell_path(unit, a, c, "summary.json").exists()]
        more = added * (1 + POLICY_LEVEL_SHARE * len(POLICY_ARMS)) if grid else 0
        n += len(grid) + POLICY_LEVEL_SHARE * len(policy) + more
    return n


def start_run_budget():
    """The run's clock (budget.run_s), for the level jobs through the environment (specsweep.measure.budget)."""
    import time

    from specsweep.measure.budget import BUDGET_ENV, RunBudget

    run_s = config["budget"]["run_s"]
    if run_s is None:
        os.environ.pop(BUDGET_ENV, None)
        return
    started = time.time()
    ledger = RES / "budget" / f"run-{int(started)}.jsonl"
    budget = RunBudget(float(run_s), started, levels_to_measure(), str(ledger.resolve()))
    os.environ[BUDGET_ENV] = budget.to_env()


def print_run_budget():
    """How the run spent its budget (after the final table)."""
    from specsweep.measure.budget import RunBudget, spent_text

    budget = RunBudget.from_env()
    if budget is not None:
        print(spent_text(budget), flush=True)
