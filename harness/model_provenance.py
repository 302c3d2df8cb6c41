"""What a report says about a model's run: artifact (real or twin), oracle, goldens' hashes."""

from __future__ import annotations

from typing import Any

from harness.errors import HarnessError
from harness.oracle.venvs import oracle_pins_hash
from harness.paths import shown
from harness.provenance import device_facts
from harness.session import ParitySession


def model_provenance(name: str) -> dict[str, Any]:
    """What a report says about a model's run: artifact (real or twin), oracle, goldens' hashes.

    Reads tracked manifests only (no blobs, no oracle), so the reporting process can call it.
    """
    from harness.goldens.vad import vad_model_provenance
    from harness.profile.vad import available_vad_profiles

    if name in available_vad_profiles():
        return vad_model_provenance(name)
    session = ParitySession()
    try:
        profile = session.profile(name)
        artifact = session.artifact(profile)
    except HarnessError as e:
        return {"error": str(e)}
    goldens = {}
    for scenario in profile.active_scenarios(device_facts().backend):
        try:
            store = session.store(profile.oracle_of(scenario))
        except HarnessError as e:
            goldens[scenario.id] = {"error": str(e)}
            continue
        path = store.manifest_path(profile.name, scenario.id)
        try:
            manifest = store.read_manifest(profile.name, scenario.id) or {}
        except HarnessError as e:  # the check itself reports it; the report is still written
            goldens[scenario.id] = {"manifest": str(path), "error": str(e)}
            continue
        goldens[scenario.id] = {
            "manifest": shown(path),
            "tier": profile.tier_of(scenario),
            "oracle": profile.oracle_of(scenario),
            "blobs": {k: v["sha256"] for k, v in manifest.get("blobs", {}).items()},
            "oracle_environment": manifest.get("oracle_environment", {}),
        }
    return {
        "implementation": implementation_provenance(profile),
        "tier": profile.tier,
        "oracle": profile.oracle,
        "oracle_pins_hash": oracle_pins_hash(profile.oracle),
        "oracles": {
            oracle: oracle_pins_hash(oracle) for oracle in sorted({profile.oracle_of(s) for s in profile.scenarios})
        },
        "artifact": artifact.provenance(),
        "ran_twin": "twin" in artifact.identity,
        "oracle_defects": profile.oracle_defects,
        "goldens": goldens,
    }


def implementation_provenance(profile: Any) -> dict[str, Any]:
    """The implementation under test: in-tree (by name), or a plugin with what its venv is built from."""
    from harness.oracle.plugin import plugin_pins

    plugin = profile.under_test.plugin
    if plugin is None:
        return {"name": profile.under_test.name, "in_tree": True}
    facts: dict[str, Any] = {"name": plugin.label, "in_tree": False}
    facts |= {"command": plugin.command} if plugin.command is not None else {"python": plugin.python}
    if plugin.requirements:
        pins, digest = plugin_pins(plugin.label, plugin.requirements)
        facts |= {"pins_hash": digest, "requirements": [line for line in pins.splitlines() if line]}
    return facts


def with_hellos(provenance: dict, rows) -> dict:
    """Each plug-in implementation's hello (name, version, environment: docs/protocol.md says
    they are for reports) beside its profile's implementation facts, from the rows that ran it."""
    for row in rows:
        hello = row.details.get("implementation_hello") if isinstance(row.details, dict) else None
        facts = provenance.get(row.model, {}).get("implementation") if hello else None
        if isinstance(facts, dict) and "hello" not in facts:
            facts["hello"] = hello
    return provenance
