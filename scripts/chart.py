#!/usr/bin/env python3
"""busyguard's chart (charts/busyguard), through helm-python-sdk (Helm's own library, no helm binary).

  chart.py render [VALUES.json [NAMESPACE]]
                                    the objects `helm install` would apply, as one JSON List
  chart.py tests [VALUES.json]      the test hook's objects (`helm test`), as one JSON List
  chart.py lint                     `helm lint --strict`; exits 1 on any finding
  chart.py readme [--check]         writes the chart's README from values.yaml (--check: only says if it differs)
  chart.py package DIR [URL]        the chart's .tgz and an index.yaml (its entries at URL) in DIR

Rendered as installed: release busyguard, namespace busyguard unless NAMESPACE says otherwise."""
import json, os, re, sys

import helm_python
import yaml

CHART = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "charts", "busyguard")


def render(values, namespace="busyguard", tests=False):
    """The objects `helm install` applies; with `tests`, instead the test hook's (`helm test`)."""
    chart = helm_python.Chart.load(CHART)
    try:
        rendered = chart.render(values, name="busyguard", namespace=namespace, is_install=True)
    finally:
        chart.close()
    items = []
    for template, text in sorted(rendered.items()):
        if template.endswith(".yaml"):
            items.extend(obj for obj in yaml.safe_load_all(text) if obj)
    is_test = lambda obj: (obj.get("metadata", {}).get("annotations") or {}).get("helm.sh/hook") == "test"
    return {"apiVersion": "v1", "kind": "List", "items": [obj for obj in items if is_test(obj) == tests]}


def lint():
    report = helm_python.lint(CHART, strict=True, namespace="busyguard", kube_version="v1.30.0")
    findings = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2] + report.get("errors", [])
    for finding in findings:
        print(finding, file=sys.stderr)
    return 1 if findings else 0


def readme():
    """The values table, read from values.yaml's `# -- ` comments, as helm-docs writes it."""
    rows, path, comment = [], [], None
    for line in open(os.path.join(CHART, "values.yaml")):
        stripped = line.strip()
        if stripped.startswith("# -- "):
            comment = stripped[5:]
            continue
        match = re.match(r"^( *)([A-Za-z][A-Za-z0-9]*):(.*)$", line.rstrip("\n"))
        if not match:
            continue
        depth = len(match.group(1)) // 2
        path[depth:] = [match.group(2)]
        if comment is not None:
            key = ".".join(path)
            value = yaml.safe_load(match.group(3)) if match.group(3).strip() else None
            shown = json.dumps(value) if value is not None else "see values.yaml"
            rows.append(f"| `{key}` | `{shown}` | {comment} |")
            comment = None
    head = open(os.path.join(CHART, "README.head.md")).read()
    return head + "\n| value | default | what it does |\n|---|---|---|\n" + "\n".join(rows) + "\n"


def main():
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "render":
        values = json.load(open(sys.argv[2])) if len(sys.argv) > 2 else {}
        try:
            json.dump(render(values, *sys.argv[3:4]), sys.stdout)
        except helm_python.HelmError as e:
            sys.exit(f"the chart does not render: {e}")
    elif command == "tests":
        values = json.load(open(sys.argv[2])) if len(sys.argv) > 2 else {}
        try:
            json.dump(render(values, tests=True), sys.stdout)
        except helm_python.HelmError as e:
            sys.exit(f"the chart does not render: {e}")
    elif command == "lint":
        sys.exit(lint())
    elif command == "readme":
        path = os.path.join(CHART, "README.md")
        text = readme()
        if "--check" in sys.argv:
            if not os.path.exists(path) or open(path).read() != text:
                sys.exit("charts/busyguard/README.md differs from values.yaml: run scripts/chart.py readme")
        else:
            open(path, "w").write(text)
    elif command == "package":
        destination = sys.argv[2]
        os.makedirs(destination, exist_ok=True)
        helm_python.package(CHART, destination=destination)
        helm_python.repo_index_generate(destination, base_url=sys.argv[3] if len(sys.argv) > 3 else None)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
