"""Workload files read into entries: the prompt (or chat messages), the reference answer, the output length.

Nothing is downloaded: `workload.dataset.path` names a local file. Formats:
- `prompts-jsonl`: one `{"prompt": "...", "output_tokens": N?}` per line;
- `sharegpt`: a JSON array of `{"id"?, "conversations": [{"from": "human"|"gpt"|"system", "value": "..."}]}`;
  `chat: first_turn` (default) sends the first human turn as one user message, `chat: history` the whole
  conversation up to its last human turn (human -> user, gpt -> assistant, system -> system); the reference
  answer is the gpt turn after the human turn sent;
- `mtbench`: JSONL of `{"question_id", "category"?, "turns": ["...", ...], "reference"?: ["...", ...]}`: the
  first turn as the user message, the reference answer `reference[0]`;
- `chat-jsonl`: JSONL of `{"messages": [{"role": "system"|"user"|"assistant", "content": "..."}],
  "reference"?: "...", "output_tokens"?: N}` ending with a user message;
- `speed-bench`: NVIDIA's SPEED-Bench rows, `{"question_id", "category", "sub_category"?, "turns": ["...", ...],
  "source"?, "difficulty"?, "multiturn"?}`, from a `.jsonl` or `.parquet` file (by its extension): the first turn
  as the user message, no reference answer. SPEED-Bench is the public Hugging Face dataset `nvidia/SPEED-Bench`;
  its "qualitative" split holds 880 prompts in 11 categories of 80. Download it yourself (specsweep never
  downloads), e.g. `huggingface-cli download nvidia/SPEED-Bench --repo-type dataset`, and check the dataset
  card for the current file layout;
- `chat-log`: a production request log, one JSON line per request: `{"messages": [...], "category"?, "class"?,
  "max_tokens"?, ...}` or the request nested, `{"request": {"messages": [...], "max_tokens"?}, "response"?}`.
  OpenAI chat messages (content a string or a list of text parts; `developer` read as system); a trailing
  assistant message is the logged answer: the reference, not sent. `max_tokens` (or `max_completion_tokens`)
  becomes the entry's output_tokens; other fields (ids, timestamps, users) are ignored.

`Entry.category` is the entry's content class where the format has one (mtbench's and SPEED-Bench's
`category`, a chat log's `category` or `class`): a stripped string, None where absent or blank.

Every error names the file, the line (JSONL), array index (sharegpt) or row (parquet, from 0 as pandas'
`iloc`), the field and the fix: a bad file stops the run at config validation, before any server starts
(`config._check_semantics`, and `cell.run_cell`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMATS = ("prompts-jsonl", "sharegpt", "mtbench", "chat-jsonl", "speed-bench", "chat-log")
CHAT_MODES = ("first_turn", "history")
Message = dict[str, str]
# ShareGPT's speakers, with the aliases public dumps use (user, and the assistants' product names)
_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "system": "system",
}
_CHAT_ROLES = ("system", "user", "assistant")
# a chat log's roles: OpenAI's `developer` is the newer name of the system message
_LOG_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_LOG_TOOL_FIX = "drop the logged requests with tool messages or tool calls (only plain chat is replayed)"
_SPEED_BENCH_SUFFIXES = (".jsonl", ".parquet")


class DatasetError(ValueError):
    """A workload file that cannot be read; the message names the file, the place, the field and the fix."""


@dataclass(frozen=True)
class Entry:
    """One request's content: chat messages ending with a user message (a plain prompt is one user message)."""

    messages: tuple[Message, ...]
    reference: str | None  # the reference answer, where the format has one
    output_tokens: int | None  # the entry's own output length (takes precedence over workload.output_tokens)
    where: str  # "file:line", "file[index]" or "file row N", for error messages
    category: str | None = None  # the content class, where the format has one (stripped; None where absent)

    @property
    def single_turn(self) -> bool:
        """One user message: sendable as plain text to a completions endpoint."""
        return len(self.messages) == 1

    @property
    def text(self) -> str:
        """The plain prompt (single-turn entries), else the contents joined: only a token estimate then."""
        return "\n\n".join(m["content"] for m in self.messages)


@dataclass(frozen=True)
class Dataset:
    """A read workload file: its entries and what identifies it in every summary."""

    path: str
    format: str
    name: str
    chat: str | None
    sha256: str
    entries: tuple[Entry, ...]

    @property
    def conversational(self) -> bool:
        """Some entry holds more than one message: only a chat template turns it into the model's input."""
        return any(not e.single_turn for e in self.entries)

    def describe(self) -> dict[str, Any]:
        """The summary's dataset facts (through PromptSet.describe)."""
        return {
            "dataset": self.name,
            "dataset_format": self.format,
            "dataset_path": self.path,
            "dataset_chat": self.chat,
            "dataset_sha256": self.sha256,
            "dataset_entries": len(self.entries),
        }


