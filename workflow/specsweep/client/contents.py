"""Content classes of a workload: which prompts each class sends, and the traffic mix's prompts.

Why classes: how many draft tokens the target accepts is a property of the content (code and templated text
repeat themselves, free prose does not), and the speedup at low load scales with it, so the crossover does too.
One answer over one content is precise about that content only. `workload.classes` (or `classes_by: category`,
a dataset's own category field, e.g. SPEED-Bench's 11) makes each class a unit of the sweep of its own
(`<variant>@<class>`: its cells, crossover and policy), served by the same servers; `workload.mix` (each
class's share of the user's requests) adds the unit `<variant>@mix`, whose every request's class is drawn by
those shares, so its batches mix contents as production's do: its policy is the one to paste.

Nothing here changes a workload with one content: its unit is the variant itself and its prompts carry no
class.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

from specsweep.client.datasets import Dataset, DatasetError
from specsweep.client.prompts import LevelPrompts, PromptSet, set_seed

__all__ = [
    "MIX",
    "UNIT_SEP",
    "ContentClass",
    "ContentError",
    "categories",
    "check_names",
    "class_dataset",
    "content_warning",
    "classes_of",
    "labelled",
    "mix_level_prompts",
    "split_unit",
    "unit_name",
]

MIX = "mix"  # the traffic mix's unit (`<variant>@mix`); no class may take the name
UNIT_SEP = "@"  # `<variant>@<class>`: a sweep unit's name, its results folder and its MLflow "variant"
MIX_TOLERANCE = 1e-6  # the mix's shares must sum to 1 within this


class ContentError(ValueError):
    """A content class or mix that cannot be swept; the message names the key and the fix."""


@dataclass(frozen=True)
class ContentClass:
    """One class: its prompts are the synthetic words (`dataset` None), or a dataset's entries, all of them or
    those of one category."""

    name: str
    dataset: dict[str, Any] | None  # a workload.dataset block (path, format, name, chat); None: synthetic words
    category: str | None

    def spec(self) -> dict[str, Any]:
        """What the class's cells depend on (the cell spec's `workload.content`)."""
        return {"name": self.name, "dataset": self.dataset, "category": self.category}


def content_warning(facts: dict[str, Any] | None) -> str | None:
    """Why a real engine's acceptance here is not production's: synthetic words, a fixed stop, or both (None:
    neither, or the simulated engine, whose acceptance is its profile's)."""
    if not facts or facts["engine"] == "sim":
        return None
    why = []
    if facts["synthetic"]:
        why.append("synthetic words (no model answers them as it answers your users)")
    if facts["stop"] == "fixed":
        why.append(
            "a fixed stop (ignore_eos: every answer forced to its full length, past the model's end of text, where "
            "the draft head was never trained)"
        )
    if not why:
        return None
    fixes = []
    if facts["synthetic"]:
        fixes.append("workload.dataset (your own traffic, or SPEED-Bench: docs/metrics.md)")
    if facts["stop"] == "fixed":
        fixes.append("workload.stop: natural")
    return (
        f"CONTENT: the accept length, and so the crossover, was measured on {' and on '.join(why)}; production's "
        f"differs, so this threshold is not one to paste. Measure your content: {'; '.join(fixes)}"
    )


def unit_name(variant: str, content: str | None) -> str:
    """A sweep unit's name: the variant itself with one content, else `<variant>@<class>` (or `@mix`)."""
    return variant if content is None else f"{variant}{UNIT_SEP}{content}"


def split_unit(unit: str) -> tuple[str, str | None]:
    """(variant, class or None) of a sweep unit's name."""
    variant, sep, content = unit.partition(UNIT_SEP)
    return variant, (content if sep else None)


def classes_of(workload: dict[str, Any]) -> dict[str, ContentClass]:
    """The workload's classes in the config's order (empty: one content). A class without a dataset or
    `synthetic` reads the workload's own dataset (filtered to its category, if it names one)."""
    out: dict[str, ContentClass] = {}
    for name, c in (workload.get("classes") or {}).items():
        if c.get("synthetic"):
            out[name] = ContentClass(name, None, None)
        else:
            out[name] = ContentClass(name, c.get("dataset") or workload.get("dataset"), c.get("category"))
    return out


def check_names(workload: dict[str, Any]) -> None:
    """Class names that can be units and folder names; a mix over known classes whose shares sum to 1."""
    classes = workload.get("classes") or {}
    if classes and workload.get("classes_by"):
        raise ContentError(
            "config error at 'workload/classes_by': set either classes (listed) or classes_by (the dataset's "
            "categories), not both"
        )
    for name, c in classes.items():
        where = f"config error at 'workload/classes/{name}'"
        if name == MIX or not name or any(ch in name for ch in f"{UNIT_SEP}/\\ ") or name.startswith("."):
            raise ContentError(
                f"{where}: a class name becomes a folder and a unit name (<variant>{UNIT_SEP}<class>); use letters, "
                f"digits, '-' or '_' (not '{MIX}', which names the traffic mix)"
            )
        if c.get("synthetic") and (c.get("dataset") or c.get("category")):
            raise ContentError(f"{where}: synthetic words take no dataset or category; drop one of them")
        if not c.get("synthetic") and not (c.get("dataset") or workload.get("dataset")):
            raise ContentError(
                f"{where}: no prompts: give the class a dataset, set workload.dataset for it to read, or set "
                "synthetic: true"
            )
    mix = workload.get("mix")
    if mix is None:
        return
    names = set(classes) or None
    if names is None and not workload.get("classes_by"):
        raise ContentError("config error at 'workload/mix': a mix weighs classes; define workload.classes first")
    unknown = sorted(set(mix) - names) if names is not None else []
    if unknown:
        raise ContentError(
            f"config error at 'workload/mix': {', '.join(unknown)} not among the classes "
            f"({', '.join(sorted(names or []))})"
        )
    total = sum(float(w) for w in mix.values())
    if abs(total - 1.0) > MIX_TOLERANCE:
        raise ContentError(
            f"config error at 'workload/mix': the shares sum to {total:g}, not 1; give each class its share of "
            "requests (e.g. from your own traffic), summing to 1"
        )
    if not any(float(w) > 0 for w in mix.values()):
        raise ContentError("config error at 'workload/mix': every share is 0; give at least one class a share")


def categories(dataset: Dataset) -> list[str]:
    """The dataset's categories, sorted; a DatasetError where an entry has none (its format has no category
    field, or the entry lacks it)."""
    missing = [e for e in dataset.entries if not getattr(e, "category", None)]
    if missing:
        raise DatasetError(
            f"{missing[0].where}: no category, and workload.classes_by is category; use a format with a category "
            "field (speed-bench, mtbench, chat-log) with it set on every entry, or list workload.classes"
        )
    return sorted({str(e.category) for e in dataset.entries})


def class_dataset(dataset: Dataset, content: ContentClass) -> Dataset:
    """The class's entries of `dataset` (all of them without a category); a DatasetError naming the category and
    the ones the file has where none matches."""
    if content.category is None:
        return dataset
    chosen = tuple(e for e in dataset.entries if getattr(e, "category", None) == content.category)
    if not chosen:
        have = sorted({str(getattr(e, "category", None)) for e in dataset.entries})
        raise DatasetError(
            f"{dataset.path}: no entry of category {content.category!r} (class {content.name}); its categories: "
            f"{', '.join(have[:20])}{' ...' if len(have) > 20 else ''}; fix workload.classes.{content.name}.category"
        )
    return replace(dataset, name=f"{dataset.name}:{content.category}", entries=chosen)


def labelled(level: LevelPrompts, name: str) -> LevelPrompts:
    """Every prompt of a class's level labelled with the class (the request names it; records keep it)."""

    def one(ps: PromptSet) -> PromptSet:
        return replace(ps, contents=[name] * len(ps))

    return LevelPrompts(one(level.warmup), [one(s) for s in level.repeats], level.unique)


def mix_level_prompts(parts: dict[str, LevelPrompts], mix: dict[str, float], seed: int, tag: str) -> LevelPrompts:
    """The traffic mix's prompts of one level: each request's class drawn by the mix's shares (seeded by the
    level and set, so every arm sends the same sequence), and then that class's next prompt of the same set.
    Each class's own sets are disjoint, so the mix's are too. `parts` holds every class with a share, each
    labelled (`labelled`) and at least as long per set as the mix's."""
    names = [k for k, w in mix.items() if float(w) > 0]
    weights = [float(mix[k]) for k in names]

    def one(sets: dict[str, PromptSet], set_tag: str) -> PromptSet:
        n = min(len(s) for s in sets.values())
        rng = random.Random(set_seed(seed, f"mix-{tag}-{set_tag}"))
        drawn = rng.choices(names, weights=weights, k=n)
        taken = dict.fromkeys(names, 0)
        picks: list[tuple[str, int]] = []
        for k in drawn:
            picks.append((k, taken[k]))
            taken[k] += 1
        first = sets[names[0]]
        chats = any(s.messages is not None for s in sets.values())

        def messages(s: PromptSet, i: int) -> tuple[dict[str, str], ...]:
            return s.messages[i] if s.messages is not None else ({"role": "user", "content": s.prompts[i]},)

        return PromptSet(
            prompts=[sets[k].prompts[i] for k, i in picks],
            input_tokens=[sets[k].input_tokens[i] for k, i in picks],
            output_tokens=[sets[k].output_tokens[i] for k, i in picks],
            source=MIX,
            tokenizer=first.tokenizer,
            exact=all(s.exact for s in sets.values()),
            seed=seed,
            meta={"tag": set_tag, "mix": dict(zip(names, weights, strict=True))},
            messages=[messages(sets[k], i) for k, i in picks] if chats else None,
            templated=[sets[k].templated[i] for k, i in picks]  # type: ignore[index]
            if all(s.templated is not None for s in sets.values())
            else None,
            dataset={"dataset": MIX, "mix_classes": {k: (sets[k].dataset or {}).get("dataset") for k in names}},
            contents=[k for k, _ in picks],
        )

    need = max(len(s) for p in parts.values() for s in p.repeats)
    for k in names:
        if any(len(s) < need for s in parts[k].repeats) or k not in parts:
            raise ContentError(f"class {k}: its prompt sets are shorter than the mix's ({need})")
    warm = one({k: parts[k].warmup for k in names}, "warmup")
    rounds = len(parts[names[0]].repeats)
    sets = [one({k: parts[k].repeats[r] for k in names}, f"r{r}") for r in range(rounds)]
    return LevelPrompts(warm, sets, unique=all(parts[k].unique for k in names))
