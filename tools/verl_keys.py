"""The table of verl's configuration keys in docs/configuration.md: which this
configuration takes, and for each whether it works (read), only tunes something a run may
not use (a notice), is refused (and why), or has another default than verl's.

    .venv/bin/python tools/verl_keys.py            # print the section
    .venv/bin/python tools/verl_keys.py --write    # replace it in docs/configuration.md
    .venv/bin/python tools/verl_keys.py --check    # exit 1 if docs/configuration.md differs
    .venv/bin/python tools/verl_keys.py --import-verl PATH   # refresh docs/verl_defaults.json

verl's defaults come from ``docs/verl_defaults.json``: the leaf keys of verl's
``verl/trainer/config/_generated_ppo_trainer.yaml`` (``--import-verl`` flattens that file,
from a verl checkout, into it). The classes come from ``siirl/params/key_rules.py``
evaluated on the default configuration, as ``siirl-train --help`` shows them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "configuration.md"
DEFAULTS = ROOT / "docs" / "verl_defaults.json"
BEGIN = "<!-- verl-keys: begin (tools/verl_keys.py --write) -->"
END = "<!-- verl-keys: end -->"


def flatten(node: Any, prefix: str = "") -> Dict[str, Any]:
    """Leaf key -> value of a nested mapping (``_target_`` and other ``_`` keys left out)."""
    if not isinstance(node, dict) or not node:
        return {prefix: node}
    out: Dict[str, Any] = {}
    for key, value in node.items():
        if str(key).startswith("_"):
            continue
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def import_verl(path: str, source: str) -> None:
    import yaml

    defaults = flatten(yaml.safe_load(Path(path).read_text()))
    DEFAULTS.write_text(json.dumps({"source": source, "defaults": defaults}, indent=1,
                                   sort_keys=True) + "\n")
    print(f"wrote {DEFAULTS} ({len(defaults)} keys)")


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return f"`{text}`" if len(text) <= 40 else f"`{text[:37]}...`"


def _differs(ours: Any, theirs: Any) -> bool:
    """Plain values that differ (interpolations and other computed defaults are not
    compared: they follow other keys on both sides)."""
    texts = [v for v in (ours, theirs) if isinstance(v, str) and "${" in v]
    if texts:
        return False
    if isinstance(ours, (int, float)) and isinstance(theirs, (int, float)) \
            and not isinstance(ours, bool) and not isinstance(theirs, bool):
        return float(ours) != float(theirs)
    if isinstance(ours, bool) or isinstance(theirs, bool):
        return type(ours) is not type(theirs) or ours != theirs
    return ours != theirs


def render() -> str:
    from omegaconf import OmegaConf

    from siirl.params import SiiRLArguments
    from siirl.params.key_support import REFUSED, leaf_defaults, rule_for

    data = json.loads(DEFAULTS.read_text())
    verl = data["defaults"]
    ours = leaf_defaults()
    config = OmegaConf.structured(SiiRLArguments)
    rows, counts = [], {"read": 0, "different": 0, "notice": 0, "refused": 0}
    for key in sorted(k for k in verl if k in ours):
        rule = rule_for(key, config)
        if rule is None:
            status = "read"
        elif rule.kind == REFUSED:
            status = "refused"
        else:
            status = "notice"
        note = rule.why if rule is not None else ""
        if status == "read" and _differs(ours[key], verl[key]):
            status = "different"
            note = f"default {_shown(ours[key])} here, {_shown(verl[key])} in verl"
        counts[status] += 1
        rows.append(f"| `{key}` | {status} | {note.replace('|', '/')} |")
    others = sorted(k for k in verl if k not in ours)
    lines = [
        f"verl's configuration ({data['source']}) has {len(verl)} keys; this one takes "
        f"{len(rows)} of them: {counts['read']} work as in verl, {counts['different']} work "
        f"with another default, {counts['notice']} tune something a run may not use (a "
        f"`note:` line when set), {counts['refused']} are refused (the run stops naming "
        f"why). The other {len(others)} are unknown keys here (the run stops suggesting the "
        "nearest known one). Rendered by `.venv/bin/python tools/verl_keys.py --write`.",
        "",
        "<details><summary>Every verl key this configuration takes</summary>",
        "",
        "| key | here | note |",
        "|---|---|---|",
        *rows,
        "",
        "</details>",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--import-verl", metavar="PATH")
    ap.add_argument("--source", default="volcengine/verl, "
                    "verl/trainer/config/_generated_ppo_trainer.yaml")
    args = ap.parse_args()
    if args.import_verl:
        import_verl(args.import_verl, args.source)
        return 0
    section = f"{BEGIN}\n{render()}\n{END}"
    if not (args.write or args.check):
        print(section)
        return 0
    text = PAGE.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    if args.check:
        if text[start:end] != section:
            print("docs/configuration.md's verl key table is stale: run tools/verl_keys.py --write",
                  file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text[:start] + section + text[end:])
    print("docs/configuration.md updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