def file_sha256(path: Path) -> str:
    """sha256 of the file's bytes: the same file gives the same hash wherever it lies."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_dataset(path: str | Path, fmt: str, name: str | None = None, chat: str | None = None) -> Dataset:
    """Read and check a workload file (a relative path resolves from the working directory, as Snakemake runs).

    Raises DatasetError naming the file, the line or index, the field and the fix."""
    p = Path(path)
    if fmt not in FORMATS:
        raise DatasetError(f"unknown dataset format {fmt!r}; use one of {', '.join(FORMATS)}")
    if chat is not None and fmt != "sharegpt":
        raise DatasetError(f"{p}: 'chat: {chat}' applies to the sharegpt format only; drop workload.dataset.chat")
    if chat is not None and chat not in CHAT_MODES:
        raise DatasetError(f"{p}: unknown chat mode {chat!r}; use one of {', '.join(CHAT_MODES)}")
    if not p.is_file():
        raise DatasetError(
            f"dataset file {p} does not exist (relative paths resolve from {Path.cwd()}); fix workload.dataset.path"
        )
    mode = None
    if fmt == "sharegpt":
        mode = chat or "first_turn"
        entries = [_sharegpt_entry(obj, f"{p}[{i}]", mode) for i, obj in _json_array(p)]
    elif fmt == "speed-bench" and _speed_bench_suffix(p) == ".parquet":
        entries = [_speed_bench_entry(obj, f"{p} row {i}") for i, obj in _parquet_rows(p)]
    else:
        read = {
            "prompts-jsonl": _prompts_entry,
            "mtbench": _mtbench_entry,
            "chat-jsonl": _chat_entry,
            "speed-bench": _speed_bench_entry,
            "chat-log": _chat_log_entry,
        }[fmt]
        entries = [read(obj, f"{p}:{n}") for n, obj in _jsonl_objects(p)]
    if not entries:
        raise DatasetError(f"{p}: no entries; a {fmt} file needs at least one (see docs/metrics.md, 'Workloads')")
    return Dataset(str(p), fmt, name or p.stem, mode, file_sha256(p), tuple(entries))


def _read_text(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(f"{p}: not UTF-8 text ({e}); a dataset is a UTF-8 JSON or JSONL file") from None


def _jsonl_objects(p: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) per non-blank line."""
    for n, line in enumerate(_read_text(p).split("\n"), 1):  # not splitlines: U+2028 may sit inside a string
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise DatasetError(f"{p}:{n}: not JSON ({e}); a JSONL file holds one JSON object per line") from None
        if not isinstance(obj, dict):
            raise DatasetError(f"{p}:{n}: a {type(obj).__name__}, not a JSON object; write one object per line")
        yield n, obj


