"""``kvtrace policies``: the presets and the knob table (:mod:`replay.knobs`)."""

from __future__ import annotations

import json

import click


def policies_info() -> dict:
    """The ``--json`` object: presets (knob values and help) and every knob."""
    from replay import knobs

    return {"presets": {name: {"knobs": values, "help": knobs.PRESET_HELP[name] if name in knobs.PRESET_HELP else _step_help(name)}
                        for name, values in knobs.PRESETS.items()},
            "knobs": [k.as_dict() for k in knobs.KNOBS],
            "aliases": {a: t for a, (t, _) in knobs.ALIASES.items()}}


def _step_help(name: str) -> str:
    if name.startswith("baseline+"):
        return f"baseline with one fix: {name.split('+', 1)[1]}"
    from replay import knobs

    fixed = name.removeprefix("swa-fixes-")
    knob, (pre, _) = next((k, v) for k, v in knobs.FIXES.items() if v[1] == fixed)
    return f"swa-fixes without the {fixed} fix: {knob}={pre}"


@click.command("policies")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def policies(as_json: bool) -> None:
    """List the policy presets and every knob (name, values, default, upstream change, help).

    Use a preset with `kvtrace replay --policy NAME` and override knobs with `--set knob=value`.
    """
    info = policies_info()
    if as_json:
        click.echo(json.dumps(info, indent=1, default=str))
        return
    click.echo("presets:")
    for name, p in info["presets"].items():
        click.echo(f"  {name:<44} {p['help']}")
    for group, title in (("policy", "policy knobs"), ("size", "sizes"), ("sim", "replay settings")):
        click.echo(f"\n{title}:")
        for k in info["knobs"]:
            if k["group"] != group:
                continue
            values = "|".join(map(str, k["values"])) or k["type"]
            if k["plugin"]:
                values += "|pkg.mod:Class"
            refused = "; ".join(f"not on {b}: {', '.join(v)}" for b, v in k["refused"].items() if v)
            click.echo(f"  {k['name']:<30} {values}  (default {k['default']})")
            click.echo(f"  {'':<30} {k['help']}" + (f" [{k['upstream']}]" if k["upstream"] else "")
                       + (f" ({refused})" if refused else ""))
