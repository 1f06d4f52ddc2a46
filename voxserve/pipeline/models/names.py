"""What a request's `model` means: the names of settings.models and of the default engines.

Apart from the table (table.py) because it is pure: it reads the settings (and, once the
defaults are loaded, the default ASR's own model name) and loads nothing, so /v1/models,
the config check at startup and a request's refusal (`unknown_model`) need no engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from voxserve.config import ModelSpec, Settings
from voxserve.engines.loaded import Engines
from voxserve.engines.registry import (
    EngineConfigError,
    EngineNotFound,
    check_options,
    engine_class,
    option_names,
)
from voxserve.errors import ErrorCode, VoxError, quoted

ModelKind = Literal["asr", "tts"]

# OpenAI's model names, which mean the default engines so the official SDK works unchanged
# (unless a [models] entry claims one). The SDK's AudioModel names but
# `gpt-4o-transcribe-diarize`, whose point (speakers, `diarized_json`) the engines lack.
OPENAI_TTS_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15")
OPENAI_ASR_MODELS = (
    "whisper-1",
    "gpt-transcribe",
    "gpt-4o-transcribe",
    "gpt-4o-mini-transcribe",
    "gpt-4o-mini-transcribe-2025-12-15",
)
NAMED_OPTIONS = ("model", "voice")  # the option an entry's name fills when it is not set


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """A name a request may give: a configured model, or one of the defaults."""

    name: str
    kind: ModelKind
    engine: str
    options: Mapping[str, Any] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    default: bool = False

    def engine_model(self) -> str:
        """The weights the name runs on, as configured (before loading)."""
        for key in (*NAMED_OPTIONS, "model_path"):
            if key in self.options:
                return str(self.options[key])
        return self.name


def named_entries(specs: Mapping[str, ModelSpec]) -> dict[str, ModelEntry]:
    return {
        name: ModelEntry(
            name, spec.kind, spec.engine_name(), dict(spec.options), tuple(spec.aliases)
        )
        for name, spec in specs.items()
    }


def filled_options(entry: ModelEntry, cls: Any) -> dict[str, Any]:
    """The entry's options, its name given as the first of NAMED_OPTIONS the engine takes
    when that is not set (`[models.named."small.en"]` alone is Whisper small.en)."""
    options = dict(entry.options)
    takes = option_names(cls) or []
    for key in NAMED_OPTIONS:
        if key in takes:
            options.setdefault(key, entry.name)
            break
    return options


class ModelNames:
    """The defaults' names and the configured models' (names and aliases), by kind."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.named = named_entries(settings.models.named)
        self._labels: dict[tuple[ModelKind, str], str] = {}
        for entry in self.named.values():
            for label in (entry.name, *entry.aliases):
                self._labels[(entry.kind, label)] = entry.name
        self.defaults: dict[ModelKind, ModelEntry] = {}
        self._default_labels: dict[ModelKind, set[str]] = {"asr": set(), "tts": set()}
        self.bind_defaults(None)

    def bind_defaults(self, engines: Engines | None) -> None:
        """The names that mean the default engines: the OpenAI names, the engine names, and
        (once loaded) the default ASR's own model name (`tiny.en`, which Realtime reports)."""
        cfg = self.settings.engines
        asr_labels = {*OPENAI_ASR_MODELS, cfg.asr.name, "whisper"}
        tts_labels = {*OPENAI_TTS_MODELS, *(spec.name for spec in cfg.tts)}
        asr_model = ""
        if engines is not None:
            asr_model = engines.asr.info.model or ""
            if asr_model:
                asr_labels.add(asr_model)
        tts_name = cfg.tts[0].name if cfg.tts else "tts"
        self.defaults = {
            "asr": ModelEntry(cfg.asr.name, "asr", cfg.asr.name, dict(cfg.asr.options),
                              tuple(sorted(asr_labels - {cfg.asr.name})), default=True),
            "tts": ModelEntry(tts_name, "tts", tts_name, {}, tuple(sorted(tts_labels)),
                              default=True),
        }  # fmt: skip
        self._default_labels = {"asr": asr_labels, "tts": tts_labels}
        # An entry configured as the default ASR itself is the default, not a second copy.
        same = dict(cfg.asr.options)
        if asr_model:
            same.setdefault("model", asr_model)
        for entry in self.named.values():
            if (
                entry.kind == "asr"
                and entry.engine == cfg.asr.name
                and dict(entry.options, model=entry.engine_model()) == same
            ):
                self.named[entry.name] = replace(entry, default=True)

    def entry(self, kind: ModelKind, name: str | None) -> ModelEntry:
        """What a request's `model` means (None or "": the default). Loads nothing.
        Unknown: `unknown_model`, listing the names `kind` serves."""
        if not name:
            return self.defaults[kind]
        found = self._labels.get((kind, name))
        if found is not None:
            entry = self.named[found]
            return self.defaults[kind] if entry.default else entry
        if name in self._default_labels[kind] or name == self.defaults[kind].name:
            return self.defaults[kind]
        valid = ", ".join(self.names(kind))
        raise VoxError(
            ErrorCode.UNKNOWN_MODEL, f"unknown {kind} model {quoted(name)}; valid models: {valid}"
        )

    def names(self, kind: ModelKind | None = None) -> list[str]:
        """Every name a request may give for `kind` (all kinds: None), sorted."""
        out: set[str] = set()
        for k in ("asr", "tts"):
            if kind in (None, k):
                out |= self._default_labels[k] | {self.defaults[k].name}
                out |= {label for (lk, label) in self._labels if lk == k}
        return sorted(out)

    def entries(self) -> list[ModelEntry]:
        """The defaults, then the configured models (for /v1/models); a configured one that
        is the default ASR itself says so (`default`)."""
        return [self.defaults["asr"], self.defaults["tts"], *self.named.values()]

    def check(self) -> None:
        """Every entry's engine exists and takes its options (the signature only: nothing is
        loaded): EngineConfigError, so `serve` stops with one line, exit 2."""
        for entry in self.named.values():
            where = f"[models.named.{entry.name}]"
            try:
                cls = engine_class(entry.kind, entry.engine)
            except (EngineNotFound, ImportError) as exc:
                raise EngineConfigError(entry.kind, entry.engine, f"{where}: {exc}") from None
            try:
                check_options(entry.kind, entry.engine, cls, filled_options(entry, cls))
            except EngineConfigError as exc:
                raise EngineConfigError(entry.kind, entry.engine, f"{where}: {exc}") from None