def _json_array(p: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(index, object) per element of a JSON array file."""
    text = _read_text(p)
    try:
        data = json.loads(text)
    except ValueError as e:
        raise DatasetError(f"{p}: not JSON ({e}); a sharegpt file is one JSON array of conversations") from None
    if not isinstance(data, list):
        raise DatasetError(f"{p}: a JSON {type(data).__name__}, not an array; a sharegpt file is a JSON array")
    for i, obj in enumerate(data):
        if not isinstance(obj, dict):
            raise DatasetError(f"{p}[{i}]: a {type(obj).__name__}, not an object with 'conversations'")
        yield i, obj


def _speed_bench_suffix(p: Path) -> str:
    """SPEED-Bench ships as JSONL or Parquet; the extension says which reader, so a misnamed file fails here."""
    suffix = p.suffix.lower()
    if suffix not in _SPEED_BENCH_SUFFIXES:
        raise DatasetError(
            f"{p}: a speed-bench file must end in .jsonl or .parquet (its extension picks the reader), not "
            f"{suffix or 'no extension'}; rename or convert the file and fix workload.dataset.path"
        )
    return suffix


def _parquet_rows(p: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row index from 0, row) per Parquet row; a null is an absent field, as a JSONL line would leave it out."""
    import pyarrow.parquet as pq  # imported here: config validation of other formats stays light

    try:
        rows = pq.read_table(p).to_pylist()
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise DatasetError(f"{p}: not a readable Parquet file ({e}); give a .parquet table or a .jsonl file") from None
    for i, row in enumerate(rows):
        yield i, {k: v for k, v in row.items() if v is not None}


def _plain(value: Any) -> Any:
    """numpy arrays and scalars (a Parquet list column read through pandas) as Python lists and scalars."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return value.tolist()
    return value


def _field(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str, fix: str) -> Any:
    """obj[key] of the expected type, else an error naming the place, the field and the fix."""
    if key not in obj:
        raise DatasetError(f"{where}: missing field '{key}'; {fix}")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise DatasetError(f"{where}: field '{key}' is a {type(value).__name__}, not a {names}; {fix}")
    return value


def _text(value: Any, where: str, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise DatasetError(f"{where}: field '{key}' must be a non-empty string; fix or drop the entry")
    return value


def _output_tokens(obj: dict[str, Any], where: str) -> int | None:
    if obj.get("output_tokens") is None:
        return None
    n = _field(obj, "output_tokens", int, where, "give a positive integer or drop the field")
    if n < 1:
        raise DatasetError(f"{where}: field 'output_tokens' is {n}; give a positive integer or drop the field")
    return int(n)


def _user(text: str) -> tuple[Message, ...]:
    return ({"role": "user", "content": text},)


def _category(obj: dict[str, Any], where: str, keys: tuple[str, ...] = ("category",)) -> str | None:
    """The first of `keys` present, stripped (a class name compares as plain text); None where absent or blank."""
    for key in keys:
        if obj.get(key) is None:
            continue
        value = _field(obj, key, str, where, f"give '{key}' as a string (the content class) or drop it")
        return value.strip() or None
    return None


def _prompts_entry(obj: dict[str, Any], where: str) -> Entry:
    prompt = _field(obj, "prompt", str, where, 'write {"prompt": "...", "output_tokens": N?}')
    return Entry(_user(_text(prompt, where, "prompt")), None, _output_tokens(obj, where), where)


def _mtbench_entry(obj: dict[str, Any], where: str) -> Entry:
    _field(obj, "question_id", (int, str), where, 'write {"question_id": ..., "turns": ["..."]}')
    turns = _field(obj, "turns", list, where, 'write "turns": ["first question", ...]')
    if not turns:
        raise DatasetError(f"{where}: field 'turns' is empty; give at least the first question")
    reference = obj.get("reference")
    if reference is not None:
        ref = _field(obj, "reference", list, where, 'write "reference": ["answer to turn 1", ...] or drop it')
        reference = _text(ref[0], where, "reference[0]") if ref else None
    first = _text(turns[0], where, "turns[0]")
    return Entry(_user(first), reference, _output_tokens(obj, where), where, _category(obj, where))


def _speed_bench_entry(obj: dict[str, Any], where: str) -> Entry:
    """A SPEED-Bench row: its first turn, sent as mtbench's is, and its category (the content class)."""
    obj = {k: _plain(v) for k, v in obj.items()}
    _field(obj, "question_id", (int, str), where, "give each row its 'question_id' (a string or an integer)")
    category = _field(obj, "category", str, where, "give each row its 'category' (the content class, a string)")
    if not category.strip():
        raise DatasetError(f"{where}: field 'category' is blank; give each row its content class or drop the row")
    turns = _field(obj, "turns", list, where, 'give each row "turns": ["first user turn", ...]')
    if not turns:
        raise DatasetError(f"{where}: field 'turns' is empty; give at least the first user turn or drop the row")
    first = _text(turns[0], where, "turns[0]")
    return Entry(_user(first), None, _output_tokens(obj, where), where, category.strip())


def _chat_entry(obj: dict[str, Any], where: str) -> Entry:
    fix = 'write "messages": [{"role": "user", "content": "..."}]'
    raw = _field(obj, "messages", list, where, fix)
    messages = []
    for j, m in enumerate(raw):
        at = f"{where} messages[{j}]"
        if not isinstance(m, dict):
            raise DatasetError(f"{at}: a {type(m).__name__}, not an object with 'role' and 'content'")
        role = _field(m, "role", str, at, f"use one of {', '.join(_CHAT_ROLES)}")
        if role not in _CHAT_ROLES:
            raise DatasetError(f"{at}: field 'role' is {role!r}; use one of {', '.join(_CHAT_ROLES)}")
        messages.append({"role": role, "content": _text(m.get("content"), at, "content")})
    if not messages or messages[-1]["role"] != "user":
        raise DatasetError(f"{where}: field 'messages' must end with a user message (the turn to answer)")
    reference = obj.get("reference")
    if reference is not None:
        reference = _text(reference, where, "reference")
    return Entry(tuple(messages), reference, _output_tokens(obj, where), where)


def _log_content(m: dict[str, Any], at: str) -> str:
    """A logged message's text: a string, or OpenAI's list of parts with the text parts joined."""
    content = m.get("content")
    if not isinstance(content, list):
        return _text(content, at, "content")
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind != "text":
            raise DatasetError(
                f"{at}: field 'content[{k}]' is a {kind!r} part; only text is supported: drop the line or its "
                "non-text parts"
            )
        texts.append(_field(part, "text", str, f"{at} content[{k}]", "give the text part its 'text' string"))
    return _text("\n".join(texts), at, "content")


def _log_output_tokens(request: dict[str, Any], where: str) -> int | None:
    """The logged request's own cap: max_completion_tokens (OpenAI's current name), else max_tokens."""
    for key in ("max_completion_tokens", "max_tokens"):
        if request.get(key) is None:
            continue
        n = _field(request, key, int, where, "give a positive integer or drop the field")
        if n < 1:
            raise DatasetError(f"{where}: field '{key}' is {n}; give a positive integer or drop the field")
        return int(n)
    return None


def _chat_log_entry(obj: dict[str, Any], where: str) -> Entry:
    """A logged request: its messages up to the last user turn; a trailing logged answer is the reference."""
    request = obj
    if obj.get("request") is not None:
        request = _field(obj, "request", dict, where, 'nest the logged request as "request": {"messages": [...]}')
    raw = _field(request, "messages", list, where, 'log each request as {"messages": [{"role": "user", ...}]}')
    roles = ", ".join(_LOG_ROLES)
    messages = []
    for j, m in enumerate(raw):
        at = f"{where} messages[{j}]"
        if not isinstance(m, dict):
            raise DatasetError(f"{at}: a {type(m).__name__}, not an object with 'role' and 'content'")
        role = _field(m, "role", str, at, f"use one of {roles}")
        if role in ("tool", "function") or m.get("tool_calls") or m.get("function_call"):
            raise DatasetError(f"{at}: a tool message or tool call; {_LOG_TOOL_FIX}")
        if role not in _LOG_ROLES:
            raise DatasetError(f"{at}: field 'role' is {role!r}; use one of {roles}")
        messages.append({"role": _LOG_ROLES[role], "content": _log_content(m, at)})
    reference = None
    if messages and messages[-1]["role"] == "assistant":
        reference = messages.pop()["content"]
    if not messages or messages[-1]["role"] != "user":
        raise DatasetError(
            f"{where}: field 'messages' must end with a user message (the turn to answer), or with one logged "
            "assistant answer after it; fix or drop the line"
        )
    category = _category(obj, where, ("category", "class"))
    if category is None and request is not obj:
        category = _category(request, where, ("category", "class"))
    return Entry(tuple(messages), reference, _log_output_tokens(request, where), where, category)


def _sharegpt_entry(obj: dict[str, Any], where: str, mode: str) -> Entry:
    turns = _field(obj, "conversations", list, where, 'write "conversations": [{"from": "human", "value": "..."}]')
    messages = []
    for j, t in enumerate(turns):
        at = f"{where} conversations[{j}]"
        if not isinstance(t, dict):
            raise DatasetError(f"{at}: a {type(t).__name__}, not an object with 'from' and 'value'")
        who = _field(t, "from", str, at, f"use one of {', '.join(_SHAREGPT_ROLES)}")
        if who not in _SHAREGPT_ROLES:
            raise DatasetError(f"{at}: field 'from' is {who!r}; use one of {', '.join(_SHAREGPT_ROLES)}")
        messages.append({"role": _SHAREGPT_ROLES[who], "content": _text(t.get("value"), at, "value")})
    users = [j for j, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        raise DatasetError(f"{where}: field 'conversations' has no human turn; drop the conversation")
    if mode == "first_turn":
        ask = users[0]
        sent: tuple[Message, ...] = (messages[ask],)
    else:
        ask = users[-1]
        sent = tuple(messages[: ask + 1])
    after = messages[ask + 1] if ask + 1 < len(messages) else None
    reference = after["content"] if after is not None and after["role"] == "assistant" else None
    return Entry(sent, reference, _output_tokens(obj, where), where)


def check_reference_lengths(dataset: Dataset) -> None:
    """`output_tokens: {reference: ...}` needs a reference answer in every entry without its own length."""
    for e in dataset.entries:
        if e.output_tokens is None and e.reference is None:
            field = {
                "sharegpt": "conversations (a gpt turn after the human turn sent)",
                "mtbench": "reference",
                "chat-jsonl": "reference",
                "chat-log": "logged answer (an assistant message ending 'messages') or max_tokens",
                "speed-bench": "output_tokens (SPEED-Bench has no reference answers)",
                "prompts-jsonl": "output_tokens (this format has no reference answers)",
            }[dataset.format]
            raise DatasetError(
                f"{e.where}: workload.output_tokens is {{reference: ...}} and the entry has no {field}; add it, give "
                "the entry its own output_tokens, or set workload.output_tokens to a number or {uniform: [lo, hi]}"
            )
