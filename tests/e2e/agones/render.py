#!/usr/bin/env python3
"""Agones' own chart (install/helm/agones of the source build.sh unpacked), rendered as `helm install`
renders it, with helm-python-sdk: prints, as one JSON List, what the end-to-end suite applies of it:
the CRDs, the service accounts and RBAC, the PDB of game-server namespaces, and the webhook
configurations, their clientConfig pointed at the extensions run outside the cluster (--url, --ca).
The Deployments, Services, APIService and Secrets are left out: the binaries run beside the control
plane instead. Usage: render.py CHART --namespace NS --url URL --ca FILE"""
import argparse, base64, json, sys

import helm_python
import yaml

KEPT = {"CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
        "PodDisruptionBudget", "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"}
SKIPPED_NAMES = {"agones-controller-pdb", "agones-extensions-pdb", "agones-allocator", "helm-hook-cleanup",
                 "helm-hook-cleanup-access"}


def main():
    args = argparse.ArgumentParser()
    args.add_argument("chart")
    args.add_argument("--namespace", action="append", required=True, help="a game-server namespace")
    args.add_argument("--url", required=True, help="where the API server reaches Agones' extensions")
    args.add_argument("--ca", required=True, help="the CA of the extensions' serving certificate")
    a = args.parse_args()
    chart = helm_python.Chart.load(a.chart)
    rendered = chart.render({"gameservers": {"namespaces": a.namespace}}, name="agones", namespace="agones-system",
                            is_install=True)
    ca = base64.b64encode(open(a.ca, "rb").read()).decode()
    items = []
    for template, text in sorted(rendered.items()):
        if not template.endswith(".yaml") or "/hooks/" in template:
            continue
        for obj in yaml.safe_load_all(text):
            if not obj or obj.get("kind") not in KEPT or obj["metadata"]["name"] in SKIPPED_NAMES:
                continue
            for hook in obj.get("webhooks", []):
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": a.url + path, "caBundle": ca}
            items.append(obj)
    if not items:
        sys.exit(f"render.py: nothing rendered from {a.chart}")
    json.dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout)


if __name__ == "__main__":
    main()
