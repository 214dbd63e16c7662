"""The Kubernetes ``PrometheusRule`` (Prometheus Operator) of Shale's rules, generated from
``rules/shale.yml``, their one source: kustomize cannot put a file's content into a
resource's ``spec``, so this script copies the rule file's groups into
``infra/k8s/components/monitoring/prometheusrule.yaml``.

    python infra/monitoring/prometheusrule.py           # write it
    python infra/monitoring/prometheusrule.py --check   # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Final

import yaml  # type: ignore[import-untyped,unused-ignore]

__all__ = ["OUTPUT", "RULES", "main", "render"]

HERE: Final = Path(__file__).resolve().parent
RULES: Final = HERE / "rules" / "shale.yml"
OUTPUT: Final = HERE.parent / "k8s" / "components" / "monitoring" / "prometheusrule.yaml"
NAME: Final = "shale-compact"
HEADER: Final = (
    "# Generated from infra/monitoring/rules/shale.yml by `python infra/monitoring/prometheusrule.py`:\n"
    "# edit that file and run the script, not this one. Thresholds: infra/monitoring/README.md.\n")


def _str(dumper: Any, value: str) -> Any:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


# A dumper of its own (yaml's are shared) that writes multi-line strings, the rules'
# expressions, as literal blocks like the rule file does.
_Dumper: Any = type("_Dumper", (yaml.SafeDumper,), {})
_Dumper.add_representer(str, _str)


def render(rules: Path = RULES) -> str:
    """The PrometheusRule's YAML, with the groups of the rule file ``rules``."""
    groups: Any = yaml.safe_load(rules.read_text())["groups"]
    doc = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
           "metadata": {"name": NAME}, "spec": {"groups": groups}}
    body: str = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True)
    return HEADER + body


def main(argv: list[str] | None = None) -> int:
    """Write the PrometheusRule (or, with ``--check``, exit 1 if it differs)."""
    parser = argparse.ArgumentParser(description="Generate the PrometheusRule from rules/shale.yml.")
    parser.add_argument("--check", action="store_true", help="exit 1 if the PrometheusRule is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT}: out of date; run python {Path(__file__).name} to write it", file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
