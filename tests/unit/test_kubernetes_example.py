"""The Kubernetes example (``deploy/kubernetes``) names only what exists: this project runs no
Kubernetes, so the example is checked for what it says, not run (README "Flink on
Kubernetes")."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "kubernetes"
OPTIONS = ROOT / "flink-jobreg" / "src" / "main" / "java" / "org" / "jobreg" / "flink" / \
    "JobregHaOptions.java"


def test_the_flinkdeployment_names_the_factory_the_backends_keys_and_a_standby() -> None:
    spec = yaml.safe_load((EXAMPLE / "flinkdeployment.yaml").read_text())["spec"]
    conf = spec["flinkConfiguration"]
    assert conf["high-availability.type"] == "org.jobreg.flink.JobregHaServicesFactory"
    defined = set(re.findall(r'ConfigOptions\.key\("(high-availability\.jobreg\.[a-z-]+)"\)',
                             OPTIONS.read_text()))
    used = {k for k in conf if k.startswith("high-availability.jobreg.")}
    assert used and used <= defined, used - defined
    for key in ("execution.job-status-changed-listeners",
                "events.reporter.jobreg.factory.class"):
        cls = conf[key].rsplit(".", 1)[1]
        assert (OPTIONS.parent / f"{cls}.java").exists(), conf[key]
    assert conf["events.reporter.jobreg.namespace"] == conf["high-availability.cluster-id"]
    assert spec["jobManager"]["replicas"] == 2
    port = int(conf["high-availability.jobreg.metrics-port"])
    ports = spec["podTemplate"]["spec"]["containers"][0]["ports"]
    assert {"name": "jobreg-metrics", "containerPort": port} in ports


def test_the_image_puts_the_built_jar_in_lib_and_jobreg_where_the_config_says() -> None:
    docker = (EXAMPLE / "Dockerfile.flink").read_text()
    conf = yaml.safe_load((EXAMPLE / "flinkdeployment.yaml").read_text())["spec"][
        "flinkConfiguration"]
    assert "COPY flink-jobreg/target/flink-jobreg-0.1.0.jar /opt/flink/lib/" in docker
    venv = conf["high-availability.jobreg.command"].rsplit("/bin/", 1)[0]
    assert f"python3 -m venv {venv}" in docker
    pom = (ROOT / "flink-jobreg" / "pom.xml").read_text()
    assert "<version>0.1.0</version>" in pom and "<flink.version>2.3.0</flink.version>" in pom
    assert docker.splitlines()[[i for i, ln in enumerate(docker.splitlines())
                                if ln.startswith("FROM")][0]].startswith("FROM flink:2.3.0")
