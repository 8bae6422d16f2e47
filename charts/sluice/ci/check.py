"""Checks the sluice chart with Helm's own Go SDK (helm-python-sdk) and Kubernetes' schemas
(kubernetes-validate): the defaults and every ci/*-values.yaml scenario render and lint clean,
every manifest is valid for Kubernetes 1.30 (strict), custom resources carry their required
fields, and values that cannot work fail with a clear message.

    python check.py check           # everything above; exit 1 with the findings
    python check.py render [JSON]   # the manifests for these values, as JSON {path: text}

Run by tests/tests/chart.rs with the virtualenv scripts/test prepares.
"""

import glob
import json
import os
import sys

import kubernetes_validate
import yaml
from helm_python import chart

CHART = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KUBERNETES = "1.30"

# Custom resources and the fields their operators require (no schema ships with
# kubernetes-validate for them).
REQUIRED = {
    "ServiceMonitor": [("spec", "selector"), ("spec", "endpoints")],
    "PodMonitor": [("spec", "selector"), ("spec", "podMetricsEndpoints")],
    "PrometheusRule": [("spec", "groups")],
    "ScaledObject": [("spec", "scaleTargetRef", "name"), ("spec", "triggers")],
    "TriggerAuthentication": [("spec",)],
}

# Values that cannot work, and a piece of the message each must fail with.
BAD = [
    ("both autoscalers",
     {"autoscaling": {"hpa": {"enabled": True}, "keda": {"enabled": True}}},
     "either hpa or keda"),
    ("no pipeline", {"pipeline": {"file": "", "existingConfigMap": ""}}, "set pipeline.file"),
    ("negative replicas", {"replicaCount": -1}, "replicaCount"),
    ("memory limit below the dedup tier's bound",
     {"resources": {"limits": {"memory": "256Mi"}}}, "below 512Mi"),
    ("a SQLite store", {"store": {"url": "sqlite://state/x.db"}}, "postgres"),
    ("two monitors",
     {"monitoring": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}},
     "not both"),
    ("control API without a token", {"control": {"enabled": True}}, "tokenSecret"),
    ("an unknown value", {"replicas": 3}, "replicas"),
    ("a store URL and a Secret", {"store": {"url": "postgres://h/d", "existingSecret": "s"}},
     "not both"),
    ("annotations on an account the chart does not create",
     {"serviceAccount": {"create": False, "gcpServiceAccount": "a@p.iam.gserviceaccount.com"}},
     "serviceAccount"),
    ("a project in the file and in values",
     {"pubsub": {"project": "p"},
      "pipeline": {"file": "pipeline: x\npubsub: { project: q }\n"}}, "pubsub.project"),
    ("a pipeline file that is not YAML", {"pipeline": {"file": "pipeline: [x"}}, "not YAML"),
    ("a volume mount without a path", {"extraVolumeMounts": [{"name": "history"}]},
     "mountPath"),
    ("HPA minimum above maximum",
     {"autoscaling": {"hpa": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}}},
     "above maxReplicas"),
    ("KEDA at zero on Prometheus alone",
     {"autoscaling": {"keda": {"enabled": True, "minReplicaCount": 0}}}, "gcpPubsub"),
    ("metrics on loopback",
     {"pipeline": {"file": "pipeline: x\nmetrics: { listen: \"127.0.0.1:9464\" }\n"}},
     "metrics.listen"),
    ("metrics on another port than the probes'",
     {"pipeline": {"file": "pipeline: x\nmetrics: { listen: \"0.0.0.0:9100\" }\n"}},
     "metrics.listen"),
    ("KEDA on another pipeline's lag",
     {"autoscaling": {"keda": {"enabled": True, "pipelineName": "orders"}}}, "pipelineName"),
    ("KEDA on an existing ConfigMap without the pipeline's name",
     {"pipeline": {"existingConfigMap": "p", "file": ""},
      "autoscaling": {"keda": {"enabled": True}}}, "pipelineName"),
    ("no preStop pause", {"drain": {"preStopSeconds": 0}}, "preStopSeconds"),
    ("a memory limit in octal", {"resources": {"limits": {"memory": "0600Mi"}}}, "memory"),
]


def render(values):
    loaded = chart.Chart.load(CHART)
    return loaded.render(values, name="sluice", namespace="streaming", is_install=True)


def documents(manifests):
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                yield path, doc


def check_scenario(label, values, findings):
    lint = chart.lint(CHART, values)
    for message in lint.get("messages") or []:
        if message.get("severity", 0) >= 2:  # warning or error (info is advice)
            findings.append(f"{label}: lint {message}")
    try:
        manifests = render(values)
    except Exception as error:  # the SDK raises its own error types
        findings.append(f"{label}: does not render: {error}")
        return []
    kinds = []
    for path, doc in documents(manifests):
        kind = doc.get("kind")
        kinds.append(kind)
        if kind in REQUIRED:
            for field in REQUIRED[kind]:
                node = doc
                for key in field:
                    node = node.get(key) if isinstance(node, dict) else None
                if not node:
                    findings.append(f"{label}: {path}: {kind} without {'.'.join(field)}")
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as error:
            findings.append(f"{label}: {path}: {kind}: {error.message} at {list(error.path)}")
    return kinds


def check():
    findings = []
    scenarios = [("defaults", {})]
    for path in sorted(glob.glob(os.path.join(CHART, "ci", "*-values.yaml"))):
        with open(path) as file:
            scenarios.append((os.path.basename(path), yaml.safe_load(file) or {}))
    for label, values in scenarios:
        kinds = check_scenario(label, values, findings)
        print(f"{label}: {', '.join(sorted(set(kinds)))}")
    for label, values, expected in BAD:
        try:
            render(values)
            findings.append(f"bad values accepted: {label}")
        except Exception as error:
            text = str(error)
            if expected not in text:
                findings.append(f"bad values ({label}) failed without saying `{expected}`: {text}")
            else:
                print(f"refused, {label}: {text.splitlines()[-1][:160]}")
    refused = sum(1 for label, _, _ in BAD if not any(label in f for f in findings))
    print(f"bad values refused: {refused} of {len(BAD)}")
    for finding in findings:
        print("FINDING", finding)
    return 1 if findings else 0


def main():
    if sys.argv[1:2] == ["check"]:
        sys.exit(check())
    if sys.argv[1:2] == ["render"]:
        values = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
        print(json.dumps(render(values)))
        return
    print(__doc__, file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
