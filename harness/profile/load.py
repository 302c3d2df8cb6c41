"""YAML profiles validated at the edge into the typed objects of harness.profile: an unknown
key, a wrong type or a missing field is a ProfileError naming the file, the key path and what
was expected (docs/profiles.md)."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

from harness import capabilities
from harness.checks import registry
from harness.errors import OracleError, ProfileError, UnknownModelError, unknown
from harness.implementations import SPEECH
from harness.oracle.descriptor import descriptor, has_feature, is_mlx_free, oracles_serving, with_feature
from harness.oracle.pins import comparison_mlx, project_mlx
from harness.paths import REPO_ROOT, profiles_dir
from harness.profile import Profile, Scenario
from harness.profile.bounds import MAX_STEPS
from harness.profile.draft import check_draft_scenario
from harness.profile.inputs import check_wav, read_yaml
from harness.profile.quality import check_quality
from harness.profile.response import check_response_scenario
from harness.profile.speech import check_transcribe_options, check_writer_options
from harness.profile.vad import available_vad_profiles


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return f"a mapping ({tp.__name__})"
    if tp is type(None):
        return "null"
    return {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}.get(tp, str(tp))


def _key_error(key: Any, where: str) -> ProfileError:
    return ProfileError(
        f"{where or '(top level)'}: key {key!r} is not a string ({type(key).__name__}): keys must be strings "
        f"(quote it in the YAML: '{key}')"
    )


def _check_keys(value: Any, where: str, path: tuple[int, ...] = ()) -> None:
    """Every mapping key anywhere under `value` is a string (YAML reads `1:` or `yes:` as an int or a
    bool; sorting, hashing and the JSON a scenario spec becomes all need strings)."""
    if not isinstance(value, dict | list):
        return
    if id(value) in path:
        raise ProfileError(f"{where}: a YAML alias refers to itself (a recursive value); expected plain data")
    path = (*path, id(value))
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise _key_error(key, where)
            _check_keys(item, f"{where}.{key}", path)
    else:
        for i, item in enumerate(value):
            _check_keys(item, f"{where}[{i}]", path)


def _convert(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        _check_keys(value, where)
        return value
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        candidates = [a for a in args if a is not type(None)]
        if len(candidates) == 1:  # Optional[X]: X's own message is the precise one
            return _convert(value, candidates[0], where)
        mappings = [a for a in candidates if dataclasses.is_dataclass(a)]
        if isinstance(value, dict) and len(mappings) == 1:  # the one mapping's own message is the precise one
            return _build(mappings[0], value, where)
        for arg in candidates:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, where)
            except ProfileError:
                continue
        raise ProfileError(f"{where}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise ProfileError(f"{where}: expected one of {_type_name(tp)}, got {value!r}")
    if origin is list:
        if not isinstance(value, list):
            raise ProfileError(f"{where}: expected {_type_name(tp)}, got {value!r}")
        (item_tp,) = typing.get_args(tp)
        return [_convert(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ProfileError(f"{where}: expected a mapping with string keys, got {value!r}")
        for k in value:
            if not isinstance(k, str):
                raise _key_error(k, where)
        _, val_tp = typing.get_args(tp)
        return {k: _convert(v, val_tp, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    raise ProfileError(f"{where}: expected {_type_name(tp)}, got {value!r}")


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a mapping ({cls.__name__}), got {data!r}")
    for k in data:
        if not isinstance(k, str):
            raise _key_error(k, where)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "source_file" and not f.name.startswith("_")}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ProfileError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(fields)}")
    kwargs = {}
    for name, f in fields.items():
        key = f"{where}.{name}" if where else name
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ProfileError(f"{key}: missing required field ({_type_name(hints[name])})")
            continue
        kwargs[name] = _convert(data[name], hints[name], key)
    obj = cls(**kwargs)
    if hasattr(obj, "validate"):
        obj.validate(where)
    return obj


def load_profile(path: Path, scenarios: list[dict[str, Any]] | None = None) -> Profile:
    """Read and validate one profile file; any problem is a ProfileError naming the file.
    `scenarios` (the fuzzer's examples) replace the file's, validated as the file's are."""
    data = read_yaml(path)
    if scenarios is not None and isinstance(data, dict):
        data = {**data, "scenarios": scenarios}
    try:
        profile = _build(Profile, data, "")
        _check_profile(profile)
        capabilities.check_profile(profile)
        profile = _with_needs(_with_oracle_variant(profile))
    except ProfileError as e:
        raise ProfileError(f"{path}: {e}") from None
    if profile.name != path.stem:
        raise ProfileError(f"{path}: name: expected the file's stem {path.stem!r}, got {profile.name!r}")
    return dataclasses.replace(profile, source_file=str(path))


def scenario_from_dict(data: dict[str, Any], where: str) -> Scenario:
    """One scenario mapping as a profile's scenarios are read (its own keys and types only)."""
    return _build(Scenario, data, where)


def _with_needs(profile: Profile) -> Profile:
    """A plug-in is told what its profile's checks need, to refuse at its hello what it does not
    serve (harness/capabilities.py)."""
    plugin = profile.under_test.plugin
    if plugin is None:
        return profile
    return dataclasses.replace(profile, implementation=dataclasses.replace(plugin, _needs=capabilities.needs(profile)))


def _with_oracle_variant(profile: Profile) -> Profile:
    """A profile whose oracle is a variant (`oracle_variant`): one mlx for all its comparisons,
    which its implementation must run too (the one-mlx rule, per comparison): an in-tree one runs
    the project's venv, a plugin is told the version its venv and handshake must have."""
    if profile.oracle_variant is None:
        return profile
    try:
        mlx = comparison_mlx(f"{profile.oracle}@{profile.oracle_variant}")
        versions = {comparison_mlx(profile.oracle_of(s)) for s in profile.scenarios} - {None}
    except OracleError as e:
        raise ProfileError(f"oracle_variant: {e}") from None
    plugin = profile.under_test.plugin
    if plugin is None and mlx is not None and mlx != project_mlx():
        raise ProfileError(
            f"oracle_variant: {profile.oracle}@{profile.oracle_variant} runs mlx {mlx}, {profile.under_test.name} "
            f"the project's mlx {project_mlx()}: bits are compared within one mlx version; gate it as an external "
            f"implementation whose requirements pin mlx=={mlx} (docs/external.md)"
        )
    if len(versions) > 1:
        raise ProfileError(
            f"oracle_variant: its scenarios' oracles run mlx {sorted(versions)}: a profile compares within one mlx"
        )
    if plugin is None:
        return profile
    return dataclasses.replace(profile, implementation=dataclasses.replace(plugin, _comparison_mlx=mlx))


def _check_profile(profile: Profile) -> None:
    if not profile.scenarios:
        raise ProfileError("scenarios: expected at least one scenario")
    if profile.oracle_variant is not None:
        try:
            descriptor(f"{profile.oracle}@{profile.oracle_variant}")
        except OracleError as e:
            raise ProfileError(f"oracle_variant: {e}") from None
    _check_certificate(profile)
    allowed_oracles = oracles_serving(profile.under_test.produces)
    allowed_checks = registry.of(profile.under_test.produces)
    if profile.oracle != allowed_oracles[0]:
        raise ProfileError(
            f"oracle: {profile.under_test.name} is judged by {allowed_oracles[0]!r} (and single scenarios by "
            f"{list(allowed_oracles[1:])} where they say so), got {profile.oracle!r}"
        )
    speech = profile.under_test.produces == SPEECH
    seen: set[str] = set()
    for i, s in enumerate(profile.scenarios):
        where = f"scenarios[{i}]"
        s.validate(where)
        if s.id in seen:
            raise ProfileError(f"{where}.id: duplicate scenario id {s.id!r}")
        seen.add(s.id)
        if not 1 <= profile.steps(s) <= MAX_STEPS:
            raise ProfileError(f"{where}.steps: expected an integer in [1, {MAX_STEPS}], got {profile.steps(s)}")
        if speech != (s.kind == "transcribe"):
            raise ProfileError(
                f"{where}: a {profile.under_test.name} profile takes "
                + ("'audio' scenarios" if speech else "prompt / messages / turns / batch scenarios")
            )
        if descriptor(profile.oracle_of(s)).base not in allowed_oracles:
            raise ProfileError(
                f"{where}.oracle: {profile.under_test.name} cannot be judged by {profile.oracle_of(s)!r}"
            )
        bad = [c for c in profile.checks(s) if c not in allowed_checks]
        if bad:
            raise ProfileError(
                f"{where}.checks: {bad} do not apply to {profile.under_test.name}; allowed: {list(allowed_checks)}"
            )
        for j, entry in enumerate(s.exercises):
            _check_exercise(profile, s, entry, f"{where}.exercises[{j}]")
        for name in allowed_checks:  # each row says where it applies and which scenario asks for it
            row = registry.get(name)
            scope = row.applies if name in profile.checks(s) else row.wanted
            why = scope(profile, s) if scope is not None else None
            if why is not None:
                raise ProfileError(f"{where}{why}")
        if s.stop is not None and (s.kind not in ("plain", "chat") or s.turns or s.composition):
            raise ProfileError(f"{where}.stop: only plain and chat scenarios stop at EOS (as mlx-lm's generate)")
        if s.stop is not None and not has_feature(profile.oracle_of(s), "stop"):
            raise ProfileError(
                f"{where}.stop: judged against {' or '.join(with_feature('stop'))}'s stream_generate, "
                f"not {profile.oracle_of(s)}"
            )
        check_draft_scenario(profile, s, where)
        if s.composition is not None and not speech:
            from models.universal.composed import CompositionError, parse_composition

            try:
                parse_composition(s.composition)
            except CompositionError as e:
                raise ProfileError(f"{where}.composition: {e}") from None
        if s.composition is not None and speech and not profile.intree_composition(s):
            raise ProfileError(
                f"{where}.composition.kind: {s.composition['kind']!r} is not a {profile.under_test.name} composition; "
                f"known: {list(profile.under_test.compositions)}"
            )
        if is_mlx_free(profile.oracle_of(s)):
            bad = [c for c in profile.checks(s) if registry.get(c).judges != "tokens"]
            if bad:
                raise ProfileError(
                    f"{where}.checks: {bad} compare MLX bits, which {profile.oracle_of(s)} (PyTorch) does not "
                    f"compute; allowed: {registry.judged_on('tokens')}"
                )
        check_response_scenario(s, profile.checks(s), profile.oracle_of(s), where)
        check_writer_options(s.writer_options, f"{where}.writer_options")
        if speech:
            check_transcribe_options(s.options, f"{where}.options")
        if s.stream_chunks is not None and (not s.stream_chunks or any(c * 16000 < 1 for c in s.stream_chunks)):
            raise ProfileError(
                f"{where}.stream_chunks: expected seconds of at least one 16 kHz sample, got {s.stream_chunks}"
            )
        if s.audio is not None:
            audio = (REPO_ROOT / s.audio).resolve()
            if Path(s.audio).is_absolute() or not audio.is_file():
                raise ProfileError(
                    f"{where}.audio: expected a WAV file path relative to the repository, {audio} is not one"
                )
            if not audio.is_relative_to(REPO_ROOT.resolve()):
                raise ProfileError(
                    f"{where}.audio: {s.audio!r} resolves to {audio}, outside the repository {REPO_ROOT}: "
                    "fixtures live in the repository (its hash goes into the scenario's)"
                )
            check_wav(audio, f"{where}.audio", s.audio)
    for i, defect in enumerate(profile.oracle_defects):
        missing = {"oracle", "path", "symptom", "seen"} - set(defect)
        if missing:
            raise ProfileError(f"oracle_defects[{i}]: missing {sorted(missing)} (oracle, path, symptom, seen)")
    if speech:
        check_transcribe_options(profile.defaults.options, "defaults.options")
    profile.artifact.validate("artifact")
    check_quality(profile)


# Transcribe options that count something (mlx-whisper's DecodingOptions): at least one.


def _check_certificate(profile: Profile) -> None:
    """A certificate runs the original file in its own runtime (a one-piece CTranslate2 model or
    GGUF), on greedy transcriptions (their first window) or plain/chat prompts, judged by the
    profile's own oracle."""
    spec = profile.certificate
    if spec is None:
        return
    source = {"ctranslate2": "pypi-ct2", "llama-cpp": "pypi-gguf"}[spec.runtime]
    if profile.artifact.source != source or profile.artifact.parts:
        raise ProfileError(f"certificate.runtime: {spec.runtime} runs a one-piece {source} artifact, not this one")
    ids = {s.id: s for s in profile.scenarios}
    for i, scenario_id in enumerate(spec.scenarios):
        s = ids.get(scenario_id)
        where = f"certificate.scenarios[{i}]"
        if s is None:
            raise ProfileError(f"{where}: no scenario {scenario_id!r} in this profile")
        options = profile.defaults.options | s.options
        greedy = options.get("temperature") in (0, [0]) and options.get("beam_size") is None  # no default ladder
        if s.kind in ("plain", "chat"):  # an LLM's: one prompt, no composition or cache option, no draft
            greedy = all(getattr(s, k) is None for k in ("draft", "response", "kv_bits", "max_kv_size", "stop"))
        plain = s.kind in ("transcribe", "plain", "chat") and s.composition is None and greedy
        if not plain or profile.oracle_of(s).partition("@")[0] != profile.oracle:  # its own, or its variant
            raise ProfileError(
                f"{where}: {scenario_id} must be a plain greedy transcription (temperature 0, no beam) or a "
                f"plain/chat prompt, judged by {profile.oracle}"
            )


def _check_exercise(profile: Profile, s: Any, entry: str, where: str) -> None:
    """ "check: path": a check of the scenario that declares exercises, and one of its paths."""
    check, _, path = (part.strip() for part in entry.partition(":"))
    declaring = [c for c in profile.checks(s) if registry.get(c).exercises is not None]
    if check not in declaring:
        raise ProfileError(f"{where}: {entry!r}: expected 'check: path' with a check of the scenario among {declaring}")
    paths = registry.get(check).exercises.declared(profile)
    if path not in paths:
        raise ProfileError(f"{where}: {entry!r}: {check} declares no path {path!r} here; its paths: {paths}")


# Profiles of implementations nobody here wrote, beside ours (docs/external.md); one namespace.
EXTERNAL = "external"


def available_profiles(directory: Path | None = None) -> dict[str, Path]:
    directory = directory or profiles_dir()
    found = {p.stem: p for p in sorted(directory.glob("*.yaml"))}
    for path in sorted((directory / EXTERNAL).glob("*.yaml")):
        if path.stem in found:
            raise ProfileError(f"{path}: another profile is named {path.stem!r} already: {found[path.stem]}")
        found[path.stem] = path
    return found


def nightly_models() -> list[str]:
    """What `make nightly` and the nightly CPU matrix run: every profile with a scenario the CPU
    backend runs, unless it says `nightly: false`, then every VAD profile."""
    names = []
    for name, path in available_profiles().items():
        profile = load_profile(path)
        if profile.nightly and profile.active_scenarios("cpu"):
            names.append(name)
    return names + list(available_vad_profiles())


def find_profile(name: str, directory: Path | None = None) -> Profile:
    known = available_profiles(directory)
    if name not in known:
        raise UnknownModelError(
            f"{unknown(name, known, 'model', 'known models')} (no profile {name}.yaml in {directory or profiles_dir()})"
        )
    return load_profile(known[name])
