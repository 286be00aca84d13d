"""Experiment config: validation with clear messages, and the derived facts the Snakefile and scripts share."""

from __future__ import annotations

import copy
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from specsweep.redact import split_uri_credentials

UNIT_SEP = "@"  # `<variant>@<class>` (client/contents.py UNIT_SEP; here too, so that the config imports no client)

if TYPE_CHECKING:
    from specsweep.client.datasets import Dataset

PACKAGE_DIR = Path(__file__).resolve().parent
SCHEMA_PATH = PACKAGE_DIR.parent / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """A config problem, worded for the person who wrote the config."""


@dataclass(frozen=True)
class Cell:
    variant: str
    arm: str
    concurrency: int

    def key(self, experiment: str) -> str:
        return f"{experiment}/{self.variant}/{self.arm}/c{self.concurrency}"


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; pass an existing file with --configfile")
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys, got {type(data).__name__}")
    return data


@functools.cache
def _parsed_schema() -> dict[str, Any]:
    """The schema, parsed once per process (`defaults()` is called per cell, per judgement and per rule), by
    libyaml where PyYAML has it: 4x faster than the pure-Python loader, in every cell job's start-up."""
    return yaml.load(SCHEMA_PATH.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _schema() -> dict[str, Any]:
    """A copy of the schema the caller may change (the validator fills a config's defaults from it)."""
    return copy.deepcopy(_parsed_schema())


def defaults(*section: str) -> dict[str, Any]:
    """The schema's defaults of one section (e.g. 'gates', or 'workload', 'requests'): the one home of every
    default, so the `bench` command and the pipeline judge cells by the same numbers."""
    node = _parsed_schema()
    for name in section:
        node = node["properties"][name]
    return {k: copy.deepcopy(v["default"]) for k, v in node["properties"].items() if "default" in v}


def _check_budget(config: dict[str, Any]) -> None:
    """A run budget smaller than the servers' own starts (each variant's expected_start_s, for every server its
    levels hold up at once: the fixed arms' and a policy arm's, on every instance) cannot measure a round."""
    run_s = config["budget"]["run_s"]
    if run_s is None:
        return
    starts = 0.0
    for variant in config["variants"].values():
        if variant.get("expected_start_s"):
            servers = len(config["arms"]) * max(1, int(config["pairing"]["instances"]))
            starts += float(variant["expected_start_s"]) * servers
    if starts and run_s <= starts:
        raise ConfigError(
            f"config error at 'budget/run_s': {run_s:g} s is no more than the servers' starts alone ({starts:g} s: "
            "each variant's expected_start_s for every arm's server); set it above that (a round of every level "
            "besides: `specsweep plan` prints what one takes), or null (no run budget)"
        )


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _describe(error: Any) -> str:
    where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
    msg = "this key was removed" if error.validator == "not" else error.message  # `not: {}`: a retired key
    schema = error.schema if isinstance(error.schema, dict) else {}
    hint = ""
    if error.validator == "additionalProperties" and "properties" in schema:
        hint = f"; allowed keys here: {', '.join(sorted(schema['properties']))}"
    elif error.validator == "enum":
        hint = f"; allowed values: {', '.join(map(str, error.validator_value))}"
    elif error.validator == "type" and isinstance(error.instance, str) and _looks_numeric(error.instance):
        hint = (
            "; a number arrived as text, as Snakemake's --config passes list items and some numbers:"
            " put the value in a YAML file and add it with --configfile"
        )
    elif "description" in schema:
        hint = f" ({schema['description']})"
    return f"config error at '{where}': {msg}{hint}"


def validate(config: dict[str, Any]) -> dict[str, Any]:
    """Validate against the schema, fill its defaults, and check what a schema cannot express.

    Returns a new dict; raises ConfigError naming the key and the fix.
    """
    import jsonschema

    config = copy.deepcopy(config)
    schema = _schema()
    validator_cls = jsonschema.validators.validator_for(schema)
    validator = _with_defaults(validator_cls)(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        raise ConfigError("\n".join(_describe(e) for e in errors[:5]))
    _resolve_same_as(config)
    _check_semantics(config)
    _expand_arms(config)
    _expand_classes(config)
    return config


AA_INSTANCE_ENV = "SPECSWEEP_ARM_INSTANCE"  # sets an A/A arm's server apart from its twin's (another identity)


def _resolve_same_as(config: dict[str, Any]) -> None:
    """An A/A arm (`same_as: <arm>`) takes the named arm's server configuration, with a variable of its own in
    the server's environment so that it runs on an instance of its own (the same command line would otherwise
    name the same server, which the lifecycle code reuses). Idempotent."""
    arms: dict[str, Any] = config["arms"]
    for name, arm in arms.items():
        target = arm.get("same_as")
        if target is None:
            continue
        twin = arms.get(target)
        if twin is None or twin.get("same_as") or twin.get("policy") or twin.get("draft_lengths"):
            why = "is not defined" if twin is None else "is itself an A/A, policy or multi-draft-length arm"
            raise ConfigError(
                f"config error at 'arms/{name}/same_as': arm '{target}' {why}; name a plain arm of the config "
                f"({', '.join(a for a, c in arms.items() if not c.get('same_as'))})"
            )
        copied = {k: copy.deepcopy(v) for k, v in twin.items() if k not in ("family", "policy", "same_as")}
        copied["env_vars"] = {**copied.get("env_vars", {}), AA_INSTANCE_ENV: name}
        arms[name] = {**copied, "same_as": target}


def aa_arms(config: dict[str, Any]) -> dict[str, str]:
    """A/A arm -> the arm it repeats."""
    return {name: arm["same_as"] for name, arm in config["arms"].items() if arm.get("same_as")}


def _with_defaults(validator_cls: Any) -> Any:
    """A validator that also fills schema defaults (also inside additionalProperties maps)."""
    import jsonschema

    validate_properties = validator_cls.VALIDATORS["properties"]

    def set_defaults(validator: Any, properties: Any, instance: Any, schema: Any) -> Any:
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if isinstance(sub, dict) and "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_cls, {"properties": set_defaults})


def _check_semantics(config: dict[str, Any]) -> None:
    arms = config["arms"]
    base = config["analysis"]["baseline_arm"]
    if base not in arms:
        raise ConfigError(
            f"config error at 'analysis/baseline_arm': arm '{base}' is not defined; known arms: {', '.join(arms)}"
        )
    if arms[base]["speculative"]:
        raise ConfigError(f"config error at 'arms/{base}': the baseline arm must have speculative: false")
    if arms[base].get("same_as"):
        raise ConfigError(f"config error at 'arms/{base}': the baseline arm cannot be an A/A arm (same_as)")
    if not any(a["speculative"] for a in arms.values() if not a.get("same_as")):
        raise ConfigError("config error at 'arms': define at least one arm with speculative: true")
    cap, top = config["workload"]["requests"].get("max"), max(config["concurrency"])
    if cap and not config["workload"]["requests"].get("duration_s") and cap < 2 * top:
        raise ConfigError(
            f"config error at 'workload/requests/max': {cap} measured requests cannot fill C={top}'s steady window"
            f" (it needs at least 2 x C = {2 * top}); raise max to {2 * top} or more, or drop the level"
        )
    _check_load(config)
    if config["pairing"]["mode"] == "interleaved" and config["load"]["mode"] != "closed":
        raise ConfigError(
            f"config error at 'pairing/mode': interleaved arms measure closed-loop levels, and load.mode is "
            f"{config['load']['mode']}; set pairing.mode to auto or sequential"
        )
    most = config["precision"].get("max_instances")
    if most is not None and most < config["pairing"]["instances"]:
        raise ConfigError(
            f"config error at 'precision/max_instances': {most} is below pairing.instances "
            f"({config['pairing']['instances']}), the instances every sequential level starts with; set it to at "
            "least that, or null (no instance pair added)"
        )
    _check_dataset(config["workload"])
    _check_classes(config["workload"])
    _check_budget(config)
    for name, variant in config["variants"].items():
        if UNIT_SEP in name:
            raise ConfigError(
                f"config error at 'variants/{name}': '{UNIT_SEP}' joins a variant and a content class in a unit's name "
                f"(<variant>{UNIT_SEP}<class>); rename the variant without it"
            )
        for arm in variant.get("arm_server_args", {}):
            if arm not in arms:
                raise ConfigError(
                    f"config error at 'variants/{name}/arm_server_args/{arm}': unknown arm; "
                    f"known arms: {', '.join(arms)}"
                )
        if variant["engine"] in ("sglang", "vllm") and not (variant.get("model") or variant.get("model_builder")):
            raise ConfigError(
                f"config error at 'variants/{name}/model': engine {variant['engine']} needs a model path "
                "(or model_builder: tiny-llama)"
            )


OPEN_LOOP_METRICS = ("tpot_p50_s", "tpot_p99_s", "e2e_p50_s", "goodput_rps", "per_request_tok_s_mean")


def _check_load(config: dict[str, Any]) -> None:
    """Open and trace sweeps: what only closed loops have is refused, and a trace is read whole (a bad line
    stops here, before any server starts)."""
    mode = load_mode(config)
    if mode == "closed":
        return
    if config["adaptive"]["enabled"]:
        raise ConfigError(
            f"config error at 'adaptive/enabled': adaptive levels add concurrency levels, and load.mode is {mode}; "
            "set adaptive.enabled: false (or load.mode: closed)"
        )
    if config["policy"]["measure"]:
        raise ConfigError(
            f"config error at 'policy/measure': the policy arm is measured on closed-loop sweeps, and load.mode is "
            f"{mode}; set policy.measure: false (policy.yaml still gives the threshold in running requests)"
        )
    metric = config["analysis"]["primary_metric"]
    if metric not in OPEN_LOOP_METRICS:
        raise ConfigError(
            f"config error at 'analysis/primary_metric': {metric} is the offered load itself in an {mode} loop "
            f"(every arm that keeps up delivers what arrives); choose one of {', '.join(OPEN_LOOP_METRICS)}"
        )
    if mode == "trace":
        from specsweep.client.arrivals import TraceError, load_mooncake_trace

        path = config["load"]["trace"]["path"]
        if not path:
            raise ConfigError("config error at 'load/trace/path': load.mode is trace; name a Mooncake JSONL trace")
        try:
            load_mooncake_trace(path)
        except TraceError as e:
            raise ConfigError(f"config error at 'load/trace/path': {e}") from None


def read_dataset(workload: dict[str, Any]) -> Dataset | None:
    """The workload's dataset, read and checked against the workload (None: the synthetic words); raises
    DatasetError. Run at validation (before any job) and again by the cell (which can run standalone)."""
    ds, output = workload.get("dataset"), workload["output_tokens"]
    by_reference = isinstance(output, dict) and "reference" in output
    if ds is None and not by_reference:
        return None  # and the client package (pandas, pyarrow) stays unimported while Snakemake parses
    from specsweep.client.datasets import DatasetError, check_reference_lengths, load_dataset

    if ds is None:
        if by_reference:
            raise DatasetError(
                "workload.output_tokens is {reference: ...} and there is no dataset to take reference answers from;"
                " set workload.dataset or give output_tokens a number or {uniform: [lo, hi]}"
            )
        return None
    dataset = load_dataset(ds["path"], ds["format"], ds.get("name"), ds.get("chat"))
    content = workload.get("content")
    if content and content.get("category") is not None:  # one class of the dataset (a unit's workload)
        from specsweep.client.contents import ContentClass, class_dataset

        dataset = class_dataset(dataset, ContentClass(content["name"], ds, content["category"]))
    if by_reference:
        if output["reference"]["min"] > output["reference"]["max"]:
            raise DatasetError("workload.output_tokens.reference: min is above max; swap them")
        check_reference_lengths(dataset)
    if dataset.conversational and workload["endpoint"] != "chat":
        first = next(e for e in dataset.entries if not e.single_turn)
        raise DatasetError(
            f"{first.where}: a conversation of {len(first.messages)} messages, which only a chat template turns into "
            "the model's input; set workload.endpoint: chat (specsweep bench: --endpoint chat)"
        )
    return dataset


def _check_classes(workload: dict[str, Any]) -> None:
    """Content classes that cannot be swept stop the run here, naming the key and the fix: a bad name, a class
    with no prompts (no dataset, or no entry of its category), a mix over unknown classes or not summing to 1."""
    if not (workload["classes"] or workload["classes_by"] or workload["mix"]):
        return
    from specsweep.client.contents import ContentError, check_names, classes_of

    try:
        check_names(workload)
    except ContentError as e:
        raise ConfigError(str(e)) from None
    if workload["classes_by"]:
        if not workload["dataset"]:
            raise ConfigError(
                "config error at 'workload/classes_by': classes_by reads the categories of workload.dataset, and "
                "there is none; set workload.dataset (a format with a category field: speed-bench, mtbench, chat-log)"
            )
        return  # the categories are read and checked by _expand_classes
    for name, content in classes_of(workload).items():
        try:
            read_dataset({**workload, "dataset": content.dataset, "content": content.spec()})
        except ValueError as e:  # DatasetError
            raise ConfigError(f"config error at 'workload/classes/{name}': {e}") from None


def _expand_classes(config: dict[str, Any]) -> None:
    """`classes_by: category`: one class per category of the workload's dataset, listed in `classes` (sorted;
    classes_by then cleared, so a validated config validates to itself); the mix checked against them."""
    workload = config["workload"]
    if not workload["classes_by"]:
        return
    from specsweep.client.contents import ContentError, categories, check_names

    try:
        found = categories(read_dataset({**workload, "classes": None}))  # type: ignore[arg-type]
    except ValueError as e:
        raise ConfigError(f"config error at 'workload/classes_by': {e}") from None
    workload["classes"] = {c: {"dataset": None, "category": c, "synthetic": False} for c in found}
    workload["classes_by"] = None
    try:
        check_names(workload)
    except ContentError as e:
        raise ConfigError(f"{e} (the classes are the dataset's categories: {', '.join(found)})") from None


def sweep_units(config: dict[str, Any]) -> list[str]:
    """What the sweep measures and answers for, in order: each variant itself where the workload has one
    content, else each variant's classes (`<variant>@<class>`) and, with a mix, `<variant>@mix`
    (client/contents.py). Every rule that measures or analyses takes a unit where it took a variant; the
    stack's rules (preflight, env, model) stay per variant, and a unit's servers are its variant's."""
    from specsweep.client.contents import MIX, unit_name

    workload = config.get("workload") or {}  # (a config not yet validated: one content)
    classes = list(workload.get("classes") or {})
    contents: list[str | None] = [*classes, *([MIX] if workload.get("mix") else [])] if classes else [None]
    return [unit_name(v, c) for v in config["variants"] for c in contents]


def headline_units(config: dict[str, Any]) -> list[str]:
    """Per variant, the unit that gives its one answer: the variant itself (one content), or its mix; the
    variants compared side by side (`specsweep compare`). Classes without a mix give each class's answer only:
    every unit is then compared."""
    units = sweep_units(config)
    if not config["workload"]["classes"]:
        return units
    mixes = [u for u in units if u.endswith(f"{UNIT_SEP}mix")]
    return mixes or units


def unit_variant(unit: str) -> str:
    """The variant (software stack) a sweep unit runs on."""
    return unit.partition(UNIT_SEP)[0]


def variant_config(config: dict[str, Any], unit: str) -> dict[str, Any]:
    """A variant's config, by its name or a unit of it (a rule's slice of the config may key it by the unit)."""
    variants = config["variants"]
    return variants[unit] if unit in variants else variants[unit_variant(unit)]


def unit_workload(config: dict[str, Any], unit: str) -> dict[str, Any]:
    """The workload a unit's cells send (their cell spec's): without the classes and the mix, the unit's class
    as `content` with its dataset (or the mix's classes). A workload with one content and the default stop
    gives exactly the workload as it was before classes and stops existed, so no stored cell is re-measured."""
    from specsweep.client.contents import MIX, classes_of

    workload = {k: v for k, v in config["workload"].items() if k not in ("classes", "classes_by", "mix")}
    if workload["stop"] == "fixed":
        del workload["stop"]
    content = unit.partition(UNIT_SEP)[2]
    if not content:
        return workload
    classes = classes_of(config["workload"])
    if content == MIX:
        mix = {k: float(w) for k, w in config["workload"]["mix"].items() if float(w) > 0}
        workload["dataset"] = None
        workload["content"] = {"name": MIX, "mix": mix, "classes": {k: classes[k].spec() for k in mix}}
    else:
        workload["dataset"] = classes[content].dataset
        workload["content"] = classes[content].spec()
    return workload


def content_facts(config: dict[str, Any], unit: str) -> dict[str, Any]:
    """What a unit's requests held, as the analysis, the table, policy.yaml and MLflow say it: its class (None:
    the workload's one content), the prompts' source, where answers stopped."""
    workload = unit_workload(config, unit)
    content = workload.get("content") or {}
    if "mix" in content:
        prompts = "mix: " + ", ".join(f"{k} {w:.0%}" for k, w in content["mix"].items())
        synthetic = any(c["dataset"] is None for c in content["classes"].values())
    else:
        ds = workload["dataset"]
        synthetic = ds is None
        prompts = (
            "synthetic words"
            if synthetic
            else f"dataset {ds.get('name') or Path(ds['path']).stem} ({ds['format']})"
            + (f", category {content['category']}" if content.get("category") else "")
        )
    return {
        "unit": unit,
        "variant": unit_variant(unit),
        "content": content.get("name"),
        "prompts": prompts,
        "synthetic": synthetic,
        "stop": config["workload"]["stop"],
        "output_tokens": config["workload"]["output_tokens"],
        "engine": variant_config(config, unit)["engine"],
    }


def unit_datasets(config: dict[str, Any], unit: str) -> list[str]:
    """The workload files a unit's cells read (an edited file re-measures them)."""
    workload = unit_workload(config, unit)
    content = workload.get("content") or {}
    specs = [c["dataset"] for c in content["classes"].values()] if "classes" in content else [workload["dataset"]]
    return sorted({d["path"] for d in specs if d})


def _check_dataset(workload: dict[str, Any]) -> None:
    """A bad workload file stops the run here, before any server starts."""
    try:
        read_dataset(workload)
    except ValueError as e:  # DatasetError
        raise ConfigError(f"config error at 'workload/dataset': {e}") from None


def _expand_arms(config: dict[str, Any]) -> None:
    """The arms the sweep measures: each speculative arm once per `draft_lengths` entry (sub-arms
    `<arm>-k<K>`), and with `policy.measure` one `<arm>-policy` arm per speculative arm that serves the derived
    schedule. Every arm records its `family` (the speculative arm it came from). Idempotent: a validated
    config validates to itself."""
    arms: dict[str, Any] = config["arms"]
    expanded: dict[str, Any] = {}
    renamed: dict[str, list[str]] = {}
    for name, arm in arms.items():
        if not arm["speculative"] or arm.get("same_as"):  # an A/A arm is measured as it is, in no family
            expanded[name] = arm
            continue
        if arm.get("policy"):
            continue  # re-added below
        lengths = arm.get("draft_lengths")
        if lengths:
            base = {k: v for k, v in arm.items() if k != "draft_lengths"}
            subs = {
                f"{name}-k{k}": {**copy.deepcopy(base), "draft_length": int(k), "family": name} for k in sorted(lengths)
            }
        else:
            subs = {name: {**arm, "family": arm.get("family") or name}}
        for sub in subs:
            if sub in arms and sub != name:
                raise ConfigError(
                    f"config error at 'arms/{name}/draft_lengths': sub-arm name '{sub}' is taken by another arm; "
                    "rename that arm"
                )
        expanded.update(subs)
        renamed[name] = list(subs)
    for name, subs in renamed.items():
        for variant in config["variants"].values():
            extra = variant.get("arm_server_args", {})
            if name in extra and subs != [name]:
                for sub in subs:
                    extra.setdefault(sub, list(extra[name]))
                del extra[name]
    if config["policy"]["measure"]:
        for family in _families_of(expanded):
            members = [a for a in expanded.values() if a.get("family") == family]
            policy_name = f"{family}-policy"
            if policy_name in expanded:
                raise ConfigError(
                    f"config error at 'arms/{policy_name}': the name is reserved for {family}'s policy arm"
                )
            first = members[0]
            expanded[policy_name] = {
                "speculative": True,
                "server_args": list(first.get("server_args", [])),
                "env_vars": dict(first.get("env_vars", {})),
                "family": family,
                "policy": True,
            }
            for variant in config["variants"].values():
                extra = variant.get("arm_server_args", {})
                member_args = [
                    extra[m] for m in (a for a, v in expanded.items() if v.get("family") == family) if m in extra
                ]
                if member_args:
                    extra.setdefault(policy_name, list(member_args[0]))
    unknown = sorted(set(config["policy"]["schedules"]) - set(_families_of(expanded)))
    if unknown:
        raise ConfigError(
            f"config error at 'policy/schedules': {', '.join(unknown)} is not a speculative arm; "
            f"known: {', '.join(_families_of(expanded))}"
        )
    for family, schedule in config["policy"]["schedules"].items():
        from specsweep.sim.engine import parse_schedule

        try:
            parse_schedule(schedule)
        except ValueError as e:
            raise ConfigError(f"config error at 'policy/schedules/{family}': {e}") from None
    if config["policy"].get("max_rounds") is not None and config["precision"].get("target") is None:
        raise ConfigError(
            "config error at 'policy/max_rounds': a policy level adds rounds to the sequential rounds of "
            "precision.target, which is null: set precision.target (e.g. 0.05) or remove policy.max_rounds"
        )
    config["arms"] = expanded


def _families_of(arms: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(a["family"] for a in arms.values() if a.get("family") and not a.get("policy")))


def families(config: dict[str, Any]) -> dict[str, dict[str, int | None]]:
    """Each speculative arm as configured (its family) -> its measured fixed arms and their draft lengths."""
    out: dict[str, dict[str, int | None]] = {}
    for name, arm in config["arms"].items():
        if arm.get("family") and not arm.get("policy"):
            out.setdefault(arm["family"], {})[name] = arm.get("draft_length")
    return out


def policy_arms(config: dict[str, Any]) -> dict[str, str]:
    """Policy arm -> its family (empty unless policy.measure)."""
    return {name: arm["family"] for name, arm in config["arms"].items() if arm.get("policy")}


def server_args(config: dict[str, Any], variant: str, arm: str) -> dict[str, Any]:
    """The arm's config with `server_args` merged as the engine sees them: variant, arm, variant-per-arm."""
    v = variant_config(config, variant) if config.get("variants") else {}
    a = dict((config.get("arms") or {}).get(arm) or {})
    argv = [
        *(v.get("server_args") or []),
        *(a.get("server_args") or []),
        *((v.get("arm_server_args") or {}).get(arm) or []),
    ]
    a["server_args"] = [str(x) for x in argv]
    return a


def fixed_arms(config: dict[str, Any]) -> list[str]:
    """The arms with one fixed server configuration: the baseline and every speculative (sub-)arm."""
    return [name for name, arm in config["arms"].items() if not arm.get("policy")]


def load_arg(value: str | Path | None) -> dict[str, Any]:
    """A `--config` argument: inline JSON text (a slice of the config, as the Snakemake rules pass it) or a
    YAML/JSON file; {} when empty. Not validated: a slice is not a whole config."""
    if value is None or str(value) == "":
        return {}
    text = str(value)
    if not text.lstrip().startswith("{") and Path(text).exists():
        text = Path(text).read_text()
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ConfigError(f"--config: neither a config file nor inline JSON/YAML: {str(value)[:80]!r}")
    return data


def load(path: str | Path) -> dict[str, Any]:
    return validate(load_yaml(path))


LEVEL_PREFIX = {"closed": "c", "open": "r", "trace": "t"}  # a cell's folder: c<C>, r<requests/s>, t<time scale>
LEVEL_UNIT = {"closed": "concurrency", "open": "requests/s", "trace": "time scale"}


def load_mode(config: dict[str, Any]) -> str:
    """closed, open or trace (`load.mode`; an analysis_spec holds the mode itself)."""
    load = config.get("load") or {}
    return load if isinstance(load, str) else str(load.get("mode", "closed"))


def levels(config: dict[str, Any]) -> list[int | float]:
    """The configured levels in the load mode's unit: concurrency, requests/s or trace time scales."""
    mode, load = load_mode(config), config.get("load") or {}
    if mode == "open":
        return sorted(_number(x) for x in load["rates"])
    if mode == "trace":
        return sorted(_number(x) for x in load["trace"]["time_scales"])
    return sorted(int(c) for c in config["concurrency"])


def _number(x: float) -> int | float:
    return int(x) if float(x).is_integer() else float(x)


def configured_levels(config: dict[str, Any]) -> list[int | float] | None:
    """The levels an analysis config names: its `levels` (analysis_spec), else those of a whole config."""
    if config.get("levels"):
        return list(config["levels"])
    if config.get("concurrency") or (config.get("load") or {}).get("mode") not in (None, "closed"):
        return levels(config)
    return None


def level_name(mode: str, value: float) -> str:
    """A cell's folder name: `c10`, `r2.5`, `t1` (the level's unit by its prefix)."""
    return f"{LEVEL_PREFIX[mode]}{_number(value)}"


def parse_level(name: str) -> tuple[str, int | float]:
    """`c10` -> ("closed", 10), `r2.5` -> ("open", 2.5), `t1` -> ("trace", 1)."""
    for mode, prefix in LEVEL_PREFIX.items():
        if name.startswith(prefix):
            try:
                return mode, _number(float(name[len(prefix) :]))
            except ValueError:
                break
    raise ValueError(f"{name!r} is not a level name (c<concurrency>, r<requests/s> or t<time scale>)")


def request_count(concurrency: int, per_concurrency: float, floor: int, maximum: int | None = None) -> int:
    """Measured requests at one level (after its C ramp requests): per_concurrency turnovers of every slot, at
    least 2*C so the steady window holds a full turnover, at least the floor, at most `maximum`."""
    n = max(int(floor), int(round(per_concurrency * concurrency)), 2 * concurrency)
    return min(n, int(maximum)) if maximum else n


def requests_for(config: dict[str, Any], concurrency: int) -> int:
    """Measured requests at a level. With adaptive levels, the grid's levels may be measured with fewer
    turnovers (`adaptive.grid_per_concurrency`: far from the crossover a rough figure is enough) and the added
    ones with more (`adaptive.added_per_concurrency`: they decide the crossover's interval)."""
    rule = config["workload"]["requests"]
    per_c = rule["per_concurrency"]
    adaptive = config.get("adaptive") or {}
    if adaptive.get("enabled"):
        grid = int(concurrency) in {int(c) for c in config["concurrency"]}
        per_c = adaptive.get("grid_per_concurrency" if grid else "added_per_concurrency") or per_c
    return request_count(int(concurrency), per_c, rule["floor"], rule.get("max"))


def speculative_arms(config: dict[str, Any]) -> list[str]:
    """The fixed speculative arms (sub-arms included, policy arms not)."""
    return [
        name
        for name, arm in config["arms"].items()
        if arm["speculative"] and not arm.get("policy") and not arm.get("same_as")
    ]


def cells(config: dict[str, Any]) -> list[Cell]:
    return [Cell(v, a, c) for v in sweep_units(config) for a in config["arms"] for c in sorted(config["concurrency"])]


LEVEL_RANKS = 10**6  # priority steps per server group: levels up to 9,999.99 keep their order


def cell_priority(config: dict[str, Any], variant: str, arm: str, level: str) -> int:
    """Snakemake priority that runs all cells of one server (variant x arm) back to back, so each server
    starts once per sweep even though every cell is its own job, and a server's cells from the highest level
    down. Why a fixed order: a server's first minute is not like its later ones (a vLLM CPU server measured
    first at C=1 right after start ran 9-35% slower than at C=1 minutes later), and Snakemake otherwise picks
    a different order per arm, so the arms' speedup at a level compared a cold server with a warm one. With one
    order every arm meets the same server age at the same level; the highest level first puts the cold minute
    where the repeats are longest and its own warm-up is largest. The baseline's server goes first in each
    variant, whatever the arms' order: a speculative cell compares its outputs with the baseline cell's."""
    base = config["analysis"]["baseline_arm"]  # first: a speculative cell refers its outputs to the baseline's
    arms = [a for a in config["arms"] if a == base] + [a for a in config["arms"] if a != base]
    groups = [(v, a) for v in sweep_units(config) for a in arms]
    group = len(groups) - groups.index((variant, arm))
    value = float(parse_level(level)[1])
    return group * LEVEL_RANKS + min(int(round(value * 100)), LEVEL_RANKS - 1)


def pairing_mode(config: dict[str, Any], variant: str) -> str:
    """How the variant's fixed arms are measured: "interleaved" (all servers up at once, one job per level
    alternating the arms' blocks) or "sequential" (one server at a time). `auto` interleaves closed-loop
    levels of variants that hold no GPUs: their servers fit together (the simulated engine, vLLM's CPU build)."""
    mode = config["pairing"]["mode"]
    if mode != "auto":
        return str(mode)
    fits = variant_config(config, variant).get("gpus") in (None, "")
    return "interleaved" if fits and load_mode(config) == "closed" and len(fixed_arms(config)) > 1 else "sequential"


def policy_reference(served: dict[str, Any], level: float) -> str | None:
    """The fixed arm a policy arm is measured against at `level`: the best fixed arm there, by the schedule
    job's reading of the fixed cells (schedule.json `best_fixed`). Where the policy serves that arm's K the pair
    is an A/A comparison; where the schedule is wrong, the pair shows the loss. None: no valid fixed cell."""
    return (served.get("best_fixed") or {}).get(f"{float(level):g}")


def proof_precision(config: dict[str, Any]) -> dict[str, Any] | None:
    """The precision block of a policy level's two cells where `policy.max_rounds` is set: rounds are added until
    the proof is decided at `proof_margin` (`analysis.precision.proof_decided`), not until the width target is
    met; None where it is not set (a policy level measures as a fixed arms' level)."""
    most = (config.get("policy") or {}).get("max_rounds")
    if most is None or config["precision"].get("target") is None:
        return None
    precision = _precision_key(config)
    return {
        **precision,
        "max_rounds": max(int(most), int(precision["min_rounds"])),
        "proof_margin": float(config["policy"]["margin"]),
    }


def policy_level_specs(
    config: dict[str, Any], variant: str, arm: str, concurrency: int, served: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """A policy level's cell specs, reference arm first (`policy_reference`: measured with it in interleaved
    blocks, the proof's pair), then the policy arm; the policy arm alone where no fixed cell of the level was valid.
    Both arms of an interleaved level share one precision block, so the reference takes the policy's."""
    spec = cell_spec(config, variant, arm, concurrency, served)
    ref = spec["pairing"]["reference"]
    if not ref:
        return {arm: spec}
    ref_spec = cell_spec(config, variant, ref, concurrency)
    if "precision" in spec:
        ref_spec["precision"] = spec["precision"]
    return {ref: ref_spec, arm: spec}


def instances(config: dict[str, Any], variant: str) -> int:
    """Server instances per fixed arm of a sequential variant (`pairing.instances`), measured in segments; 1
    where arms interleave (their level jobs hold every instance at once: `interleaved_instances`) or the load
    is open (their cells are measured as they are)."""
    if pairing_mode(config, variant) != "sequential" or load_mode(config) != "closed":
        return 1
    return int(config["pairing"]["instances"])


def interleaved_instances(config: dict[str, Any], variant: str) -> int:
    """Server instances per arm of an interleaved variant (`pairing.instances`): every level job holds them all
    up at once and its rounds go through them, so the instance effect enters the paired interval."""
    return int(config["pairing"]["instances"]) if pairing_mode(config, variant) == "interleaved" else 1


def with_instance(arm_cfg: dict[str, Any], arm: str, instance: int) -> dict[str, Any]:
    """The arm's config for its server instance `instance` (1, 2, ...): a variable in the server's environment
    gives that instance an identity of its own, so the lifecycle code starts it beside the arm's others."""
    own = arm_cfg.get("env_vars", {}).get(AA_INSTANCE_ENV, arm)
    return {**arm_cfg, "env_vars": {**arm_cfg.get("env_vars", {}), AA_INSTANCE_ENV: f"{own}.i{instance}"}}


def replicated_variants(config: dict[str, Any]) -> list[str]:
    return [v for v in sweep_units(config) if instances(config, v) > 1]


def max_instances(config: dict[str, Any], variant: str) -> int:
    """The most server instances per fixed arm a replicated variant's level may take: precision.max_instances
    (the segment rule adds a pair at a time while the level's interval is wider than precision.target), else
    pairing.instances (fixed: no pair added)."""
    n = instances(config, variant)
    most = config["precision"].get("max_instances")
    if n < 2 or most is None or config["precision"]["target"] is None:
        return n
    return max(n, int(most))


def segments(config: dict[str, Any], variant: str) -> list[tuple[str, int]]:
    """The (arm, instance) segments of a replicated variant in the order they run: the fixed arms forward for
    odd instances and reversed for even ones (baseline i1, eagle3 i1, eagle3 i2, baseline i2, then the pairs the
    segment rule may add: baseline i3, eagle3 i3, ...)."""
    arms = [config["analysis"]["baseline_arm"]] + [
        a for a in fixed_arms(config) if a != config["analysis"]["baseline_arm"]
    ]
    out = []
    for k in range(1, max_instances(config, variant) + 1):
        out += [(a, k) for a in (arms if k % 2 else list(reversed(arms)))]
    return out


def segment_priority(config: dict[str, Any], variant: str, arm: str, instance: int, level: str) -> int:
    """Snakemake priority of an instance cell: the variant's segments in their order, each one's levels from
    the highest down (as `cell_priority`), so each instance starts once and the order is counterbalanced."""
    order = [(v, a, k) for v in sweep_units(config) for a, k in segments(config, v)]
    group = len(order) - order.index((variant, arm, instance))
    value = float(parse_level(level)[1])
    return group * LEVEL_RANKS + min(int(round(value * 100)), LEVEL_RANKS - 1)


def segment_need_priority(config: dict[str, Any]) -> int:
    """Snakemake priority of the segment rule's checkpoint: above every instance cell, so each level's answer
    after a pair comes before the next pair's first cell; the added pair's cells then run level after level on
    one server start per arm (asked after the next level's cells, a level's added pair would start its servers
    once for itself and once more for the others)."""
    order = [(v, a, k) for v in sweep_units(config) for a, k in segments(config, v)]
    return (len(order) + 1) * LEVEL_RANKS


def interleaved_variants(config: dict[str, Any]) -> list[str]:
    return [v for v in sweep_units(config) if pairing_mode(config, v) == "interleaved"]


def level_priority(config: dict[str, Any], variant: str, level: str) -> int:
    """Snakemake priority of an interleaved level: a variant's levels back to back, the highest first (the
    order `cell_priority` gives each server's cells, for the same reason)."""
    units = sweep_units(config)
    group = len(units) - units.index(variant)
    value = float(parse_level(level)[1])
    return group * LEVEL_RANKS + min(int(round(value * 100)), LEVEL_RANKS - 1)


def cell_dir(config: dict[str, Any], cell: Cell) -> Path:
    return Path(config["results_dir"]) / config["experiment"] / cell.variant / cell.arm / f"c{cell.concurrency}"


def model_dir(results_dir: str, experiment: str, variant_name: str) -> Path:
    """Where a model_builder's model lives: built per experiment and variant, in its environment."""
    return Path(results_dir) / experiment / "models" / variant_name


def variant_for_server(spec_or_config: dict[str, Any], variant_name: str, absolute: bool = True) -> dict[str, Any]:
    """The variant as its server needs it: a built model's path filled in (absolute unless asked otherwise)."""
    variant_name = unit_variant(variant_name)  # a unit's server is its variant's
    variants = spec_or_config.get("variants") or {variant_name: spec_or_config["variant"]}
    variant = dict(variants[variant_name])
    if variant.get("model_builder"):
        path = model_dir(spec_or_config["results_dir"], spec_or_config["experiment"], variant_name)
        variant["model"] = str(path.resolve() if absolute else path)
    return variant


def _variant_for_arm(variant: dict[str, Any], arm: str) -> dict[str, Any]:
    """The variant without other arms' extra arguments, so changing one arm never reruns another's cells, and
    without its start-up timeout and cluster resources (how long to wait for a server, or where its job runs,
    changes no measurement; the node a cell ran on is in its summary)."""
    out = {k: v for k, v in variant.items() if k not in ("startup_timeout_s", "slurm")}
    out["arm_server_args"] = {k: v for k, v in variant.get("arm_server_args", {}).items() if k == arm}
    return out


def _precision_key(config: dict[str, Any]) -> dict[str, Any]:
    """The precision block as a cell's identity holds it: `decide_margin` only where it is not the default
    (added with its default on: the cells measured before it came keep their identity, and a stored cell stays
    an answer, measured at least as long as the verdict stop would have)."""
    precision = dict(config["precision"])
    if precision.get("decide_margin") == defaults("precision")["decide_margin"]:
        precision.pop("decide_margin", None)
    return precision


def cell_spec(
    config: dict[str, Any],
    variant: str,
    arm: str,
    concurrency: int,
    served: dict[str, Any] | None = None,
    instance: int | None = None,
) -> dict[str, Any]:
    """Everything one cell's measurement depends on, and nothing else (a Snakemake param: changing it reruns
    the cell). Gates, SLOs and analysis settings judge stored records (`analysis_spec`, `tracking_spec`);
    the server start-up timeout is a resource of the rule (`startup_timeout_s`). A policy arm's cell also
    holds the schedule it serves (`served`: its family's entry of schedule.json)."""
    arm_cfg = config["arms"][arm]
    if instance is not None:  # one segment of a replicated arm: a server instance of its own (another identity)
        arm_cfg = with_instance(arm_cfg, arm, instance)
    served_by = arm  # the arm whose server flags the cell's server takes
    if arm_cfg.get("policy"):
        if not served or not served.get("schedule"):
            raise ConfigError(f"arm {arm} serves its family's derived schedule, and none was given")
        arm_cfg = {**arm_cfg, "schedule": served["schedule"]}
        if served.get("file"):
            arm_cfg["schedule_file"] = served["file"]
        if variant_config(config, variant).get("engine") == "sglang" and all(
            int(k) == 0 for *_, k in served["schedule"]
        ):
            # No drafting at any load: SGLang would be started with --speculative-num-steps 0 and a draft model;
            # the deployment that serves this schedule is plain decoding, so the cell serves the baseline's command.
            served_by = config["analysis"]["baseline_arm"]
            arm_cfg = {
                **config["arms"][served_by],
                "family": arm_cfg["family"],
                "policy": True,
                "schedule": served["schedule"],
                "serves_arm": served_by,
            }
    mode = load_mode(config)
    if arm_cfg.get("policy") and pairing_mode(config, variant) == "interleaved":
        ref = policy_reference(served or {}, concurrency)
        spec = {**_common_cell_spec(config, variant, served_by, arm_cfg, arm), "concurrency": int(concurrency)}
        spec["n_requests"] = requests_for(config, int(concurrency))
        # measured in interleaved blocks with the best fixed arm at this level (None: none was valid)
        spec["pairing"] = {"mode": "interleaved", "reference": ref, **_instances_key(config, variant)}
        proof = proof_precision(config)
        if proof is not None and ref:  # measured until its proof is decided (a key only where asked: identities
            spec["precision"] = proof  # stay); alone, it has no pair to decide and measures as a fixed level
        return spec
    if mode != "closed":
        return {
            **_common_cell_spec(config, variant, served_by, arm_cfg, arm),
            "load": _load_slice(config["load"], mode),
            "level": _number(concurrency),
            "concurrency": int(config["load"]["max_in_flight"]),
            "n_requests": open_request_count(config, concurrency),
        }
    return {
        **_common_cell_spec(config, variant, served_by, arm_cfg, arm),
        "concurrency": int(concurrency),
        "n_requests": requests_for(config, int(concurrency)),
    }


def _load_slice(load: dict[str, Any], mode: str) -> dict[str, Any]:
    """The part of `load:` an open or trace cell's measurement depends on (a trace cell: not the rates)."""
    keep = ("mode", "max_in_flight", "trace") if mode == "trace" else ("mode", "max_in_flight", "arrival", "burstiness")
    out = {k: load[k] for k in keep}
    if mode == "open":
        out["duration_s"] = load["duration_s"]
    return out


def open_request_count(config: dict[str, Any], level: float) -> int:
    """Requests per repeat of an open level (rate x duration, at least the floor) or a trace level (its
    requests, or max_requests of them)."""
    load = config["load"]
    if load["mode"] == "trace":
        return int(load["trace"].get("max_requests") or 0)  # 0: the whole trace (its length is read by the cell)
    return max(int(config["workload"]["requests"]["floor"]), math.ceil(float(level) * float(load["duration_s"])))


def _common_cell_spec(
    config: dict[str, Any], variant: str, arm: str, arm_cfg: dict[str, Any], name: str | None = None
) -> dict[str, Any]:
    """`arm` gives the server flags (the variant's extra ones for it); `name` the cell's arm (default: `arm`)."""
    paired = pairing_mode(config, variant) == "interleaved" and not arm_cfg.get("policy")
    return {
        "experiment": config["experiment"],
        "results_dir": config["results_dir"],
        "variant_name": variant,
        "variant": _variant_for_arm(variant_config(config, variant), arm),
        "arm_name": name or arm,
        "arm": arm_cfg,
        # interleaved: measured in alternating blocks with these arms (a change of mode or arms re-measures)
        "pairing": (
            {"mode": "interleaved", "arms": fixed_arms(config), **_instances_key(config, variant)}
            if paired
            else {"mode": "sequential"}
        ),
        "repeats": config["repeats"],
        "workload": unit_workload(config, variant),
        "client": config["client"],
        # interleaved levels measure until their answer is known (a change re-measures them)
        **({"precision": _precision_key(config)} if pairing_mode(config, variant) == "interleaved" else {}),
        # one server at a time: a speculative cell refers its outputs' differences from the baseline cell's on
        # its own server (an interleaved level refers them on the reference arm's, measure/interleave.py)
        **(
            {"refer_against": config["analysis"]["baseline_arm"]}
            if pairing_mode(config, variant) != "interleaved" and arm_cfg.get("speculative")
            else {}
        ),
    }


def _instances_key(config: dict[str, Any], variant: str) -> dict[str, int]:
    """An interleaved cell spec's server instances per arm, where more than one (one instance adds no key, so
    the cells measured before instances existed keep their specs)."""
    n = interleaved_instances(config, variant)
    return {"instances": n} if n > 1 else {}


def analysis_spec(config: dict[str, Any], variants: list[str]) -> dict[str, Any]:
    """What the crossover and compare jobs read (a Snakemake param: only a change to it reruns them)."""
    return {
        "experiment": config["experiment"],
        "concurrency": config["concurrency"],
        "load": load_mode(config),
        "levels": levels(config),
        "analysis": config["analysis"],
        "gates": config["gates"],
        "slo": config["slo"],
        "arms": config["arms"],
        "policy": config["policy"],
        "variants": {v: variant_config(config, v) for v in variants},
        # what each unit sent: its content and where its answers stopped (a content warning is judged from it)
        "contents": {v: content_facts(config, v) for v in variants},
    }


def tracking_spec(config: dict[str, Any]) -> dict[str, Any]:
    """What the MLflow jobs read besides the files they log: where to log, under which experiment, and the
    gates and SLOs the logged cells are judged by. The tracking URI without a user:password@ of its own: the
    spec is a rule param, which Snakemake prints (the jobs get the credential from the environment,
    `tracking.credentials_to_env`)."""
    return {
        "experiment": config["experiment"],
        "results_dir": config["results_dir"],
        "mlflow": {**config["mlflow"], "tracking_uri": split_uri_credentials(config["mlflow"]["tracking_uri"])[0]},
        "gates": config["gates"],
        "slo": config["slo"],
        # the charts of the experiment's saved MLflow view (specsweep.tracking.view)
        "view_arms": {"speculative": speculative_arms(config), "policy": list(policy_arms(config))},
        # every arm in the config's order: each arm's sweep runs are drawn in a colour of their own
        "arms": list(config["arms"]),
    }


def preflight_spec(config: dict[str, Any], variant: str) -> dict[str, Any]:
    """What a variant's preflight checks (the preflight job's param): where environments and results go, the
    variant's stack, model, GPUs and port, and its arms' server arguments. Nothing else (gates, SLOs, start-up
    timeout, other variants), so editing those reruns no preflight."""
    v = config["variants"][variant]
    keys = ("engine", "recipe", "python", "model", "model_builder", "tp", "gpus", "host", "port", "server_args")
    arm_args = {
        name: list(arm.get("server_args", [])) + list(v.get("arm_server_args", {}).get(name, []))
        for name, arm in config["arms"].items()
    }
    units = [u for u in sweep_units(config) if unit_variant(u) == variant]
    speculative = any(arm.get("speculative") for arm in config["arms"].values())
    return {
        # what each of its units sends, where its arms speculate (a content warning is judged from it)
        "contents": [content_facts(config, u) for u in units] if speculative else [],
        "results_dir": config["results_dir"],
        "envs_dir": config["envs_dir"],
        "variant": variant,
        "spec": {k: v.get(k) for k in keys},
        # the simulated engine has no draft model and no fusion: its arms' flags are not checked
        "arm_args": arm_args if v["engine"] != "sim" else {},
    }


def startup_timeout_s(config: dict[str, Any], variant: str) -> int:
    """The variant's server start-up timeout (a resource of the cell rule, so changing it reruns nothing)."""
    return math.ceil(variant_config(config, variant)["startup_timeout_s"])


def slurm_resources(config: dict[str, Any], variant: str) -> dict[str, Any]:
    """The variant's job resources in the SLURM executor plugin's names (None: the cluster's default)."""
    v = variant_config(config, variant)
    s = v["slurm"]
    gpus = s["gpus"] if s["gpus"] is not None else (v["tp"] if v["engine"] == "sglang" else None)
    return {
        "slurm_partition": s["partition"],
        "slurm_account": s["account"],
        "gpu": gpus or None,
        "cpus_per_task": s["cpus_per_task"],
        "mem_mb": s["mem_mb"],
        "runtime": s["runtime_min"],
        "constraint": s["constraint"],
        "qos": s["qos"],
        "slurm_extra": s["extra"],
    }


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))
