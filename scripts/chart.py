#!/usr/bin/env python3
"""busyguard's chart (charts/busyguard), through helm-python-sdk (Helm's own library, no helm binary).

  chart.py render [VALUES.json [NAMESPACE]]
                                    the objects `helm install` would apply, as one JSON List
  chart.py tests [VALUES.json]      the test hook's objects (`helm test`), as one JSON List
  chart.py lint                     `helm lint --strict`; exits 1 on any finding
  chart.py readme [--check]         writes the chart's README from values.yaml (--check: only says if it differs)
  chart.py package DIR [URL]        the chart's .tgz and an index.yaml (its entries at URL) in DIR
  chart.py stamp REPOSITORY IMAGE   a release's chart, in place: its image IMAGE (at appVersion), home and
                                    sources REPOSITORY's URL, and Artifact Hub's annotations (licence, image,
                                    links, and the changes of its version from CHANGELOG.md)

Rendered as installed: release busyguard, namespace busyguard unless NAMESPACE says otherwise."""
import json, os, re, sys

import helm_python
import yaml

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
# BUSYGUARD_CHART: another copy of the chart (the tests stamp one).
CHART = os.environ.get("BUSYGUARD_CHART") or os.path.join(ROOT, "charts", "busyguard")


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


def changes(version):
    """The bold titles of CHANGELOG.md's entries under the heading of `version`, by section, as
    Artifact Hub's `changes` annotation lists them (kind: added, changed, removed, ...)."""
    kinds = {"Breaking": "changed", "Added": "added", "Changed": "changed", "Fixed": "fixed", "Removed": "removed"}
    text = open(os.path.join(ROOT, "CHANGELOG.md")).read()
    section = re.split(r"^## ", text, flags=re.M)
    mine = next((s for s in section if s.startswith(version + " ") or s.startswith(version + "\n")), None)
    if mine is None:
        sys.exit(f"CHANGELOG.md has no heading for {version}")
    found, kind = [], "changed"
    for line in mine.splitlines():
        heading = re.match(r"^### (\w+)", line)
        if heading:
            kind = kinds.get(heading.group(1), "changed")
        title = re.match(r"^- \*\*(.+?)\*\*", line)
        if title:
            found.append({"kind": kind, "description": title.group(1).rstrip(".")})
    return found


def stamp(repository, image):
    """The chart as a release publishes it: values.yaml's image is the published one, and
    Chart.yaml says where the project is and what changed (appended: its comments stay)."""
    chart_yaml = os.path.join(CHART, "Chart.yaml")
    meta = yaml.safe_load(open(chart_yaml))
    version = meta["appVersion"]
    if version.endswith("-dev"):
        sys.exit(f"{version} is not a release: stamp a released version's chart only")
    values_path = os.path.join(CHART, "values.yaml")
    values = open(values_path).read()
    if "\n  repository: busyguard\n" not in values:
        sys.exit("values.yaml's image.repository is not the checkout's `busyguard`")
    open(values_path, "w").write(values.replace("\n  repository: busyguard\n", f"\n  repository: {image}\n", 1))
    annotations = {
        "artifacthub.io/license": "Apache-2.0",
        "artifacthub.io/images": yaml.safe_dump([{"name": "busyguard", "image": f"{image}:{version}"}]),
        "artifacthub.io/links": yaml.safe_dump([{"name": "source", "url": repository},
                                                {"name": "documentation", "url": f"{repository}/tree/v{version}/docs"}]),
        "artifacthub.io/changes": yaml.safe_dump(changes(version), sort_keys=False),
        "artifacthub.io/containsSecurityUpdates": "false",
    }
    extra = {"home": repository, "sources": [repository], "annotations": annotations}
    with open(chart_yaml, "a") as out:
        out.write("# Stamped by the release (scripts/chart.py stamp).\n")
        out.write(yaml.safe_dump(extra, sort_keys=False, width=1000))


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
    elif command == "stamp":
        stamp(sys.argv[2], sys.argv[3])
    elif command == "package":
        destination = sys.argv[2]
        os.makedirs(destination, exist_ok=True)
        helm_python.package(CHART, destination=destination)
        helm_python.repo_index_generate(destination, base_url=sys.argv[3] if len(sys.argv) > 3 else None)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
